"""Every bad command-line input of issue 13, through the CLI's ``main(argv)``: in this process for
the table (a fresh ``python -m pagedkv_core`` costs 0.5-3 s of interpreter and imports per case),
and in a real subprocess for one case of each command (:data:`IN_A_PROCESS`), the trace-file
checks, the rejections' printed table and the checks that must cost no torch.

A bad input exits with code 2 and exactly one line on stderr, starting with "error:", before
anything big is allocated: no traceback, no MemoryError after 40 s, no hang (:data:`TIMEOUT_S`),
no progress bar. A request-level problem in
a workload is that request's rejection, with the bound in its reason, while the others run.

The ``generate`` cases fail before torch or the model load (they are not ``slow``): the pool
is planned from the model's ``config.json`` alone (a directory holding nothing else stands in
for the model here), against ``PAGEDKV_MEMORY_BUDGET``.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pagedkv_core.config import MAX_ARRIVAL_STEP, MAX_POOL_SLOTS, MAX_TOKEN_ID
from pagedkv_core.sizing.pool_plan import gpu_driver_present
from pagedkv_core.sampling import MAX_SAMPLES
from pagedkv_core.workloads.scenarios import MAX_JSON_DEPTH, MAX_OUTPUT_LEN, MAX_PROMPT_LEN, MAX_REQUESTS, MAX_WORKLOAD_TOKENS

ROOT = Path(__file__).resolve().parents[1]
# No wall-clock limit on a clean error (the suite runs on machines of any speed): "at once" is
# checked by what a check does, not how long it takes here: a bad value is refused before torch is
# imported (test_generate_checks_cost_no_torch) and before anything large is allocated (the
# 10**9-slot and 10**12-slot cases would need terabytes). A run that does not stop is a hang.
TIMEOUT_S = 60  # a hang shows up as a failure, not a stuck suite
# SmolLM2-135M's shape: 2 x 30 layers x 3 KV heads x 64 x 4 B = 46,080 B per token in fp32.
SMOL_CONFIG = {"model_type": "llama", "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
               "hidden_size": 576, "head_dim": 64, "max_position_embeddings": 8192, "vocab_size": 49152}


def ok_request(**fields) -> dict:
    return {"id": "ok", "prompt_len": 5, "output_len": 3, "max_tokens": 4, **fields}


def bad_request(**fields) -> dict:
    base = {"id": "bad", "output_len": 3, "max_tokens": 4, **({} if "prompt" in fields else {"prompt_len": 5})}
    return {**base, **fields}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """Every input file of the table, in one folder (``{d}`` in a case's arguments)."""
    d = tmp_path_factory.mktemp("inputs")

    def write(name: str, content) -> None:
        path = d / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content if isinstance(content, str) else json.dumps(content))

    write("ok.json", [ok_request()])
    write("deep.json", "[" * 100_000 + "]" * 100_000)
    write("deep9.json", "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1))
    write("many.json", [ok_request(id=f"r{i}") for i in range(200_000)])
    write("nan.json", '[{"id": "a", "prompt_len": NaN, "output_len": 3, "max_tokens": 4}]')
    write("inf.json", '[{"id": "a", "prompt_len": 1e400, "output_len": 3, "max_tokens": 4}]')
    write("digits.json", '[{"id": "a", "prompt_len": ' + "9" * 5000 + ', "output_len": 3, "max_tokens": 4}]')
    write("surrogate.json", '[{"id": "\\ud800", "prompt_len": 5, "output_len": 3, "max_tokens": 4}]')
    write("latin1.json", b'[{"id": "caf\xe9", "prompt_len": 5, "output_len": 3, "max_tokens": 4}]')
    write("string_number.json", [bad_request(prompt_len="5")])
    write("null.json", [bad_request(output_len=None)])
    write("tokens.json", [bad_request(id=f"b{i}", prompt_len=MAX_PROMPT_LEN) for i in range(5)])
    write("long_answer.json", [ok_request(output_len=40_000, max_tokens=40_000)])
    # Sparse: over the 64 MiB cap without writing it, and refused before a byte is read.
    with open(d / "huge.json", "wb") as f:
        f.truncate((64 << 20) + 1)
    os.mkfifo(d / "fifo.json")
    (d / "folder.json").mkdir()
    # Request-level problems: each file holds one bad request beside a good one.
    for name, fields in REJECTIONS.items():
        write(f"reject_{name}.json", [bad_request(**fields), ok_request()])
    # Prompts files for generate.
    write("prompts_deep.json", "[" * 100_000 + "]" * 100_000)
    write("prompts_nan.json", '[{"prompt": "hi", "max_tokens": NaN}]')
    write("prompts_dict.json", {"prompt": "hi"})
    write("prompts_long.json", ["x" * ((1 << 20) + 1)])
    write("prompts_max_tokens.json", ["hi", {"prompt": "hi", "max_tokens": 10**9}])
    # A model that is only its config: enough to plan the pool, nothing to load.
    (d / "model").mkdir()
    write("model/config.json", SMOL_CONFIG)
    # Traces for replay.
    header = {"type": "header", "format": "pagedkv-trace", "version": 2, "encoding": "zlib+base64",
              "pool": {"allocator": "paged", "block_size": 16, "num_slots": 64, "num_blocks": 4, "num_host_blocks": 0},
              "metric_fields": [], "keyframe_every": 1}
    write("trace_deep.jsonl", "[" * 100_000 + "]" * 100_000 + "\n")
    write("trace_requests.jsonl", json.dumps({**header, "requests": 5}) + "\n")
    write("trace_inf.jsonl", json.dumps(header)[:-1] + ', "x": 1e400}\n')
    write("trace_block0.jsonl", json.dumps({**header, "pool": {**header["pool"], "block_size": 0}}) + "\n")
    os.mkfifo(d / "trace_fifo.jsonl")
    return d


# Request-level problems (a bad field of one request): name -> that request's fields.
REJECTIONS = {
    "prompt_len": dict(prompt_len=10**9),
    "arrival": dict(arrival_step=10**12),
    "n": dict(n=32768),
    "token_2_31": dict(prompt=[5, 2**31]),
    "token_1e30": dict(prompt=[5, 10**30]),
    "negative_token": dict(prompt=[5, -1]),
    "output_len": dict(output_len=0),
    "max_tokens": dict(max_tokens=10**12),
}
REJECTION_REASONS = {
    "prompt_len": f"prompt_len must be <= {MAX_PROMPT_LEN:,}, got 1,000,000,000",
    "arrival": f"arrival_step must be <= {MAX_ARRIVAL_STEP:,}, got 1,000,000,000,000",
    "n": f"n must be <= {MAX_SAMPLES:,}, got 32,768",
    "token_2_31": f"prompt token id 2,147,483,648 is over the bound of {MAX_TOKEN_ID:,}",
    "token_1e30": f"prompt token id {10**30:,} is over the bound of {MAX_TOKEN_ID:,}",
    "negative_token": "prompt token ids must be >= 0, got -1",
    "output_len": "output_len must be >= 1, got 0",
    "max_tokens": f"max_tokens must be <= {MAX_OUTPUT_LEN:,}, got 1,000,000,000,000",
}

SIM = ["simulate", "--workload", "explainer40"]
GEN = ["generate", "--prompt", "hi"]
GEN_MODEL = [*GEN, "--model", "{d}/model", "--device", "cpu"]

# (id, arguments, what the error line must contain, extra environment)
BAD = [
    # simulate: engine settings
    ("sim-pool-1e9", [*SIM, "--pool-slots", str(10**9)], f"pool_slots must be <= {MAX_POOL_SLOTS:,}, got 1,000,000,000", {}),
    ("sim-pool-1e12", [*SIM, "--pool-slots", str(10**12)], "pool_slots must be <= 1,048,576, got 1,000,000,000,000", {}),
    ("sim-swap-1e12", [*SIM, "--preemption", "swap", "--swap-slots", str(10**12)], "swap_slots must be <= 1,048,576", {}),
    ("sim-contiguous-1e8", [*SIM, "--allocator", "contiguous", "--pool-slots", str(10**8)], "pool_slots must be <= 1,048,576", {}),
    ("sim-seed-negative", [*SIM, "--seed", "-1"], "seed must be >= 0, got -1", {}),
    ("sim-seed-huge", [*SIM, "--seed", str(2**31)], "seed must be <= 2,147,483,647", {}),
    ("sim-block-32768", ["simulate", "--workload-file", "{d}/long_answer.json", "--block-size", "32768"],
     "block_size must be <= 1,024, got 32,768", {}),
    ("sim-watermark-nan", [*SIM, "--watermark", "nan"], "watermark must be a number", {}),
    ("sim-batch-tokens-0", [*SIM, "--max-batch-tokens", "0"], "max_batch_tokens must be >= 1", {}),
    ("sim-unknown-workload", ["simulate", "--workload", "nope"], "unknown workload 'nope'", {}),
    ("sim-trace-out-nowhere", [*SIM, "--trace-out", "/nonexistent-dir/run.jsonl"], "no directory '/nonexistent-dir'", {}),
    ("sim-trace-out-folder", [*SIM, "--trace-out", "{d}/folder.json"], "is a directory", {}),
    # simulate: workload files
    ("wl-deep", ["simulate", "--workload-file", "{d}/deep.json"], f"JSON nested more than {MAX_JSON_DEPTH} deep", {}),
    ("wl-depth-9", ["simulate", "--workload-file", "{d}/deep9.json"], f"JSON nested more than {MAX_JSON_DEPTH} deep", {}),
    ("wl-dev-zero", ["simulate", "--workload-file", "/dev/zero"], "workload file '/dev/zero' is not a regular file", {}),
    ("wl-fifo", ["simulate", "--workload-file", "{d}/fifo.json"], "is not a regular file", {}),
    ("wl-folder", ["simulate", "--workload-file", "{d}/folder.json"], "is not a regular file", {}),
    ("wl-missing", ["simulate", "--workload-file", "{d}/missing.json"], "No such file or directory", {}),
    ("wl-huge", ["simulate", "--workload-file", "{d}/huge.json"], "has 67,108,865 bytes, more than the 67,108,864 allowed", {}),
    ("wl-200k-requests", ["simulate", "--workload-file", "{d}/many.json"],
     f"200,000 requests, more than the {MAX_REQUESTS:,} a workload may have", {}),
    ("wl-tokens-in-all", ["simulate", "--workload-file", "{d}/tokens.json"],
     f"the prompts add up to 5,242,880 tokens, more than the {MAX_WORKLOAD_TOKENS:,} a workload may hold", {}),
    ("wl-nan", ["simulate", "--workload-file", "{d}/nan.json"], "NaN is not a number JSON allows", {}),
    ("wl-1e400", ["simulate", "--workload-file", "{d}/inf.json"], "number 1e400 is out of range", {}),
    ("wl-5000-digits", ["simulate", "--workload-file", "{d}/digits.json"], "an integer has too many digits", {}),
    ("wl-lone-surrogate", ["simulate", "--workload-file", "{d}/surrogate.json"], r"string '\ud800' is not valid Unicode", {}),
    ("wl-not-utf8", ["simulate", "--workload-file", "{d}/latin1.json"], "not UTF-8 text (invalid continuation byte", {}),
    ("wl-string-number", ["simulate", "--workload-file", "{d}/string_number.json"], "prompt_len must be an integer, got '5'", {}),
    ("wl-null", ["simulate", "--workload-file", "{d}/null.json"], "output_len must be an integer, got None", {}),
    # generate: checked before torch or the model load
    ("gen-pool-1e7", [*GEN, "--pool-slots", str(10**7)], "pool_slots must be <= 1,048,576, got 10,000,000", {}),
    ("gen-pool-1e12", [*GEN, "--pool-slots", str(10**12)], "pool_slots must be <= 1,048,576", {}),
    ("gen-swap-1e12", [*GEN, "--swap-slots", str(10**12)], "swap_slots must be <= 1,048,576", {}),
    ("gen-kv-budget-1e6GiB", [*GEN, "--device", "cpu", "--kv-budget", "1000000GiB"],
     "a KV pool sized to the KV budget needs 976.6 TiB, over the memory budget of", {}),
    ("gen-pool-over-budget", [*GEN_MODEL, "--pool-slots", str(MAX_POOL_SLOTS)],
     "the KV pool (1,048,576 slots + 23,296 swap slots x 46,080 B per token) needs 46.0 GiB, "
     "over the memory budget of 8.0 GiB", {"PAGEDKV_MEMORY_BUDGET": "8GiB"}),
    ("gen-swap-over-budget", [*GEN_MODEL, "--pool-slots", "4096", "--swap-slots", str(MAX_POOL_SLOTS)],
     "(4,096 slots + 1,048,576 swap slots x 46,080 B per token) needs 45.2 GiB", {"PAGEDKV_MEMORY_BUDGET": "8GiB"}),
    ("gen-kv-budget-over-budget", [*GEN_MODEL, "--kv-budget", "2GiB"], "needs 2.0 GiB, over the memory budget of 1.0 GiB",
     {"PAGEDKV_MEMORY_BUDGET": "1GiB"}),
    ("gen-pool-blocks-1e6", [*GEN_MODEL, "--pool-blocks", str(10**6)], "is 16,000,000 slots, more than the 1,048,576 allowed", {}),
    ("gen-kv-budget-tiny", [*GEN_MODEL, "--kv-budget", "1KiB"], "holds no block of 16 slots (737280 bytes each)", {}),
    ("gen-kv-budget-words", [*GEN, "--kv-budget", "lots"], "--kv-budget must be a size such as 64MiB", {}),
    ("gen-two-sizes", [*GEN, "--pool-slots", "64", "--kv-budget", "1MiB"], "give the pool size one way only", {}),
    ("gen-temperature-nan", [*GEN, "--temperature", "nan"], "temperature must be a finite number, got nan", {}),
    ("gen-temperature-inf", [*GEN, "--temperature", "inf"], "temperature must be a finite number, got inf", {}),
    ("gen-temperature-1000", [*GEN, "--temperature", "1000"], "temperature must be in [0, 100]", {}),
    ("gen-top-p-nan", [*GEN, "--top-p", "nan"], "top_p must be a finite number", {}),
    ("gen-top-p-0", [*GEN, "--top-p", "0"], "top_p must be in (0, 1]", {}),
    ("gen-n-32768", [*GEN, "--n", "32768"], "n must be >= 1 and <= 256, got 32,768", {}),
    ("gen-max-tokens-0", [*GEN, "--max-tokens", "0"], "max_tokens must be >= 1", {}),
    ("gen-max-tokens-1e9", [*GEN_MODEL, "--max-tokens", str(10**9)], "--max-tokens must be below the model's context "
     "of 8,192 tokens (max_model_len, prompt + answer), got 1,000,000,000", {}),
    ("gen-max-tokens-context", [*GEN_MODEL, "--max-tokens", "8192"], "--max-tokens must be below the model's context "
     "of 8,192 tokens", {}),
    ("gen-prompts-max-tokens-1e9", ["generate", "--prompts-file", "{d}/prompts_max_tokens.json", "--model", "{d}/model",
                                    "--device", "cpu"],
     "prompts file item 1: max_tokens must be below the model's context of 8,192 tokens", {}),
    ("gen-seed-negative", [*GEN, "--seed", "-1"], "seed must be >= 0, got -1", {}),
    ("gen-device-tpu", [*GEN, "--device", "tpu"], "device must be one of auto, cpu, cuda, got 'tpu'", {}),
    ("gen-device-superscript", [*GEN, "--device", "cuda:\u00b2"], "device must be one of auto, cpu, cuda", {}),
    ("gen-threads-1e6", [*GEN, "--threads", "1000000"], f"threads must be an integer in [1, {os.cpu_count()}]", {}),
    ("gen-threads-0", [*GEN, "--threads", "0"], "got 0", {}),
    ("gen-dtype", [*GEN, "--dtype", "int8"], "dtype must be one of float32, bfloat16, float16, got 'int8'", {}),
    ("gen-model-missing", [*GEN, "--model", "/no/such/model"], "model path '/no/such/model' does not exist", {}),
    ("gen-trace-out-nowhere", [*GEN, "--trace-out", "/nonexistent-dir/t.jsonl"], "no directory", {}),
    ("gen-prompts-deep", ["generate", "--prompts-file", "{d}/prompts_deep.json"], "JSON nested more than 64 deep", {}),
    ("gen-prompts-dev-zero", ["generate", "--prompts-file", "/dev/zero"], "prompts file '/dev/zero' is not a regular file", {}),
    ("gen-prompts-fifo", ["generate", "--prompts-file", "{d}/fifo.json"], "is not a regular file", {}),
    ("gen-prompts-huge", ["generate", "--prompts-file", "{d}/huge.json"], "more than the 16,777,216 allowed", {}),
    ("gen-prompts-nan", ["generate", "--prompts-file", "{d}/prompts_nan.json"], "NaN is not a number JSON allows", {}),
    ("gen-prompts-not-list", ["generate", "--prompts-file", "{d}/prompts_dict.json"], "must hold a non-empty JSON list", {}),
    ("gen-prompts-long", ["generate", "--prompts-file", "{d}/prompts_long.json"], "1,048,577 characters, more than", {}),
    # replay
    ("replay-deep", ["replay", "{d}/trace_deep.jsonl"], "nested too deeply", {}),
    ("replay-header-requests", ["replay", "{d}/trace_requests.jsonl"], "header requests must be a list of objects", {}),
    ("replay-1e400", ["replay", "{d}/trace_inf.jsonl"], "1e400", {}),
    ("replay-block-size-0", ["replay", "{d}/trace_block0.jsonl"], "trace_block0.jsonl:1:", {}),
    ("replay-not-a-trace", ["replay", "{d}/ok.json"], "not a pagedkv trace header", {}),
    ("replay-missing", ["replay", "{d}/missing.jsonl"], "No such file or directory", {}),
    # the command itself
    ("no-command", [], "required", {}),
    ("unknown-command", ["frobnicate"], "invalid choice", {}),
    ("unknown-flag", [*SIM, "--colour"], "unrecognized arguments: --colour", {}),
    ("not-a-number", [*SIM, "--block-size", "big"], "invalid int value: 'big'", {}),
    ("bench-unknown", ["bench", "nosuch"], "unknown benchmark 'nosuch'", {}),
]
# What trace.py (helper C's) does not refuse up front yet: /dev/zero is read up to its 256 MB
# line cap before it is refused, and a FIFO blocks the reader forever.
TRACE_FILE_CHECKS = [
    ("replay-dev-zero", ["replay", "/dev/zero"], "is not a regular file", {}),
    ("replay-fifo", ["replay", "{d}/trace_fifo.jsonl"], "is not a regular file", {}),
]


def run_cli(args: list[str], files: Path, env: dict | None = None, timeout: float = TIMEOUT_S):
    argv = [a.replace("{d}", str(files)) for a in args]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "pagedkv_core", *argv], cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"python -m pagedkv_core {' '.join(argv)[:200]} hung for {timeout} s")
    return proc, time.perf_counter() - t0


