"""Seeded request scenarios, and workload files of explicit requests.

Built-in (``--workload NAME``; each suggests a pool size, used unless ``--pool-slots``):

- ``explainer40``: 40 requests at step 0 into 2,048 slots. Answer lengths are long-tailed
  (log-normal, median about 100 tokens) and ``max_tokens`` is sized so that about three
  prompt + max_tokens reservations fit at once: the contiguous baseline wastes most of what
  it reserves, the paged pool runs about ten times more requests at a time.
- ``shared_preamble``: a 600-token system prompt shared by 24 requests arriving one per
  step, each with its own question (prefix caching).
- ``burst``: 8 requests at step 0, then a spike of 32 at step 20 that forces preemption.
- ``trickle``: 48 requests with Poisson arrivals (about one every four steps).

- ``azure-conv``: 1,000 requests of Azure's production conversation request log (the shipped
  ``data/azure_conv_2023.csv``) at their recorded arrival times into 65,536 slots.
- ``azure-conv-small``: 200 of them with every length scaled by 1/8, into 4,096 slots (fast
  enough for the app's heatmaps).

A workload file is either a JSON list of
``{"id": str, "prompt": [ints] | "prompt_len": int, "output_len": int, "max_tokens": int,
"arrival_step": int = 0, "n": int = 1}`` (``prompt_len`` makes a seeded random prompt), or a
request log: a CSV (``.csv`` or gzipped ``.csv.gz``) with the columns ``TIMESTAMP``,
``ContextTokens`` and ``GeneratedTokens``, one request per row, read by :func:`request_log_workload`
with the options of :class:`LogOptions`, or a request log with prefix hashes: JSON lines
(``.jsonl``, ``.jsonl.gz``) of ``{"timestamp", "input_length", "output_length", "hash_ids"}``,
read by :mod:`pagedkv_core.workloads.hashed_log` with the same options.

Files are untrusted: every bound is in the limits section below. A file that breaks its shape
(not a list of objects, a wrong type, an unknown key) or a file-level bound is refused with one
line; a request whose value breaks a request-level bound is that request's rejection, with the
reason, while the others run.

The shipped request log is the Azure LLM inference trace 2023 (conversation service), published by
Microsoft Azure under CC BY 4.0 with the attribution Patel et al., "Splitwise", ISCA 2024; see
``data/LICENSE-azure-trace.txt``.

"Trace" in pagedkv means a recorded run (:mod:`pagedkv_core.record.trace_file`); a list of
requests to replay, such as these, is a request log.
"""
from __future__ import annotations

import csv
import gzip
import io
import math
import re
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..config import MAX_ARRIVAL_STEP, MAX_TOKEN_ID, ConfigError, setting_spec
from ..safe_io import loads_json, open_capped, read_bytes_capped
from ..sampling import MAX_SAMPLES, SamplingParams
from ..sources.scripted import FIRST_TOKEN, VOCAB_SIZE

# ---------------------------------------------------------------------------- limits
# Every bound a workload is held to, each stated in its message. Over a file-level bound the
# whole file is refused (ConfigError, one line): it is checked before the file is read, or
# before anything is built from it. Over a request-level bound that request alone is rejected,
# with the bound in its reason, while the others run. A real model narrows two of these at
# arrival: the engine rejects prompts longer than the model's context and token ids outside
# its vocabulary.
MAX_WORKLOAD_FILE_BYTES = 64 << 20  # file: its size, checked before reading (a gzipped request log: compressed)
MAX_JSON_DEPTH = 8  # file: a workload is a list of objects holding lists (depth 3)
MAX_REQUESTS = 10_000  # file: requests per JSON workload (the engine's per-step cost grows with the queue)
MAX_WORKLOAD_TOKENS = 1 << 22  # file: prompt tokens of all its requests together, made ones included
MAX_PROMPT_LEN = setting_spec("max_model_len").hi  # request: prompt tokens (1,048,576)
MAX_OUTPUT_LEN = setting_spec("max_model_len").hi  # request: output_len and max_tokens
# request: n <= MAX_SAMPLES (sampling), token ids <= MAX_TOKEN_ID, arrival_step <= MAX_ARRIVAL_STEP (config)


@dataclass(frozen=True)
class WorkloadRequest:
    """One request; ``reject_reason`` set: it broke a request-level bound, and is submitted
    as a rejection (its other fields are then placeholders, the arrival step aside)."""

    id: str
    prompt: tuple[int, ...]
    output_len: int
    max_tokens: int
    arrival_step: int = 0
    n: int = 1
    reject_reason: str | None = None

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "prompt": list(self.prompt),
            "output_len": self.output_len,
            "max_tokens": self.max_tokens,
            "arrival_step": self.arrival_step,
            "n": self.n,
        }

    def submit(self, engine) -> str:
        """Add this request to ``engine`` (as a rejection when it has a ``reject_reason``);
        returns the id it is kept under."""
        if self.reject_reason is not None:
            engine.add_rejected(self.id, self.reject_reason, arrival_step=self.arrival_step)
            return self.id
        return engine.add_request(self.id, list(self.prompt), SamplingParams(max_tokens=self.max_tokens, n=self.n),
                                  arrival_step=self.arrival_step, output_len=self.output_len)

    def trace_entry(self) -> dict:
        """What a streamed run's trace lists for it, in the step it arrives: its lengths, not its
        prompt's token ids (those of a request log are remade from the log and the seed)."""
        entry = {"id": self.id, "prompt_len": len(self.prompt), "output_len": self.output_len,
                 "max_tokens": self.max_tokens, "n": self.n, "arrival_step": self.arrival_step}
        if self.reject_reason is not None:
            entry["reject_reason"] = self.reject_reason
        return entry


