"""Real traffic: the paper's baselines. Azure's production requests on the vLLM paper's three
contiguous Orca baselines and on paged blocks, with the memory-waste breakdown measured on each."""
import streamlit as st

from pagedkv_core.config import ConfigError
from ui import guide, presenter
from ui.lessons import baselines as lesson

guided = guide.mode(lesson.KEY, help=lesson.GUIDE_HELP, title="Real traffic: the paper's baselines")
if not presenter.on(lesson.KEY):
    settings_box = st.expander("Which sidebar settings apply on this page", icon=":material/tune:")
try:
    if guided:
        with st.spinner("Running 200 Azure requests on four allocators…"):
            runs, workload, config = lesson.guided_runs()
    else:
        workload, is_default = lesson.workload_choice()
        config = lesson.config_for(workload)
        with st.spinner(f"Running {len(workload.requests):,} requests on four allocators…"):
            runs = lesson.baseline_runs(workload, **config)
except ConfigError as exc:
    st.error(str(exc))
    st.stop()

if guided:
    lesson.show_guide(runs, workload)
    if presenter.on(lesson.KEY):
        st.stop()
else:
    lesson.explore(runs, workload, config, is_default)

if not presenter.on(lesson.KEY):
    st.markdown(
        "The vLLM paper (Kwon et al., SOSP 2023) compares paging with three contiguous allocators in the style of "
        "Orca. **Orca Max** reserves room for the longest answer a request may write; **Orca Pow2** reserves the "
        "answer's real length rounded up to a power of two; **Orca Oracle** reserves exactly the answer's length. "
        "Pow2 and Oracle know each answer in advance, which no real server does: they bound how well reserving ahead "
        "could ever do. Here the same real requests, from Azure's production trace, run on all four."
    )
    settings_box.markdown(lesson.settings_note(workload, config, guided or is_default))
lesson.download(runs)
