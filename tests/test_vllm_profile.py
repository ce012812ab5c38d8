"""``benchmarks/vllm_profile.py``, the parts that need no vLLM: naming a perf sample's library, counting a
real ``perf record`` of a Python process, and the command line's bad input and skip (the profile of
vLLM itself is a benchmark: its figures live in benchmarks/results/vllm_profile.json)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from benchmarks import vllm_profile
from benchmarks.vllm_profile import JIT, count_samples, library, perf_unusable


@pytest.mark.parametrize("dso, name", [
    ("[unknown]", JIT), ("/tmp/perf-26673.map", JIT), ("//anon", JIT),
    ("/usr/lib/x86_64-linux-gnu/libc.so.6", "libc.so.6"), ("[kernel.kallsyms]", "[kernel.kallsyms]"),
    ("/root/.cache/vllm/x/cgjoswy74ld6q3k5qgmmjifgm5ezo3w5v65fj3btyd25yc5x2yel.main.so",
     "cgjoswy74ld6q3k5qgmmjifgm5ezo3w5v65fj..."),
])
def test_a_samples_library_has_a_short_name(dso, name):
    assert library(dso) == name


def test_perf_samples_of_a_python_loop_are_counted_in_the_interpreter(tmp_path):
    why = perf_unusable()
    if why:
        pytest.skip(why)
    data = tmp_path / "loop.data"
    subprocess.run(["perf", "record", "-q", "-F", "499", "-o", str(data), "--", sys.executable, "-c",
                    "x = 0\nfor i in range(4_000_000): x += i"], check=True, capture_output=True)
    text = subprocess.run(["perf", "script", "-i", str(data), "-F", "pid,ip,dso"], capture_output=True,
                          text=True, check=True).stdout
    counts = count_samples(text)
    assert len({pid for pid, _ in counts}) == 1  # the one process perf started
    (_, top), n = counts.most_common(1)[0]
    assert top.startswith(("libpython", "python")) and n >= 0.5 * sum(counts.values()), counts.most_common(5)


def test_bad_sampling_rate_exits_2_with_one_line(capsys):
    assert vllm_profile.main(["--hz", "5"]) == 2
    err = capsys.readouterr().err
    assert err == "error: --hz must be between 10 and 10,000, got 5\n"


def test_without_vllm_it_says_why_and_writes_nothing(monkeypatch, capsys, tmp_path):
    from benchmarks import vllm_peer

    monkeypatch.setattr(vllm_peer, "available", lambda *a, **k: ".venv-vllm is missing: make vllm-setup")
    assert vllm_profile.main(["--out-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "vllm-profile skipped: .venv-vllm is missing: make vllm-setup\n"
    assert not list(tmp_path.iterdir())


def test_a_recording_samples_the_work_from_its_start(tmp_path):
    """start_recording returns once perf has turned its events on: a process that starts its loop
    only after that is sampled, and only it; a process that does not exist is an error, not a wait."""
    from benchmarks.vllm_profile import start_recording, stop_recording

    why = perf_unusable()
    if why:
        pytest.skip(why)
    child = subprocess.Popen([sys.executable, "-c", "import sys\nsys.stdin.readline()\nx = 0\nfor i in range(4_000_000): x += i"],
                             stdin=subprocess.PIPE, text=True)
    recorder = start_recording([child.pid], tmp_path / "loop.data", 499)
    child.communicate("go\n", timeout=600)  # the loop starts now and runs to its end
    stop_recording(recorder)
    text = subprocess.run(["perf", "script", "-i", str(tmp_path / "loop.data"), "-F", "pid,ip,dso"], capture_output=True,
                          text=True, check=True).stdout
    counts = count_samples(text)
    assert {pid for pid, _ in counts} == {child.pid} and sum(counts.values()) > 0
    with pytest.raises(RuntimeError, match="did not start sampling"):
        start_recording([2**22 + 12345], tmp_path / "none.data", 499)