@dataclass(frozen=True)
class LeftOut:
    """The rows of a request log that a workload leaves out, and why: with ``max_tokens``
    "context", a row whose prompt and answer together are longer than the model's context is one
    a server with that context could not serve as logged. They are never submitted; the run's
    summary reports them (``simulate``'s ``left_out``) beside the requests it rejected."""

    rows: int
    context: int

    @property
    def reason(self) -> str:
        return f"prompt + answer longer than the {self.context:,}-token context"

    def to_json(self) -> dict:
        return {"rows": self.rows, "reason": self.reason}


def left_out_of(rows: int, context: int) -> LeftOut | None:
    return LeftOut(rows, context) if rows else None


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    requests: tuple[WorkloadRequest, ...]
    pool_slots: int = 2048  # suggested pool size
    hash_block: int | None = None  # a hashed log's tokens per hash block: a paged block size must divide it
    left_out: LeftOut | None = None  # a request log's rows longer than the context, never submitted

    def block_size_problem(self, config) -> str | None:
        """Why ``config`` (an EngineConfig) cannot run this workload with its sharing exact:
        a paged block size that does not divide a hashed log's blocks (None: it can)."""
        return _block_size_problem(self.hash_block, config)

    def submit(self, engine) -> None:
        """Add every request to ``engine``; one with a ``reject_reason`` ends as rejected,
        with that reason, at its arrival step. Raises ConfigError (before adding any) when the
        engine's block size does not divide a hashed log's blocks."""
        problem = self.block_size_problem(engine.config)
        if problem is not None:
            raise ConfigError(f"{self.name}: {problem}")
        for r in self.requests:
            r.submit(engine)


def _block_size_problem(hash_block: int | None, config) -> str | None:
    if hash_block is None:
        return None
    from ..kv.registry import allocator_kind
    from .hashed_log import block_size_problem

    if allocator_kind(config.allocator) != "paged":
        return None
    return block_size_problem(hash_block, config.block_size)


@dataclass(frozen=True)
class LogStream:
    """A request log read as the run goes (:func:`stream_workload_file`): the file was checked
    whole before (every row, the arrival steps), and :meth:`requests` reads it again lazily,
    one :class:`WorkloadRequest` at a time in arrival order, for
    :meth:`~pagedkv_core.engine.Engine.feed`. Nothing but the row being read is held."""

    name: str
    description: str
    num_requests: int
    pool_slots: int
    hash_block: int | None
    _requests: object  # () -> Iterator[WorkloadRequest]
    left_out: LeftOut | None = None  # rows longer than the context, never submitted

    def block_size_problem(self, config) -> str | None:
        return _block_size_problem(self.hash_block, config)

    def requests(self) -> Iterator[WorkloadRequest]:
        return self._requests()


def _tokens(rng: np.random.Generator, n: int) -> tuple[int, ...]:
    return tuple(rng.integers(FIRST_TOKEN, VOCAB_SIZE, size=n).tolist())


# ---------------------------------------------------------------------------- scenarios
EXPLAINER_POOL = 2048
EXPLAINER_PROMPT = (48, 80)
EXPLAINER_MAX_TOKENS = EXPLAINER_POOL // 3 - EXPLAINER_PROMPT[1]  # three reservations fit, four do not


def explainer40(seed: int = 0) -> Workload:
    rng = np.random.default_rng([seed, 40])
    lo, hi = EXPLAINER_PROMPT
    reqs = []
    for i in range(40):
        prompt_len = int(rng.integers(lo, hi + 1))
        answer = int(round(rng.lognormal(mean=np.log(100), sigma=0.9)))
        output_len = max(4, min(answer, EXPLAINER_MAX_TOKENS))
        reqs.append(WorkloadRequest(f"q{i:02d}", _tokens(rng, prompt_len), output_len, EXPLAINER_MAX_TOKENS))
    return Workload(
        "explainer40",
        "40 requests at step 0; long-tailed answers; max_tokens lets ~3 contiguous reservations fit",
        tuple(reqs),
        EXPLAINER_POOL,
    )


def shared_preamble(seed: int = 0) -> Workload:
    rng = np.random.default_rng([seed, 600])
    preamble = _tokens(rng, 600)
    reqs = []
    for i in range(24):
        question = _tokens(rng, int(rng.integers(8, 41)))
        output_len = int(rng.integers(16, 129))
        reqs.append(WorkloadRequest(f"s{i:02d}", preamble + question, output_len, 128, arrival_step=i))
    return Workload("shared_preamble", "24 requests sharing a 600-token system prompt, one per step", tuple(reqs), 2048)


def burst(seed: int = 0) -> Workload:
    rng = np.random.default_rng([seed, 7])
    reqs = []
    for i in range(8):
        reqs.append(
            WorkloadRequest(f"b{i:02d}", _tokens(rng, int(rng.integers(32, 97))), int(rng.integers(96, 257)), 256)
        )
    for i in range(8, 40):
        reqs.append(
            WorkloadRequest(
                f"b{i:02d}", _tokens(rng, int(rng.integers(64, 193))), int(rng.integers(64, 257)), 256, arrival_step=20
            )
        )
    return Workload("burst", "8 requests, then a spike of 32 at step 20 that forces preemption", tuple(reqs), 2048)


def trickle(seed: int = 0) -> Workload:
    rng = np.random.default_rng([seed, 48])
    reqs = []
    t = 0.0
    for i in range(48):
        t += rng.exponential(4.0)
        output_len = int(min(256, 8 + rng.geometric(1 / 60)))
        reqs.append(
            WorkloadRequest(f"t{i:02d}", _tokens(rng, int(rng.integers(16, 257))), output_len, 256, arrival_step=int(t))
        )
    return Workload("trickle", "48 requests with Poisson arrivals, about one every four steps", tuple(reqs), 2048)


