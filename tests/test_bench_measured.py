"""``bench replay-speed`` measures each case by itself (benchmarks/bench_replay_speed.py, ``measured``):
a process started from the benchmark would report at least the benchmark's own peak RSS."""
from __future__ import annotations

import sys

from benchmarks.bench_replay_speed import measured

MB = 1024


def test_a_case_reports_its_own_peak_not_the_benchmarks():
    held = bytearray(120 * 1024 * 1024)  # the benchmark, grown by the traces it has read back
    held[::4096] = b"\1" * len(held[::4096])
    grows = "b = bytearray(60 * 1024 * 1024); b[::4096] = b'\\1' * len(b[::4096]); print(len(b))"
    run = measured([sys.executable, "-c", grows])
    assert run.returncode == 0 and run.out == f"{60 * 1024 * 1024}\n" and run.err == ""
    assert 60 * MB <= run.peak_rss_kb < 110 * MB  # its 60 MB and an interpreter, not the 120 MB held here
    assert run.cpu_s > 0
    assert all(kb < 110 * MB for kb in run.hwm_kb.values())
    del held


def test_a_failing_case_keeps_its_exit_code_and_its_error():
    run = measured([sys.executable, "-c", "import sys; sys.stderr.write('bad input\\n'); sys.exit(2)"])
    assert run.returncode == 2 and run.err == "bad input\n" and run.out == ""