@contextlib.contextmanager
def hang_guard(seconds: float = TIMEOUT_S):
    """Fail the test, rather than hang the suite, if the code inside runs past ``seconds``."""
    def expire(signum, frame):
        raise TimeoutError(f"the command ran past {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(int(seconds))
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run_main(args: list[str], files: Path, env: dict, capsys, monkeypatch) -> subprocess.CompletedProcess:
    """``main(argv)`` in this process, with ``env`` set: what it returned, printed and wrote to
    stderr, as a subprocess's result."""
    from pagedkv_core.cli import main

    argv = [a.replace("{d}", str(files)) for a in args]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    capsys.readouterr()
    with hang_guard():
        try:
            rc = main(argv)
        except SystemExit as exc:  # what `python -m` would turn into its exit status
            rc = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr()
    return subprocess.CompletedProcess(argv, rc, out.out, out.err)


def check_one_line_error(proc, elapsed: float, fragment: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and proc.stderr.endswith("\n"), proc.stderr[-2000:]
    assert lines[0].startswith("error: ") and fragment in lines[0], lines[0]


@pytest.mark.parametrize("args, fragment, env", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_input_is_one_line_and_exit_2(files, args, fragment, env, capsys, monkeypatch):
    check_one_line_error(run_main(args, files, env, capsys, monkeypatch), 0.0, fragment)


# One case of each command (and of generate's model-less pool plan), in a real ``python -m
# pagedkv_core``: the exit status and the stderr line a shell sees.
IN_A_PROCESS = ["sim-pool-1e9", "wl-deep", "gen-pool-over-budget", "gen-max-tokens-1e9", "replay-deep", "no-command",
                "unknown-flag"]


@pytest.mark.parametrize("args, fragment, env", [c[1:] for c in BAD if c[0] in IN_A_PROCESS],
                         ids=[c[0] for c in BAD if c[0] in IN_A_PROCESS])
def test_bad_input_in_a_real_process(files, args, fragment, env):
    proc, elapsed = run_cli(args, files, env)
    check_one_line_error(proc, elapsed, fragment)


@pytest.mark.parametrize("args, fragment, env", [c[1:] for c in TRACE_FILE_CHECKS], ids=[c[0] for c in TRACE_FILE_CHECKS])
def test_trace_files_are_checked_before_reading(files, args, fragment, env):
    proc, elapsed = run_cli(args, files, env)
    check_one_line_error(proc, elapsed, fragment)


@pytest.mark.skipif(gpu_driver_present(), reason="this machine has a GPU driver")
def test_cuda_without_a_gpu_is_one_line(files):
    proc, elapsed = run_cli([*GEN, "--device", "cuda"], files)
    check_one_line_error(proc, elapsed, "device 'cuda' requested but CUDA is not available")


@pytest.mark.parametrize("name", list(REJECTIONS))
def test_a_bad_request_is_rejected_while_the_others_run(files, name, capsys, monkeypatch):
    proc = run_main(["simulate", "--workload-file", f"{{d}}/reject_{name}.json", "--json"], files, {}, capsys, monkeypatch)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-2000:]
    s = json.loads(proc.stdout)
    assert s["rejected"] == [{"id": "bad", "reason": REJECTION_REASONS[name]}]
    assert s["requests"] == 2 and s["finished"] == 1 and s["tokens_generated"] == 3  # "ok" ran in full
    assert s["steps"] < 10  # the far arrival is rejected at once, not waited for


def test_rejections_are_printed_in_the_table(files):
    proc, _ = run_cli(["simulate", "--workload-file", "{d}/reject_n.json"], files)
    assert proc.returncode == 0 and proc.stderr == ""
    assert f"rejected bad: {REJECTION_REASONS['n']}" in proc.stdout.splitlines()


def test_generate_checks_cost_no_torch(files):
    """The checks run before torch is imported: a bad value costs the interpreter's start, not
    torch's (about 2 s more) nor the model's."""
    code = ("import sys\nfrom pagedkv_core.cli import main\nrc = main(sys.argv[1:])\n"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'torch was imported'\n"
            "sys.exit(rc)")
    for args in ([*GEN, "--threads", "1000000"], [*GEN_MODEL, "--pool-slots", str(MAX_POOL_SLOTS)]):
        argv = [a.replace("{d}", str(files)) for a in args]
        proc = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True, text=True,
                              timeout=TIMEOUT_S, env={**os.environ, "PAGEDKV_MEMORY_BUDGET": "8GiB"})
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr


@pytest.mark.slow
def test_generate_json_keeps_stderr_empty(files):
    """With --json (and stderr not a terminal) nothing but an error line may reach stderr: no
    loading bar of ours, none of transformers'."""
    proc, _ = run_cli([*GEN, "--max-tokens", "2", "--device", "cpu", "--threads", "1", "--json"], files, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr == ""
    assert len(json.loads(proc.stdout)["outputs"][0]["token_ids"]) == 2


@pytest.mark.parametrize("args, fragment", [
    (["--pool-slots", str(MAX_POOL_SLOTS)], "the KV pool (1,048,576 slots"),
    (["--max-tokens", str(10**9)], "--max-tokens must be below the model's context of 8,192 tokens"),
], ids=["pool", "max-tokens"])
def test_a_fresh_machines_first_run_is_refused_before_the_model_converts(files, tmp_path, args, fragment):
    """An empty model cache: the bundled GGUF has never been converted, and there is no
    ``config.json`` to read. Its metadata header gives the model's shape (gguf_header), so a pool
    over the budget or an answer longer than the context is refused at once, in one line, and
    nothing is converted (issue 20: this took a whole conversion before, a minute on a slow machine)."""
    cache = tmp_path / "cache"
    env = {"PAGEDKV_CACHE": str(cache), "PAGEDKV_MEMORY_BUDGET": "8GiB"}
    proc, elapsed = run_cli([*GEN, "--device", "cpu", "--threads", "1", *args], files, env)
    check_one_line_error(proc, elapsed, fragment)
    assert not cache.exists() or not any(cache.iterdir()), sorted(p.name for p in cache.iterdir())


# `python -m pagedkv_core` with the model's shape unknown before loading (as for a model whose
# config cannot be read up front): the checks before the load pass, and the pool is refused once
# the model has loaded.
UNKNOWN_SHAPE = ("import sys; from pagedkv_core.cli import generate, main; from pagedkv_core.sizing import pool_plan; "
                 "pool_plan.model_kv_shape = generate.model_kv_shape = lambda model: None; sys.exit(main())")


@pytest.mark.slow
def test_a_pool_refused_after_the_model_loaded_is_still_one_line(files):
    """The model cache is the suite's (converted by whichever test needs it first, under its lock):
    the model loads, then its pool is refused before it is allocated, in one line, with nothing on
    stdout."""
    argv = [*GEN, "--device", "cpu", "--threads", "1", "--pool-slots", str(MAX_POOL_SLOTS)]
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", UNKNOWN_SHAPE, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PAGEDKV_MEMORY_BUDGET": "8GiB"}, stdin=subprocess.DEVNULL)
    check_one_line_error(proc, time.perf_counter() - t0, "the KV pool (1,048,576 slots")