# ---------------------------------------------------------------------------- files
_FIELDS = {"id", "prompt", "prompt_len", "output_len", "max_tokens", "arrival_step", "n"}


class _Rejected(Exception):
    """A request-level bound broken: the request is rejected with this reason."""


def _int_field(where: str, obj: dict, key: str, lo: int, hi: int, default: int | None = None) -> int:
    """An integer field: missing or not an integer is the file's error (ConfigError); out of
    ``[lo, hi]`` is the request's (:class:`_Rejected`)."""
    if key not in obj:
        if default is None:
            raise ConfigError(f"{where}: missing {key!r}")
        return default
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: {key} must be an integer, got {value!r}")
    if value < lo:
        raise _Rejected(f"{key} must be >= {lo}, got {value:,}")
    if value > hi:
        raise _Rejected(f"{key} must be <= {hi:,}, got {value:,}")
    return value


def _prompt(where: str, obj: dict) -> list:
    """The explicit prompt's ids: a list of integers (else the file's error), each in
    ``[0, MAX_TOKEN_ID]`` and at most MAX_PROMPT_LEN of them (else the request's)."""
    prompt = obj["prompt"]
    if not isinstance(prompt, list) or not prompt:
        raise ConfigError(f"{where}: prompt must be a non-empty list of token ids")
    for t in prompt:
        if isinstance(t, bool) or not isinstance(t, int):
            raise ConfigError(f"{where}: prompt token ids must be integers, got {t!r}")
    if len(prompt) > MAX_PROMPT_LEN:
        raise _Rejected(f"prompt of {len(prompt):,} tokens is longer than the {MAX_PROMPT_LEN:,} allowed")
    low, high = min(prompt), max(prompt)
    if low < 0:
        raise _Rejected(f"prompt token ids must be >= 0, got {low:,}")
    if high > MAX_TOKEN_ID:
        raise _Rejected(f"prompt token id {high:,} is over the bound of {MAX_TOKEN_ID:,}")
    return prompt


def _check_total_tokens(name: str, total: int, hint: str) -> None:
    """MAX_WORKLOAD_TOKENS, before any prompt is made: a few bytes of file can ask for a
    billion made-up tokens, a few thousand such requests for far more."""
    if total > MAX_WORKLOAD_TOKENS:
        raise ConfigError(f"{name}: the prompts add up to {total:,} tokens, more than the "
                          f"{MAX_WORKLOAD_TOKENS:,} a workload may hold; {hint}")


def _seed_of(rid: str) -> int:
    """The made-up prompt's seed part for an id (any string: a lone surrogate is the engine's
    to reject, not a crash here)."""
    return zlib.crc32(rid.encode("utf-8", "surrogatepass"))


def parse_workload(data, name: str = "file", seed: int = 0) -> Workload:
    """Validate a decoded workload (a list of request objects). The file's shape (a list of
    objects with string ids, known keys and integer fields) and its file-level bounds raise
    ConfigError; a request's value out of its bound makes that request a rejection (its
    ``reject_reason``), and the others run. See the limits at the top of this module."""
    if not isinstance(data, list):
        raise ConfigError(f"{name}: a workload must be a JSON list of requests, got {type(data).__name__}")
    if not data:
        raise ConfigError(f"{name}: the workload has no requests")
    if len(data) > MAX_REQUESTS:
        raise ConfigError(f"{name}: {len(data):,} requests, more than the {MAX_REQUESTS:,} a workload may have")
    checked, seen = [], set()
    for i, obj in enumerate(data):
        where = f"{name}: request {i}"
        if not isinstance(obj, dict):
            raise ConfigError(f"{where}: must be an object, got {type(obj).__name__}")
        unknown = sorted(set(obj) - _FIELDS)
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}")
        rid = obj.get("id")
        if not isinstance(rid, str) or not rid:
            raise ConfigError(f"{where}: id must be a non-empty string, got {rid!r}")
        where = f"{name}: request {i} ({rid!r})"
        if rid in seen:
            raise ConfigError(f"{where}: duplicate id")
        seen.add(rid)
        if ("prompt" in obj) == ("prompt_len" in obj):
            raise ConfigError(f"{where}: give exactly one of 'prompt' and 'prompt_len'")
        checked.append(_checked_request(where, rid, obj))
    total = sum(len(prompt) if prompt is not None else fields_["prompt_len"]
                for _rid, fields_, prompt, problem in checked if problem is None)
    _check_total_tokens(name, total, "use fewer or shorter requests")
    reqs = []
    for rid, fields_, prompt, problem in checked:
        if problem is not None:  # the rejection shows when the request would have come
            reqs.append(WorkloadRequest(rid, (), 1, 1, arrival_step=fields_.get("arrival_step", 0), reject_reason=problem))
            continue
        if prompt is None:
            prompt = _tokens(np.random.default_rng([seed, _seed_of(rid)]), fields_["prompt_len"])
        reqs.append(WorkloadRequest(rid, tuple(prompt), fields_["output_len"], fields_["max_tokens"],
                                    arrival_step=fields_["arrival_step"], n=fields_["n"]))
    return Workload(name, f"{len(reqs)} requests from {name}", tuple(reqs))


