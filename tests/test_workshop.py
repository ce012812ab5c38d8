"""Workshop mode and the sessions of a shared server: which models a visitor may pick, upload caps,
the launcher's options, the live-model seats and the janitor that gives closed sessions back."""
from __future__ import annotations

import json
import subprocess
from types import SimpleNamespace

import pytest
from streamlit import config as st_config

from pagedkv_core.config import ConfigError
from pagedkv_core.sizing.memory import parse_size, session_budget
from tests.apptest import ROOT, app, open_page, uploader
from ui import serve, sessions, workshop

WORKSHOP_ENV = (workshop.ENV_FLAG, workshop.ENV_MODEL_DIR, workshop.ENV_MAX_UPLOAD_MB,
                workshop.ENV_MAX_MODEL_SESSIONS, workshop.ENV_SESSION_BUDGET)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """Every test starts outside workshop mode, with seats of its own that no one holds."""
    for name in WORKSHOP_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sessions, "_SEATS", sessions.Seats())


@pytest.fixture
def server_address():
    """Set ``server.address`` for an AppTest (it runs in this process), restored afterwards."""
    before = st_config.get_option("server.address")
    yield lambda value: st_config.set_option("server.address", value)
    st_config.set_option("server.address", before)


# ---------------------------------------------------------------------------- the policy
@pytest.mark.parametrize("value, on", [("", False), ("0", False), ("off", False), ("1", True), ("on", True),
                                       ("yes please", True)])
def test_workshop_flag(monkeypatch, value, on):
    monkeypatch.setenv(workshop.ENV_FLAG, value)
    assert workshop.enabled() is on


def test_caps_default_only_in_workshop_mode(monkeypatch):
    assert workshop.upload_cap_mb() == workshop.UPLOAD_MB == 64  # a workload file's cap, not Streamlit's 200
    assert workshop.max_model_sessions() is None
    monkeypatch.setenv(workshop.ENV_FLAG, "1")
    assert workshop.upload_cap_mb() == workshop.WORKSHOP_UPLOAD_MB
    assert workshop.max_model_sessions() == workshop.WORKSHOP_MODEL_SESSIONS == 4
    monkeypatch.setenv(workshop.ENV_MAX_MODEL_SESSIONS, "2")
    monkeypatch.setenv(workshop.ENV_MAX_UPLOAD_MB, "3")
    assert workshop.max_model_sessions() == 2 and workshop.upload_cap_mb() == 3


@pytest.mark.parametrize("value", ["0", "-1", "two", "²", "1.5"])
def test_bad_caps_are_one_line_errors(monkeypatch, value):
    monkeypatch.setenv(workshop.ENV_MAX_MODEL_SESSIONS, value)
    with pytest.raises(ConfigError, match=rf"^{workshop.ENV_MAX_MODEL_SESSIONS} must be a positive whole number"):
        workshop.max_model_sessions()


def test_workshop_mode_lowers_the_session_budget_unless_one_is_set(monkeypatch):
    monkeypatch.setenv(workshop.ENV_FLAG, "1")
    workshop.apply_defaults()
    assert session_budget() == parse_size(workshop.WORKSHOP_SESSION_BUDGET) == 512 << 20
    monkeypatch.setenv(workshop.ENV_SESSION_BUDGET, "2GiB")
    workshop.apply_defaults()
    assert session_budget() == 2 << 30


def test_upload_check_uses_the_reported_size(monkeypatch):
    upload = SimpleNamespace(name="big.jsonl", size=3 << 20)
    workshop.check_upload(upload, "trace")  # under the 64 MB cap outside workshop mode
    monkeypatch.setenv(workshop.ENV_MAX_UPLOAD_MB, "2")
    with pytest.raises(ConfigError, match=r"trace big\.jsonl has 3\.0 MiB, over this server's upload cap of 2 MB"):
        workshop.check_upload(upload, "trace")
    workshop.check_upload(SimpleNamespace(name="ok.jsonl", size=2 << 20))  # exactly the cap is fine


