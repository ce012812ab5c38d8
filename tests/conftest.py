"""Test-wide setup.

TRITON_INTERPRET must be set before any Triton kernel module is imported, so that the
kernel tests run the real Triton code on the CPU interpreter.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Under pytest-xdist (make test runs two workers on two cores) each worker's torch, and the
# servers and CLIs it starts, use one thread: two workers with a thread per core each would
# oversubscribe the cores.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# Finished real-model lesson runs are kept on disk (ui/run_store.py) and read back by every later
# process with the same code: the app servers the browser tests start, and the workers' AppTest
# pages. A run of the suite gets a store of its own (made here, on the controller, before the
# workers start, and removed at its end), so that each run computes each lesson's run once, and
# never reads one a run before it left behind.
if not os.environ.get("PYTEST_XDIST_WORKER") and not os.environ.get("PAGEDKV_RUN_STORE"):
    import atexit
    import shutil
    import tempfile

    _RUN_STORE = tempfile.mkdtemp(prefix="pagedkv-test-runs-")
    os.environ["PAGEDKV_RUN_STORE"] = _RUN_STORE
    atexit.register(shutil.rmtree, _RUN_STORE, ignore_errors=True)


import pytest  # noqa: E402

# ---------------------------------------------------------------------------- who runs what
# ``make test`` runs ``-n 2 --dist loadgroup``. A group is a unit of work that one worker runs
# from start to end: by default a test file (a module's fixtures, such as a loaded model or
# transformers' reference tokens, are built once), and for the browser tests the groups below.
# The "browser" group runs its tests one after another on one app server (tests/browser.py
# running_app); the classroom load test (its own server, twenty sessions) is a group of its own,
# so that the two browser groups start at once, one on each worker, and the rest fills in behind.
# xdist 3.8 marks an ``xdist_group`` by appending "@group" to each test's id, which pytest 9 no
# longer lets it change: its own grouping silently fell back to one test at a time (each worker
# loading the same model for the same file, browsers on both workers in any mix). So the groups
# are made here, on the controller, from the test ids (pytest_xdist_make_scheduler), and checked
# on the workers against the ``browser`` marker (pytest_collection_modifyitems).
GROUPS = {
    "tests/test_load_browser.py": "browser-load",
    "tests/test_pool_cells.py::test_hover_in_a_real_browser": "browser",
}
# The order the groups are handed out in: the longest first (CI's time per test file, issue 20), so
# that no worker is left finishing a long file while the other has nothing to do; then the
# remaining files (each under 8 s) in collection order. A worker is handed its next group when two
# tests of its current one are left: the browser worker takes the other files only once its group
# is nearly done, and the other worker fills in behind the load test, so the two end together.
# Within a group the longest files go first (the browser files below).
FIRST = (
    "browser", "browser-load",
    "tests/test_teaching_browser.py", "tests/test_player_browser.py", "tests/test_presenter_browser.py",
    "tests/test_live_chart_browser.py", "tests/test_pages_browser.py",
    "tests/test_llm.py", "tests/test_bench_cli.py", "tests/test_kernels_aot.py", "tests/test_model_smoke.py",
    "tests/test_waste.py", "tests/test_count_identity.py", "tests/test_teaching_pages.py", "tests/test_streaming.py",
    "tests/test_fuzz.py", "tests/test_presenter_pages.py", "tests/test_hardening_cli.py", "tests/test_engagement.py",
    "tests/test_app_inputs.py", "tests/test_kernels.py", "tests/test_scale_pages.py", "tests/test_model_runner.py",
    "tests/test_prefix_traffic_page.py", "tests/test_bf16.py", "tests/test_app_pages.py",
    "tests/test_narration_numbers.py", "tests/test_vllm_server.py", "tests/test_hashed_log.py",
)


def group_of(nodeid: str) -> str:
    """The group of a test id: its own entry in GROUPS, else its file's, else "browser" for a
    ``*_browser.py`` file, else the file."""
    path = nodeid.split("::")[0]
    name = nodeid.split("[")[0]
    if name in GROUPS or path in GROUPS:
        return GROUPS.get(name, GROUPS.get(path))
    return "browser" if path.endswith("_browser.py") else path


def _rank(group: str) -> int:
    return FIRST.index(group) if group in FIRST else len(FIRST)


def pytest_collection_modifyitems(config, items):
    """Checks that every ``browser`` test is in a browser group, and (on an xdist worker) puts the
    groups in FIRST's order: the controller hands them out in the order it receives them."""
    stray = [i.nodeid for i in items if i.get_closest_marker("browser") and not group_of(i.nodeid).startswith("browser")]
    if stray:
        raise pytest.UsageError(f"browser tests outside a browser group (tests/conftest.py GROUPS): {', '.join(stray)}")
    if hasattr(config, "workerinput"):
        items.sort(key=lambda i: (_rank(group_of(i.nodeid)), _rank(i.nodeid.split("::")[0])))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup``: xdist's scope scheduler, with our groups as its scopes, handed out in
    the order the workers collected them (FIRST's)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Groups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    config.option.loadscopereorder = False
    return Groups(config, log)


def pytest_sessionfinish(session):
    """Stops this process's shared app server (tests/browser.running_app), if it started one."""
    import sys

    browser = sys.modules.get("tests.browser")
    if browser is not None:
        browser._stop_shared()


# ---------------------------------------------------------------------------- the CI log's guard
# At the end of every run, just above pytest's closing line (which CI reads): the machine (CPU
# model, cores and the flags our fast paths need) and each test file's time and worker, so a slow
# machine or a skipped path shows in the log. Under xdist the reports reach the controller, which
# prints; each report's ``node`` names its worker.
from pagedkv_core.sources.model import ISA_FLAGS as CPU_FLAGS  # noqa: E402
_FILE_TIMES: dict[str, list] = {}  # file -> [seconds, tests, workers]


def pytest_runtest_logreport(report):
    if hasattr(report, "duration"):
        node = getattr(report, "node", None)
        worker = node.gateway.id if node is not None else os.environ.get("PYTEST_XDIST_WORKER", "main")
        row = _FILE_TIMES.setdefault(report.nodeid.split("::")[0], [0.0, 0, set()])
        row[0] += report.duration
        row[1] += report.when == "call" or (report.when == "setup" and report.skipped)
        row[2].add(worker)


def machine_lines() -> list[str]:
    """The CPU model, its cores and which of :data:`CPU_FLAGS` it has (read from /proc/cpuinfo)."""
    from pagedkv_core.sources.model import _cpuinfo_flags, cpu_model_name, cpu_supports_bf16

    model = cpu_model_name() or "unknown"
    flags = _cpuinfo_flags() or set()
    return [f"CPU: {model}, {os.cpu_count()} cores",
            f"flags: {' '.join(f for f in CPU_FLAGS if f in flags) or '-'}"
            f"  (missing: {' '.join(f for f in CPU_FLAGS if f not in flags) or '-'})",
            f"native bf16 (AVX512-BF16 or AMX-BF16): {'yes' if cpu_supports_bf16() else 'no: the bf16 packing test skips'}"]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if hasattr(config, "workerinput") or not _FILE_TIMES:
        return
    tr = terminalreporter
    tr.write_sep("=", "machine")
    for line in machine_lines():
        tr.write_line(line)
    tr.write_sep("=", "time per test file")
    per_worker: dict[str, float] = {}
    for path, (seconds, tests, workers) in sorted(_FILE_TIMES.items(), key=lambda kv: -kv[1][0]):
        worker = "+".join(sorted(workers))
        per_worker[worker] = per_worker.get(worker, 0.0) + seconds
        tr.write_line(f"{seconds:8.1f} s  {worker:>4}  {path} ({tests} tests)")
    tr.write_line("per worker: " + ", ".join(f"{w} {s:.1f} s" for w, s in sorted(per_worker.items())))