def _checked_request(where: str, rid: str, obj: dict) -> tuple[str, dict, list | None, str | None]:
    """(id, its integer fields, its explicit prompt or None, the reason it is rejected or
    None). Every field's type is checked first: a wrong type is the file's error (ConfigError),
    whichever field it is in; then the bounds, the first broken one being the reason."""
    fields_ = {}
    problem = None
    specs = (("output_len", 1, MAX_OUTPUT_LEN, None), ("max_tokens", 1, MAX_OUTPUT_LEN, None),
             ("arrival_step", 0, MAX_ARRIVAL_STEP, 0), ("n", 1, MAX_SAMPLES, 1), ("prompt_len", 1, MAX_PROMPT_LEN, None))
    for key, lo, hi, default in specs:
        if key == "prompt_len" and key not in obj:
            continue
        try:
            fields_[key] = _int_field(where, obj, key, lo, hi, default)
        except _Rejected as exc:
            problem = problem or str(exc)
    prompt = None
    if "prompt" in obj:
        try:
            prompt = _prompt(where, obj)
        except _Rejected as exc:
            problem = problem or str(exc)
    return rid, fields_, prompt, problem


def load_workload_file(path, seed: int = 0, **options) -> Workload:
    """A workload from a file: a request log (``.csv``, ``.csv.gz``, or a hashed log ``.jsonl``,
    ``.jsonl.gz``; ``options`` are the fields of :class:`LogOptions`) or a JSON list of requests
    (no options). Raises ConfigError."""
    path = Path(path)
    if _is_hashed_log_name(path.name):
        from .hashed_log import load_hashed_log

        return load_hashed_log(path, seed, **options)
    if _is_csv_log_name(path.name):
        return request_log_workload(path, seed, LogOptions.of(**options))
    _check_no_options(path.name, options)
    data = read_bytes_capped(path, MAX_WORKLOAD_FILE_BYTES, "workload file")
    return _json_workload(data, f"workload file {str(path)!r}", path.name, seed)


def workload_from_bytes(data: bytes, name: str, seed: int = 0, **options) -> Workload:
    """The same as :func:`load_workload_file`, for an upload's bytes; ``name`` (the file name)
    says which kind it is: a CSV request log when it ends in ``.csv`` or ``.csv.gz``, a hashed log when it
    ends in ``.jsonl`` or ``.jsonl.gz``, else JSON."""
    if len(data) > MAX_WORKLOAD_FILE_BYTES:
        raise ConfigError(f"{name}: {len(data):,} bytes is more than the {MAX_WORKLOAD_FILE_BYTES:,} a workload file may have")
    if _is_hashed_log_name(name):
        from .hashed_log import hashed_log_from_bytes

        return hashed_log_from_bytes(data, name, seed, **options)
    if _is_csv_log_name(name):
        opt = LogOptions.of(**options)
        return _log_from_rows(_csv_log_rows(_open_bytes(data, name), name, opt.start), name, seed, opt)
    _check_no_options(name, options)
    return _json_workload(data, name, name, seed)


def _json_workload(data: bytes, label: str, name: str, seed: int) -> Workload:
    return parse_workload(loads_json(data, label, max_depth=MAX_JSON_DEPTH), name, seed)


def _check_no_options(name: str, options: dict) -> None:
    given = sorted(k for k, v in options.items() if v is not None)
    if given:
        raise ConfigError(f"{name}: {', '.join(given)} apply only to request logs (.csv, .csv.gz, .jsonl, .jsonl.gz)")


# ---------------------------------------------------------------------------- request logs (CSV)
DATA_DIR = Path(__file__).resolve().parents[1] / "data"
AZURE_CONV_LOG = DATA_DIR / "azure_conv_2023.csv"
AZURE_SOURCE = (
    "Azure LLM inference trace 2023, conversation service (Microsoft Azure, CC BY 4.0; "
    "Patel et al., Splitwise, ISCA 2024)"
)
LOG_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MAX_LOG_REQUESTS = 1_000_000  # requests one request log may have (streamed: memory follows the requests alive)
MAX_BUILT_LOG_REQUESTS = 5000  # requests a request log built whole in memory may hold without a count
MAX_STREAMED_LOG_BYTES = 1 << 30  # a streamed request log's size (it is read twice, never held)
MAX_LOG_ROWS = 1_000_000  # rows a request log may have up to the last one used (MAX_LOG_REQUESTS)
DEFAULT_MAX_CONTEXT = 2048  # OPT-13B's, the model of the vLLM paper's Orca baselines
DEFAULT_SECONDS_PER_STEP = 0.05  # one batched decode step of a 13B model on one GPU, roughly
LOG_POOL_SLOTS = 65536  # suggested pool for a request-log workload


@dataclass(frozen=True)
class LogRow:
    """One request of a CSV request log, as the file states it."""

    row: int  # 1 = the first row after the header
    time_s: float  # TIMESTAMP in seconds (date-times: since the epoch, UTC)
    prompt_len: int  # ContextTokens
    answer_len: int  # GeneratedTokens


OVERLONG = ("serve", "leave-out")  # LogOptions.overlong