@pytest.mark.parametrize("address, loopback", [
    ("127.0.0.1", True), ("127.0.1.1", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("", False), (None, False), ("0.0.0.0", False), ("::", False), ("10.0.0.7", False), ("example.org", False),
])
def test_loopback_addresses(address, loopback):
    assert workshop.is_loopback(address) is loopback
    assert workshop.free_model_paths(address) is loopback


def test_workshop_mode_never_offers_free_paths(monkeypatch):
    monkeypatch.setenv(workshop.ENV_FLAG, "1")
    assert not workshop.free_model_paths("127.0.0.1")


def test_model_choices_are_the_bundled_model_and_the_folders_models(tmp_path, monkeypatch):
    (tmp_path / "tiny.gguf").write_bytes(b"GGUF")
    (tmp_path / "notes.txt").write_text("not a model")
    (tmp_path / "llama-dir").mkdir()
    (tmp_path / "llama-dir" / "config.json").write_text("{}")
    (tmp_path / "empty-dir").mkdir()
    assert workshop.model_choices() == {"": workshop.BUNDLED_LABEL}
    monkeypatch.setenv(workshop.ENV_MODEL_DIR, str(tmp_path))
    assert workshop.model_choices() == {"": workshop.BUNDLED_LABEL, str(tmp_path / "llama-dir"): "llama-dir",
                                        str(tmp_path / "tiny.gguf"): "tiny.gguf"}
    monkeypatch.setenv(workshop.ENV_MODEL_DIR, str(tmp_path / "missing"))
    assert workshop.model_choices() == {"": workshop.BUNDLED_LABEL}


# ---------------------------------------------------------------------------- the launcher
def test_launcher_caps_uploads_in_workshop_mode(monkeypatch):
    assert serve.workshop_options([]) == [f"--server.maxUploadSize={workshop.UPLOAD_MB}"]
    monkeypatch.setenv(workshop.ENV_FLAG, "1")
    assert serve.workshop_options([]) == [f"--server.maxUploadSize={workshop.WORKSHOP_UPLOAD_MB}"]
    assert serve.workshop_options(["--server.maxUploadSize", "5"]) == []
    assert serve.workshop_options(["--server.maxUploadSize=5"]) == []


# (mode, environment, the cap in MB): what every layer must state and keep.
UPLOAD_CAPS = [
    ("default", {}, 64),
    ("workshop", {workshop.ENV_FLAG: "1"}, 16),
    ("env", {workshop.ENV_MAX_UPLOAD_MB: "5"}, 5),
    ("workshop-env", {workshop.ENV_FLAG: "1", workshop.ENV_MAX_UPLOAD_MB: "40"}, 40),
]


@pytest.mark.parametrize("env, cap", [c[1:] for c in UPLOAD_CAPS], ids=[c[0] for c in UPLOAD_CAPS])
def test_every_upload_limit_states_ours(monkeypatch, env, cap):
    """Streamlit's limit is ours: the launcher's --server.maxUploadSize, the config file's (the
    default mode, for a plain ``streamlit run app.py``), each upload box's stated limit ("Limit
    64MB per file") and our own check before parsing all say the same number."""
    import tomllib

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert workshop.upload_cap_mb() == cap
    assert serve.workshop_options([]) == [f"--server.maxUploadSize={cap}"]
    if not env:
        config = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
        assert config["server"]["maxUploadSize"] == cap
    at = open_page("pages/reserve_or_page.py")
    assert [uploader(at, key).proto.max_upload_size_mb for key in ("workload_upload", "trace_upload")] == [cap, cap]
    workshop.check_upload(SimpleNamespace(name="at-cap.json", size=cap << 20))
    with pytest.raises(ConfigError, match=rf"over this server's upload cap of {cap} MB"):
        workshop.check_upload(SimpleNamespace(name="over.json", size=(cap << 20) + 1), "workload file")


def test_launcher_refuses_a_bad_environment_with_one_line(monkeypatch):
    monkeypatch.setenv(workshop.ENV_FLAG, "1")
    monkeypatch.setenv(workshop.ENV_MAX_MODEL_SESSIONS, "lots")
    with pytest.raises(ConfigError, match="PAGEDKV_MAX_MODEL_SESSIONS must be a positive whole number"):
        serve.workshop_options([])
    result = subprocess.run([str(ROOT / ".venv/bin/python"), "-m", "ui.serve", "--server.port", "1"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60,
                            env={"PATH": "/usr/bin:/bin", workshop.ENV_FLAG: "1", workshop.ENV_SESSION_BUDGET: "lots"})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: PAGEDKV_SESSION_BUDGET must be a size such as 64MiB or 1GB, got 'lots'"]


def test_make_app_turns_workshop_mode_on_and_keeps_the_default():
    def dry_run(*args):
        out = subprocess.run(["make", "-n", "app", *args], cwd=ROOT, capture_output=True, text=True, timeout=60).stdout
        return [line for line in out.splitlines() if "ui.serve" in line]

    assert dry_run() == [".venv/bin/python -m ui.serve --server.address 127.0.0.1 --server.port 8501"]
    assert dry_run("WORKSHOP=1") == [
        "PAGEDKV_WORKSHOP=1 .venv/bin/python -m ui.serve --server.address 0.0.0.0 --server.port 8501"]
    assert dry_run("WORKSHOP=0") == dry_run()
    assert dry_run("WORKSHOP=1", "ADDRESS=127.0.0.1")[0].endswith("--server.address 127.0.0.1 --server.port 8501")


# ---------------------------------------------------------------------------- seats and the janitor
def test_seats_cap_the_holders():
    seats = sessions.Seats()
    assert seats.claim("a", 2) and seats.claim("b", 2)
    assert not seats.claim("c", 2)
    assert seats.claim("a", 2) and len(seats) == 2  # a holder keeps its seat
    assert seats.release("a") and not seats.release("a")
    assert seats.claim("c", 2) and seats.claim("d", None) and len(seats) == 3


class FakeState(dict):
    @property
    def filtered_state(self):
        return dict(self)


def test_janitor_releases_seats_at_once_and_state_after_the_ttl():
    now = [0.0]
    active = {"s1", "s2"}
    reaped = []
    seats = sessions.Seats()
    janitor = sessions.SessionJanitor(is_active=lambda sid: sid in active, ttl_s=lambda: 10.0, seats=seats,
                                      reap=reaped.extend, clock=lambda: now[0])
    s1, s2 = FakeState(_session_runs="big", model_path=""), FakeState(x=1)
    janitor.track("s1", s1)
    janitor.track("s2", s2)
    seats.claim("s1", 4)
    assert janitor.sweep() == 0 and seats.holds("s1")

    active.discard("s1")  # its browser went away
    assert janitor.sweep() == 0
    assert not seats.holds("s1") and s1  # the seat at once; the state stays for a reconnect
    now[0] = 10.0 + sessions.MARGIN_S  # not yet past the TTL and the margin
    assert janitor.sweep() == 0 and s1
    now[0] += 1
    assert janitor.sweep() == 1
    assert s1 == {} and s2 == {"x": 1} and len(janitor) == 1 and reaped == ["s1"]


def test_janitor_forgets_a_disconnect_when_the_session_comes_back():
    now = [0.0]
    active = set()
    janitor = sessions.SessionJanitor(is_active=lambda sid: sid in active, ttl_s=lambda: 10.0,
                                      seats=sessions.Seats(), clock=lambda: now[0])
    state = FakeState(a=1)
    janitor.track("s", state)
    janitor.sweep()  # away since 0
    now[0] = 12.0
    active.add("s")  # reconnected within the TTL
    janitor.sweep()
    active.clear()
    now[0] = 20.0
    janitor.sweep()  # away again, since 20
    now[0] = 30.0
    assert janitor.sweep() == 0 and state == {"a": 1}


def test_malloc_trim_runs_on_glibc():
    assert sessions.malloc_trim() in (True, False)  # 1 when memory was released, 0 when there was none


# ---------------------------------------------------------------------------- the app
def test_default_app_keeps_the_free_form_model_box():
    at = app().run()
    assert not at.exception
    assert [t.key for t in at.text_input] == ["model_path"]


def test_workshop_mode_offers_a_select_box_of_models(tmp_path, monkeypatch):
    (tmp_path / "tiny.gguf").write_bytes(b"GGUF")
    monkeypatch.setenv(workshop.ENV_FLAG, "1")
    monkeypatch.setenv(workshop.ENV_MODEL_DIR, str(tmp_path))
    at = open_page("pages/reserve_or_page.py")
    assert "model_path" not in [t.key for t in at.text_input]
    box = at.selectbox(key="model_path")
    assert box.options == [workshop.BUNDLED_LABEL, "tiny.gguf"] and box.value == ""


def test_a_server_beyond_loopback_offers_no_free_paths(server_address):
    server_address("0.0.0.0")
    at = app()
    at.session_state["model_path"] = "/etc/shadow"  # what a visitor could have typed before
    at.run()
    assert not at.exception
    assert "model_path" not in [t.key for t in at.text_input]
    assert at.session_state["model_path"] == ""  # back to the bundled model


def test_a_visitor_past_the_seat_cap_gets_the_scripted_source(monkeypatch):
    monkeypatch.setenv(workshop.ENV_MAX_MODEL_SESSIONS, "1")
    assert sessions.seats().claim("other-1", 1)
    at = app(source="model").run()  # the first run of a link to the model source
    assert not at.exception
    assert any("All 1 live-model seats are taken; the scripted source works" in i.value for i in at.info)
    assert at.session_state["source"] == "scripted" and at.radio(key="source").value == "scripted"
    at.switch_page("pages/reserve_or_page.py").run()
    assert not at.exception and at.get("plotly_chart"), "the page draws the scripted runs"


def test_the_live_engine_page_waits_for_a_seat(monkeypatch):
    monkeypatch.setenv(workshop.ENV_FLAG, "1")
    for i in range(workshop.WORKSHOP_MODEL_SESSIONS):
        assert sessions.seats().claim(f"other-{i + 1}", workshop.WORKSHOP_MODEL_SESSIONS)
    at = open_page("pages/live_engine.py")
    assert any("All 4 live-model seats are taken" in i.value for i in at.info)
    assert not at.get("plotly_chart")


def test_a_seat_is_given_back_on_a_page_without_the_model(monkeypatch):
    monkeypatch.setenv(workshop.ENV_MAX_MODEL_SESSIONS, "1")
    at = open_page("pages/reserve_or_page.py")  # scripted: holds no seat
    assert len(sessions.seats()) == 0
    assert sessions.seats().claim("other-1", 1)  # so a page that needs one cannot get it
    at.switch_page("pages/live_engine.py").run()
    assert any("All 1 live-model seats are taken" in i.value for i in at.info)


def test_uploads_over_the_workshop_cap_are_refused_before_parsing(monkeypatch):
    monkeypatch.setenv(workshop.ENV_MAX_UPLOAD_MB, "1")
    big = json.dumps([{"id": f"r{i}", "prompt_len": 8, "output_len": 4, "max_tokens": 8} for i in range(20_000)])
    assert len(big) > 1 << 20
    at = open_page("pages/reserve_or_page.py")
    uploader(at, "workload_upload").set_value(("big.json", big.encode(), "application/json")).run()
    assert not at.exception
    assert any("over this server's upload cap of 1 MB" in e.value for e in at.error), [e.value for e in at.error]
    at = open_page("pages/reserve_or_page.py")
    uploader(at, "trace_upload").set_value(("big.jsonl", big.encode(), "application/jsonl")).run()
    assert any(e.value.startswith("Cannot replay big.jsonl: trace big.jsonl has ") for e in at.error)


def test_the_server_allocates_with_glibc_unless_told_otherwise():
    """ui.serve starts again with PYTHONMALLOC=malloc and MALLOC_ARENA_MAX=2 (so that a classroom's
    memory goes back to the system: tests/test_load_browser.py); a value already set wins."""
    from ui.serve import allocator_env

    assert allocator_env({"PATH": "/bin"}) == {"PATH": "/bin", "PYTHONMALLOC": "malloc", "MALLOC_ARENA_MAX": "2"}
    assert allocator_env({"PYTHONMALLOC": "pymalloc"}) == {"PYTHONMALLOC": "pymalloc", "MALLOC_ARENA_MAX": "2"}
    assert allocator_env({"PYTHONMALLOC": "pymalloc", "MALLOC_ARENA_MAX": "8"}) is None
