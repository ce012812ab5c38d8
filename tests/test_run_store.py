"""Finished lesson runs kept on disk (ui/run_store.py): a stored run reads back step for step, with
its outputs and measured step times; a run that still holds its engine is never stored; anything
a run depends on changes its key; a file that cannot be read is run again; a folder others may write
into is never read; the store can be off."""
from __future__ import annotations

import os
import stat

import pytest

from pagedkv_core.config import EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.sources.scripted import ScriptedSource
from tests.test_teaching_pages import CharTokenizer
from ui import run_store


def make_engine(config, recording=None):
    return Engine(config, ScriptedSource(), recording=recording)


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv(run_store.ENV, str(tmp_path / "runs"))
    return tmp_path / "runs"


def pressure_runs():
    from ui.lessons import under_pressure

    cfg = {m: EngineConfig(block_size=16, pool_slots=384, preemption=m, watermark=0.1) for m in ("swap", "recompute")}
    return under_pressure.pressure_pair(make_engine, CharTokenizer(), cfg["swap"], cfg["recompute"])


def test_a_stored_run_reads_back_step_for_step(store):
    runs = pressure_runs()
    key = run_store.run_key("pressure", EngineConfig(), (), "model", "cpu|float32")
    assert run_store.save(key, runs)
    assert stat.S_IMODE(os.stat(store).st_mode) == 0o700  # only its owner reads what pickle loads
    back = run_store.load(key)
    assert set(back) == set(runs)
    for mode, run in runs.items():
        got = back[mode]
        assert got.num_steps == run.num_steps > 0 and got.engine is None
        assert all(got.at(i) == run.at(i) for i in range(run.num_steps))
        assert [got.step_events(i) for i in range(run.num_steps)] == [run.step_events(i) for i in range(run.num_steps)]
        assert got.tokens == run.tokens and got.lengths == run.lengths and got.wall_s == run.wall_s
        assert got.requests == run.requests and got.preemptions() == run.preemptions()
        got.recording.lock.acquire()  # a fresh lock, shared with the run's reads as before
        got.recording.lock.release()
        assert got._lock is got.recording.lock


def test_a_run_that_holds_its_engine_is_not_stored(store):
    from ui.timed_runs import new_timed_run

    live = new_timed_run("live", EngineConfig(block_size=16, pool_slots=384), make_engine)
    key = run_store.run_key("live", EngineConfig(), (), "model", "cpu|float32")
    assert not run_store.save(key, live) and not run_store.save(key, {"a": live})
    assert run_store.load(key) is None and not list(store.glob("*"))


def test_the_key_follows_everything_a_run_depends_on():
    base = ("name", EngineConfig(block_size=16), (0,), "model", "cpu|float32")
    key = run_store.run_key(*base)
    assert run_store.run_key(*base) == key
    for i, other in enumerate(["other", EngineConfig(block_size=32), (1,), "model2", "cpu|bfloat16"]):
        changed = list(base)
        changed[i] = other
        assert run_store.run_key(*changed) != key, i


def test_a_folder_others_may_write_into_is_never_read(store):
    key = run_store.run_key("x", EngineConfig(), (), "m", "p")
    assert run_store.save(key, pressure_runs())
    os.chmod(store, 0o777)  # anybody could have put a pickle there
    assert run_store.load(key) is None and not run_store.save(key, pressure_runs())
    os.chmod(store, 0o700)
    assert run_store.load(key) is not None


def test_an_unreadable_file_is_run_again_and_the_store_can_be_off(store, monkeypatch):
    key = run_store.run_key("x", EngineConfig(), (), "m", "p")
    store.mkdir(parents=True)
    (store / f"{key}.pkl").write_bytes(b"\x80\x05 cut short")
    assert run_store.load(key) is None
    assert run_store.save(key, pressure_runs()) and run_store.load(key) is not None
    monkeypatch.setenv(run_store.ENV, "off")
    assert run_store.store_dir() is None and run_store.load(key) is None
    assert not run_store.save(key, pressure_runs())