@dataclass(frozen=True)
class LogOptions:
    """How a request log becomes a workload. Every length here is in the log's tokens: a
    ``length_scale`` scales the prompts, the answers, ``max_context`` and a fixed
    ``max_tokens`` alike (each rounded, at least 1), so a replay keeps the log's shape.

    - ``start``, ``count``: skip ``start`` rows, then take ``count`` requests (None: the rest,
      at most :data:`MAX_LOG_REQUESTS` streamed, :data:`MAX_BUILT_LOG_REQUESTS` built whole).
    - ``seconds_per_step``: the log's seconds one engine step stands for; ``rate`` multiplies the
      arrival rate (2.0 = arrivals twice as dense). Request ``i`` arrives at step
      ``floor((t_i - t_first) * rate / seconds_per_step)``.
    - ``max_tokens``: what a request may write, which is what the contiguous Orca (Max)
      baseline reserves beyond the prompt. ``"context"``: up to the model's ``max_context``
      (prompt + max_tokens = max_context). A row whose prompt + answer exceed it is served as a
      server with that context serves it: its answer is cut at the context (it finishes on
      "length"), and a row whose prompt alone fills the context is rejected with that reason;
      every row is submitted, and the description counts those rows. ``overlong="leave-out"``
      leaves them out instead (never submitted, counted: the named scenarios' windows of
      requests that fit).
      ``"answer"``: exactly the answer's length. An integer N: a fixed cap (answers longer than
      N are cut to N, as the server's cap would cut them).
    - ``pool_slots``: the pool the workload suggests.
    """

    start: int = 0
    count: int | None = None
    seconds_per_step: float = DEFAULT_SECONDS_PER_STEP
    rate: float = 1.0
    max_tokens: str | int = "context"
    max_context: int = DEFAULT_MAX_CONTEXT
    length_scale: float = 1.0
    pool_slots: int = LOG_POOL_SLOTS
    overlong: str = "serve"  # rows longer than the context (max_tokens "context"): "serve" or "leave-out"

    def __post_init__(self) -> None:
        _check_int("start", self.start, 0)
        if self.count is not None:
            _check_int("count", self.count, 1, MAX_LOG_REQUESTS)
        _check_positive("seconds_per_step", self.seconds_per_step)
        _check_positive("rate", self.rate)
        _check_positive("length_scale", self.length_scale, hi=1.0)
        _check_int("max_context", self.max_context, 2, setting_spec("max_model_len").hi)
        object.__setattr__(self, "pool_slots", setting_spec("pool_slots").check(self.pool_slots))
        if self.overlong not in OVERLONG:
            raise ConfigError(f"overlong must be one of {', '.join(OVERLONG)}, got {self.overlong!r}")
        mode = self.max_tokens
        if isinstance(mode, str) and mode.isdigit():
            mode = int(mode)
        if mode not in ("context", "answer"):
            if isinstance(mode, bool) or not isinstance(mode, int) or mode < 1:
                raise ConfigError(f"max_tokens must be 'context', 'answer' or a whole number >= 1, got {mode!r}")
        object.__setattr__(self, "max_tokens", mode)

    @classmethod
    def of(cls, **options) -> "LogOptions":
        """From keyword options (None = the default); unknown names are a ConfigError."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise ConfigError(f"unknown request-log option(s) {', '.join(unknown)}: use {', '.join(sorted(names))}")
        return cls(**{k: v for k, v in options.items() if v is not None})

    def scaled(self, n: int) -> int:
        return scale_length(n, self.length_scale)


def scale_length(n: int, scale: float) -> int:
    """A request-log length at ``scale``: rounded, and at least one token."""
    return max(1, round(n * scale))


def _check_int(name: str, value, lo: int, hi: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be a whole number, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        bound = f">= {lo:,}" if hi is None else f"in [{lo:,}, {hi:,}]"
        raise ConfigError(f"{name} must be {bound}, got {value:,}")


def _check_positive(name: str, value, hi: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a number > 0, got {value!r}")
    if hi is not None and value > hi:
        raise ConfigError(f"{name} must be at most {hi:g}, got {value!r}")


def _is_hashed_log_name(name: str) -> bool:
    lower = name.lower()
    return lower.endswith(".jsonl") or lower.endswith(".jsonl.gz")


def is_request_log_name(name: str) -> bool:
    """Whether a workload file is a request log (CSV, or JSON lines with hash ids), which takes LogOptions."""
    return _is_csv_log_name(name) or _is_hashed_log_name(name)


def _is_csv_log_name(name: str) -> bool:
    lower = name.lower()
    return lower.endswith(".csv") or lower.endswith(".csv.gz")


def _open_bytes(data: bytes, name: str) -> io.TextIOBase:
    if name.lower().endswith(".gz"):
        return io.TextIOWrapper(gzip.GzipFile(fileobj=io.BytesIO(data)), encoding="utf-8-sig", newline="")
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8-sig", newline="")


def _open_log(path: Path, cap: int | None = None) -> io.TextIOBase:
    """The request log as a text stream, once it is known to be a regular file within the size
    cap (``cap``, default :data:`MAX_WORKLOAD_FILE_BYTES`)."""
    raw = open_capped(path, MAX_WORKLOAD_FILE_BYTES if cap is None else cap, "request log")
    if path.name.lower().endswith(".gz"):
        return io.TextIOWrapper(gzip.GzipFile(fileobj=raw), encoding="utf-8-sig", newline="")
    return io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")


_WHOLE = re.compile(r"\s*\d+\s*")


def _whole(where: str, column: str, text: str) -> int:
    if not _WHOLE.fullmatch(text) or int(text) < 1:
        raise ConfigError(f"{where}: {column} must be a whole number >= 1, got {text!r}")
    return int(text)


def _seconds(where: str, text: str) -> float:
    """A TIMESTAMP: seconds as a number, or an ISO date-time (naive ones read as UTC)."""
    try:
        value = float(text)
    except ValueError:
        try:
            moment = datetime.fromisoformat(text.strip())
        except ValueError:
            raise ConfigError(
                f"{where}: TIMESTAMP must be a date-time such as 2023-11-16 18:15:46.68 or a number of seconds, got {text!r}"
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        return moment.timestamp()
    if not math.isfinite(value):
        raise ConfigError(f"{where}: TIMESTAMP must be a finite number of seconds, got {text!r}")
    return value


def _csv_log_rows(stream: io.TextIOBase, name: str, start: int = 0) -> Iterator[LogRow]:
    """Stream the rows of a CSV request log after the first ``start`` (those are not parsed). The
    header names the columns (any order, extra columns ignored). Raises ConfigError naming the
    row and the column of the first bad value."""
    row = 0
    with stream:
        try:
            reader = csv.reader(stream)
            header = next((h for h in reader if any(c.strip() for c in h)), None)
            if header is None:
                raise ConfigError(f"{name}: the request log is empty (expected a header {','.join(LOG_COLUMNS)})")
            names = [h.strip() for h in header]
            missing = [c for c in LOG_COLUMNS if c not in names]
            if missing:
                raise ConfigError(
                    f"{name}: missing column(s) {', '.join(missing)} in the header (a request log needs {', '.join(LOG_COLUMNS)})"
                )
            cols = [names.index(c) for c in LOG_COLUMNS]
            width = max(cols) + 1
            for fields_ in reader:
                if not any(f.strip() for f in fields_):
                    continue  # blank line
                row += 1
                if row > MAX_LOG_ROWS:
                    raise ConfigError(f"{name}: more than {MAX_LOG_ROWS:,} rows; use a shorter request log")
                if row <= start:
                    continue
                where = f"{name} row {row}"
                if len(fields_) < width:
                    lacking = [c for c, i in zip(LOG_COLUMNS, cols) if i >= len(fields_)]
                    raise ConfigError(f"{where}: no value for {', '.join(lacking)}")
                t, p, a = (fields_[i] for i in cols)
                yield LogRow(row, _seconds(where, t), _whole(where, "ContextTokens", p), _whole(where, "GeneratedTokens", a))
        except csv.Error as exc:
            raise ConfigError(f"{name}: not a readable CSV after row {row}: {exc}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{name}: not UTF-8 text ({exc.reason})") from None
        except (OSError, EOFError) as exc:  # a truncated or corrupt gzip stream
            raise ConfigError(f"{name}: cannot read the request log: {exc}") from None


def read_log_rows(path, start: int = 0, count: int | None = None) -> list[LogRow]:
    """Rows of a CSV request log after the first ``start``: ``count`` of them (None: all, at most
    :data:`MAX_BUILT_LOG_REQUESTS`). For callers that need the lengths themselves (the real-model
    replay of :mod:`pagedkv_core.workloads.log_prompts`)."""
    path = Path(path)
    rows: list[LogRow] = []
    limit = MAX_BUILT_LOG_REQUESTS if count is None else count
    for r in _csv_log_rows(_open_log(path), path.name, start):
        if len(rows) == limit:  # only without a count
            raise ConfigError(f"{path.name}: more than {MAX_BUILT_LOG_REQUESTS:,} rows after row {start:,}: give a row count")
        rows.append(r)
        if len(rows) == count:
            break
    if not rows:
        raise ConfigError(f"{path.name}: no requests after row {start:,}")
    return rows


def request_log_workload(path, seed: int = 0, options: LogOptions | None = None, *, name: str | None = None,
                   description: str | None = None) -> Workload:
    """A CSV request log as a workload (see :class:`LogOptions`); prompts are seeded random tokens
    of each row's ContextTokens. Reads the file as a stream and stops after the last request used."""
    path = Path(path)
    options = options or LogOptions()
    return _log_from_rows(_csv_log_rows(_open_log(path), path.name, options.start), path.name, seed, options,
                            name=name, description=description)


