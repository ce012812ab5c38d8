"""``benchmarks/bench_peers.py``: a peer that is not installed is reported as not run, with why, and
this engine's own row runs the same log (a small one here) and counts every row."""
from __future__ import annotations

import json
import sys

from benchmarks import bench_peers

LOG = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.1000000,4000,10
"""


def test_missing_peers_are_reported_not_run_and_pagedkv_runs_the_log(tmp_path):
    log = tmp_path / "log.csv"
    log.write_text(LOG)
    out = tmp_path / "peers.json"
    assert bench_peers.main(["--vidur-python", str(tmp_path / "no-python"), "--inference-lab-dir", str(tmp_path),
                             "--pagedkv", sys.executable, "--log", str(log), "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["requests_in_log"] == 3
    vidur, lab, ours, ours_traced = report["peers"]
    assert (vidur["name"], vidur["ran"]) == ("vidur", False) and vidur["why"].startswith("vidur not importable")
    assert (lab["name"], lab["ran"]) == ("inference-lab", False) and lab["why"].startswith("package not found")
    for row, name in ((ours, "pagedkv"), (ours_traced, "pagedkv --trace-out")):
        assert row["name"] == name and row["ran"] is True, row
        assert row["simulated"]["requests_simulated"] == 3  # every row: the 4,000-token prompt is a rejection
        assert (row["simulated"]["finished"], row["simulated"]["rejected"]) == (2, 1)
        assert row["wall_s"] > 0 and row["cpu_s"] > 0