@dataclass
class LogWindow:
    """The requests a request log's options keep (:func:`select_window`): ``kept`` holds
    (row, prompt_len, output_len, max_tokens) in file order, ``steps`` each one's arrival step."""

    kept: list[tuple]
    steps: list[int]
    left_out: int  # longer than the context, with max_tokens "context", left out ("leave-out")
    last: int  # where the last row read stands in the file (its row or line)
    context: int
    cap: int | None  # max_tokens when it is a number of tokens
    over: int = 0  # longer than the context, with max_tokens "context", served ("serve"): cut or rejected


def select_window(rows: Iterable, file_name: str, opt: LogOptions, *, where: str, prompt_len,
                  limit: int | None) -> LogWindow:
    """The window of a request log (a CSV log's rows, a hashed log's lines) that ``opt`` asks
    for: from ``opt.start``, ``opt.count`` requests (at most ``limit`` without a count: one more
    is an error), each with its prompt (``prompt_len(row)``, scaled), answer and ``max_tokens``,
    and its arrival step from the first kept request's time. ``where``: "row" (``row.row``) or
    "line" (``row.line``), how an error names a position."""
    mode = opt.max_tokens
    context = opt.scaled(opt.max_context)
    cap = opt.scaled(mode) if isinstance(mode, int) else None
    after, fewer = ("row", "rows") if where == "row" else ("request", "requests")
    kept: list[tuple] = []
    left_out = over = 0
    last = opt.start
    for r in rows:
        if limit is not None and len(kept) == limit:  # only without a count: one more means too many
            raise ConfigError(f"{file_name}: more than {limit:,} requests after {after} {opt.start:,}: "
                              f"give a count of at most {limit:,}")
        last = getattr(r, where)
        one = _kept(r, prompt_len(r), opt.scaled(r.answer_len), mode, context, cap, opt.overlong)
        if one is None:
            left_out += 1
            continue
        over += mode == "context" and one[1] + one[2] > context
        kept.append(one)
        if len(kept) == opt.count:
            break  # the rows after the window are never read
    if not kept:
        why = f" ({left_out:,} left out: longer than the {context:,}-token context)" if left_out else ""
        raise ConfigError(f"{file_name}: no requests after {after} {opt.start:,}{why}")
    t0 = min(r.time_s for r, *_ in kept)
    per_step = opt.seconds_per_step / opt.rate
    steps = []
    for r, *_ in kept:
        at = (r.time_s - t0) / per_step
        if not at <= MAX_ARRIVAL_STEP:  # NaN and infinity too (1e308 - -1e308)
            raise ConfigError(f"{file_name} {where} {getattr(r, where)}: arrives at step {at:,.0f}, beyond "
                              f"{MAX_ARRIVAL_STEP:,}; use more seconds per step or fewer {fewer}")
        steps.append(int(at))
    return LogWindow(kept, steps, left_out, last, context, cap, over)


def _kept(r, prompt: int, answer: int, mode, context: int, cap: int | None, overlong: str = "serve") -> tuple | None:
    """(row, prompt, answer, max_tokens) of a request-log row under ``max_tokens`` mode ``mode``;
    None: left out (longer than the context, in "context" mode, with ``overlong`` "leave-out").
    Served, such a row's max_tokens is what the context leaves (below 1 when the prompt fills it:
    :func:`_row_problem` rejects it)."""
    if mode == "context":
        return None if prompt + answer > context and overlong == "leave-out" else (r, prompt, answer, context - prompt)
    if mode == "answer":
        return (r, prompt, answer, answer)
    return (r, prompt, min(answer, cap), cap)


# ---------------------------------------------------------------------------- streamed request logs
def stream_log(open_rows, file_name: str, opt: LogOptions, *, where: str, prompt_len, make_request,
               hash_block: int | None = None, label: str = "rows") -> LogStream | None:
    """A request log as a :class:`LogStream`: one pass checks every row of the window (values,
    arrival steps, at most :data:`MAX_LOG_REQUESTS` requests) holding nothing, and finds the
    first arrival; the stream then reads the file again as the engine pulls. ``open_rows()``
    opens the rows afresh; ``make_request(row, prompt, answer, max_tokens, step)`` builds one
    request (a row over a request-level bound is its rejection). Returns None when the rows are
    not in time order (the caller then builds the log whole, as before)."""
    mode = opt.max_tokens
    context = opt.scaled(opt.max_context)
    cap = opt.scaled(mode) if isinstance(mode, int) else None
    after = "row" if where == "row" else "request"
    n = left_out = over = 0
    first = last = None
    t0 = prev = None
    per_step = opt.seconds_per_step / opt.rate
    for r in open_rows():
        if n == MAX_LOG_REQUESTS and opt.count is None:
            raise ConfigError(f"{file_name}: more than {MAX_LOG_REQUESTS:,} requests after {after} {opt.start:,}: "
                              f"give a count of at most {MAX_LOG_REQUESTS:,}")
        last = getattr(r, where)
        one = _kept(r, prompt_len(r), opt.scaled(r.answer_len), mode, context, cap, opt.overlong)
        if one is None:
            left_out += 1
            continue
        over += mode == "context" and one[1] + one[2] > context
        if prev is not None and r.time_s < prev:
            return None
        if t0 is None:
            t0, first = r.time_s, last
        prev = r.time_s
        at = (r.time_s - t0) / per_step
        if not at <= MAX_ARRIVAL_STEP:
            raise ConfigError(f"{file_name} {where} {last}: arrives at step {at:,.0f}, beyond "
                              f"{MAX_ARRIVAL_STEP:,}; use more seconds per step or fewer {label}")
        n += 1
        if n == opt.count:
            break
    if not n:
        why = f" ({left_out:,} left out: longer than the {context:,}-token context)" if left_out else ""
        raise ConfigError(f"{file_name}: no requests after {after} {opt.start:,}{why}")

    def requests() -> Iterator[WorkloadRequest]:
        taken = 0
        for r in open_rows():
            one = _kept(r, prompt_len(r), opt.scaled(r.answer_len), mode, context, cap, opt.overlong)
            if one is None:
                continue
            _r, prompt, answer, max_tokens = one
            yield make_request(r, prompt, answer, max_tokens, int((r.time_s - t0) / per_step))
            taken += 1
            if taken == n:
                return

    description = _log_description(file_name, opt, n, first, last, left_out, context, cap, over)
    return LogStream(file_name, description, n, opt.pool_slots, hash_block, requests, left_out_of(left_out, context))


def _csv_request(seed: int):
    def make(r: LogRow, prompt: int, answer: int, max_tokens: int, step: int) -> WorkloadRequest:
        problem = _row_problem(prompt, answer, max_tokens)
        if problem is not None:
            return WorkloadRequest(f"r{r.row}", (), 1, 1, arrival_step=step, reject_reason=problem)
        rng = np.random.default_rng([seed, r.row])
        return WorkloadRequest(f"r{r.row}", _tokens(rng, prompt), answer, max_tokens, arrival_step=step)
    return make


def stream_workload_file(path, seed: int = 0, **options) -> LogStream | Workload:
    """A workload file for a run that streams: a request log (``.csv``, ``.jsonl``, gzipped
    too) as a :class:`LogStream` of up to :data:`MAX_LOG_REQUESTS` requests, read while the run
    goes, with the same requests :func:`load_workload_file` builds; a JSON workload, or a log
    whose rows are not in time order (at most :data:`MAX_BUILT_LOG_REQUESTS` then), as a whole
    :class:`Workload`. Raises ConfigError."""
    path = Path(path)
    if _is_hashed_log_name(path.name):
        from .hashed_log import stream_hashed_log

        return stream_hashed_log(path, seed, **options) or load_workload_file(path, seed, **options)
    if not _is_csv_log_name(path.name):
        return load_workload_file(path, seed, **options)
    opt = LogOptions.of(**options)
    stream = stream_log(lambda: _csv_log_rows(_open_log(path, MAX_STREAMED_LOG_BYTES), path.name, opt.start),
                        path.name, opt, where="row", prompt_len=lambda r: opt.scaled(r.prompt_len),
                        make_request=_csv_request(seed))
    return stream if stream is not None else request_log_workload(path, seed, opt)


def _log_from_rows(rows: Iterable[LogRow], file_name: str, seed: int, opt: LogOptions, *,
                     name: str | None = None, description: str | None = None) -> Workload:
    w = select_window(rows, file_name, opt, where="row", prompt_len=lambda r: opt.scaled(r.prompt_len),
                      limit=MAX_BUILT_LOG_REQUESTS if opt.count is None else opt.count)
    kept, steps = w.kept, w.steps
    problems = [_row_problem(prompt, answer, max_tokens) for _r, prompt, answer, max_tokens in kept]
    _check_total_tokens(file_name, sum(k[1] for k, p in zip(kept, problems) if p is None),
                        "use fewer rows (count) or a length_scale below 1")
    make = _csv_request(seed)
    reqs = [make(r, prompt, answer, max_tokens, step) for (r, prompt, answer, max_tokens), step in zip(kept, steps)]
    if description is None:
        description = _log_description(file_name, opt, len(kept), kept[0][0].row, w.last, w.left_out, w.context, w.cap,
                                         w.over)
    return Workload(name or file_name, description, tuple(reqs), opt.pool_slots,
                    left_out=left_out_of(w.left_out, w.context))


def _row_problem(prompt: int, answer: int, max_tokens: int) -> str | None:
    """Why a request-log row's request is rejected (its prompt fills the context: ``max_tokens``
    below 1; or its lengths over the request-level bounds), or None."""
    if max_tokens < 1:
        return f"prompt of {prompt:,} tokens leaves no room for an answer in the {prompt + max_tokens:,}-token context"
    answer = max(answer, max_tokens)
    if prompt > MAX_PROMPT_LEN:
        return f"prompt of {prompt:,} tokens is longer than the {MAX_PROMPT_LEN:,} allowed"
    if answer > MAX_OUTPUT_LEN:
        return f"answer of {answer:,} tokens is longer than the {MAX_OUTPUT_LEN:,} allowed"
    return None


def _log_description(file_name: str, opt: LogOptions, n: int, first: int, last: int, left_out: int,
                       context: int, cap: int | None, over: int = 0) -> str:
    parts = [f"{n:,} requests from rows {first:,}-{last:,} of {file_name}"]
    if left_out:
        parts.append(f"{left_out:,} left out (longer than the {context:,}-token context)")
    if over:
        parts.append(f"{over:,} longer than the {context:,}-token context (cut at it; rejected where the prompt "
                     f"alone fills it)")
    if opt.length_scale != 1:
        parts.append(f"lengths x {opt.length_scale:g}")
    step_ms = opt.seconds_per_step / opt.rate * 1000
    parts.append(f"1 step = {step_ms:g} ms of the log's time")
    if opt.max_tokens == "context":
        parts.append(f"max_tokens = the {context:,}-token context minus the prompt")
    elif opt.max_tokens == "answer":
        parts.append("max_tokens = the answer's length")
    else:
        parts.append(f"max_tokens = {cap:,}")
    return "; ".join(parts)


# ---------------------------------------------------------------------------- the registry
# The Azure request-log scenarios: real prompt and answer lengths at their recorded arrival times (the
# prompts' token ids are seeded random: the log publishes sizes only, so nothing is shared).
# At 50 ms a step the full-size window keeps ~50 requests running on the paged pool, and more
# waiting than reserve-the-maximum can run. The small one scales every length by 1/8 and the
# step to 400 ms (a request lives 1/8 as many steps, so the same time per request), into a pool
# small enough for the app's heatmaps; it is busier than the full one (the paged side preempts).
# Both are windows of the requests that fit the context (the longer rows are left out and counted).
AZURE_CONV_OPTIONS = dict(count=1000, max_tokens="context", max_context=DEFAULT_MAX_CONTEXT,
                          seconds_per_step=DEFAULT_SECONDS_PER_STEP, pool_slots=LOG_POOL_SLOTS, overlong="leave-out")
AZURE_CONV_SMALL_OPTIONS = dict(count=200, max_tokens="context", max_context=DEFAULT_MAX_CONTEXT,
                                length_scale=1 / 8, seconds_per_step=8 * DEFAULT_SECONDS_PER_STEP, pool_slots=4096,
                                overlong="leave-out")


def _azure_scenario(name: str, title: str, options: dict, seed: int) -> Workload:
    opt = LogOptions(**options)
    w = _log_from_rows(_shipped_rows(opt.start), AZURE_CONV_LOG.name, seed, opt)
    return Workload(name, f"{title}: {w.description}. Data: {AZURE_SOURCE}", w.requests, w.pool_slots,
                    left_out=w.left_out)


def azure_conv(seed: int = 0) -> Workload:
    return _azure_scenario("azure-conv", "Azure's production conversation log", AZURE_CONV_OPTIONS, seed)


def azure_conv_small(seed: int = 0) -> Workload:
    return _azure_scenario("azure-conv-small", "Azure's production conversation log at 1/8 scale",
                           AZURE_CONV_SMALL_OPTIONS, seed)


@lru_cache(maxsize=4)
def _shipped_rows(start: int) -> tuple[LogRow, ...]:
    """The shipped request log's rows after ``start``, parsed once per process (the app builds the
    scenarios for its labels)."""
    return tuple(_csv_log_rows(_open_log(AZURE_CONV_LOG), AZURE_CONV_LOG.name, start))


WORKLOADS = {
    "explainer40": explainer40,
    "shared_preamble": shared_preamble,
    "burst": burst,
    "trickle": trickle,
    "azure-conv": azure_conv,
    "azure-conv-small": azure_conv_small,
}


@lru_cache(maxsize=None)
def workload_description(name: str) -> str:
    """A built-in workload's description (built once: the request-log scenarios take ~0.1 s to build)."""
    return build_workload(name).description


def build_workload(name: str, seed: int = 0) -> Workload:
    if name not in WORKLOADS:
        raise ConfigError(f"unknown workload {name!r}: use one of {', '.join(WORKLOADS)}")
    return WORKLOADS[name](seed)
