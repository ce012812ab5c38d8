"""Request logs that carry prefix hashes (Mooncake's JSON-lines format: a "hashed log") as workloads.

One request a line: ``{"timestamp": ms since the start, "input_length": prompt tokens,
"output_length": answer tokens, "hash_ids": [...]}`` (other keys are ignored). ``hash_ids`` holds
one id per 512-token block of the prompt, chained: block ``i``'s id stands for that block and
every block before it, so two requests whose first ``k`` ids are equal share their first
``k`` x 512 prompt tokens. The last id may cover a partial block. No text or token ids are
published, so pagedkv makes them from the ids:

- **Token ids from hash ids.** Each hash block's tokens are a fixed function of its id alone
  (:func:`token_runs`): its first two tokens spell the id in base 49,149 (the scripted
  vocabulary past the special tokens); each token ``j`` after them (``j`` >= 2) is splitmix64
  (the mixer of :mod:`pagedkv_core.sources.scripted`) of the id's own splitmix64 plus ``j``,
  modulo 49,149, so all of a request's runs come from a few numpy calls; a request's last,
  partial block takes the first tokens of its id's run. Equal ids give equal runs, so a prefix shared in the log
  is a prefix shared in the engine; distinct ids (below 49,149² ≈ 2.4·10⁹) give runs that differ
  in their first two tokens, so at any block size of two tokens or more the engine's chained
  block hashes match exactly where the log's ids do. At block size 1 two ids that follow the
  same parent share a one-token block when they are equal modulo 49,149 (408 such pairs in the
  shipped log), a token of sharing the log does not have.
- **Scale.** With ``length_scale`` f a hash block is 512·f tokens (f = 1/16: 32), which must be
  a whole number. An engine block size that divides it keeps the sharing exact; one that does
  not would split hash blocks across engine blocks, and is refused (:func:`block_size_problem`).
- **Options** are those of a CSV request log (:class:`~pagedkv_core.workloads.scenarios.LogOptions`:
  which rows, time scale, length scale, what a request may write), read the same way; only the
  default context differs: :data:`DEFAULT_CONTEXT` tokens (every request of the shipped log
  fits it), where a CSV log's is 2,048 (its prompts are short). A bad line is refused with its
  line number and field, under the limits of every workload file (size, rows, requests, tokens).

The shipped log is Mooncake's conversation trace (FAST'25, Apache-2.0; see
``data/mooncake_fast25/``).
"""
from __future__ import annotations

import io
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import chain, islice
from pathlib import Path

import numpy as np

from ..config import MAX_BLOCK_SIZE, ConfigError
from ..safe_io import loads_json
from ..sources.scripted import FIRST_TOKEN, VOCAB_SIZE, splitmix64_array
from .scenarios import (
    DATA_DIR,
    MAX_BUILT_LOG_REQUESTS,
    MAX_LOG_ROWS,
    MAX_STREAMED_LOG_BYTES,
    LogOptions,
    LogStream,
    Workload,
    WorkloadRequest,
    left_out_of,
    _check_total_tokens,
    _open_bytes,
    _open_log,
    _row_problem,
    _log_description,
    select_window,
    stream_log,
)

HASH_BLOCK = 512  # prompt tokens per hash id in the log
DEFAULT_CONTEXT = 131_072  # the context a hashed log's "context" mode assumes (the longest shipped request: 126,195 + 2,000 fits)
MAX_HASH_ID = (1 << 63) - 1
FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
MOONCAKE_DIR = DATA_DIR / "mooncake_fast25"
MOONCAKE_CONV_LOG = MOONCAKE_DIR / "conversation_trace.jsonl"
MOONCAKE_SOURCE = ("Mooncake conversation trace (FAST'25 release, Apache-2.0; Qin et al., \"Mooncake: Trading More "
                   "Storage for Less Computation\", USENIX FAST 2025)")


@dataclass(frozen=True)
class HashedLogRow:
    """One request of a hashed log, as the file states it."""

    line: int  # 1 = the file's first line
    time_s: float  # timestamp, in seconds
    prompt_len: int  # input_length
    answer_len: int  # output_length
    hash_ids: tuple[int, ...]  # one per 512-token block of the prompt


# ---------------------------------------------------------------------------- tokens
def hash_block_tokens(length_scale: float) -> int:
    """Tokens of one hash block at ``length_scale``: 512·f, which must be a whole number >= 1."""
    size = HASH_BLOCK * length_scale
    whole = round(size)
    if whole < 1 or abs(size - whole) > 1e-9:
        raise ConfigError(f"length_scale {length_scale:g} makes a {HASH_BLOCK}-token hash block {size:g} tokens; "
                          f"a hashed log needs a whole number, e.g. length scale 1/16 (32 tokens) or 1/8 (64)")
    return whole


_BASE = VOCAB_SIZE - FIRST_TOKEN  # token ids a run may use


def token_runs(hash_ids, block_tokens: int) -> np.ndarray:
    """``(len(hash_ids), block_tokens)`` int64: the token ids of each hash block, a function of its
    id alone (the id spelled in two tokens, then splitmix64 of the id's splitmix64 plus the
    position). A run's first ``k`` tokens are the same at every ``block_tokens`` >= ``k``."""
    ids = np.asarray(hash_ids, dtype=np.uint64).reshape(-1, 1)
    out = np.empty((len(ids), block_tokens), dtype=np.int64)
    base = np.uint64(_BASE)
    head = np.hstack([ids % base, ids // base % base]).astype(np.int64) + FIRST_TOKEN
    out[:, :2] = head[:, :block_tokens]
    if block_tokens > 2:
        mixed = splitmix64_array(splitmix64_array(ids) + np.arange(2, block_tokens, dtype=np.uint64))
        out[:, 2:] = (mixed % np.uint64(_BASE)).astype(np.int64) + FIRST_TOKEN
    return out


def token_run(hash_id: int, block_tokens: int) -> tuple[int, ...]:
    """The ``block_tokens`` token ids of hash block ``hash_id`` (:func:`token_runs` of one id)."""
    return tuple(token_runs([hash_id], block_tokens)[0].tolist())


def scaled_prompt_len(row: HashedLogRow, block_tokens: int) -> int:
    """The prompt's length at the scale where a hash block is ``block_tokens``: every block but
    the last in full, the last one's share scaled (rounded, at least one token)."""
    n = len(row.hash_ids)
    tail = row.prompt_len - HASH_BLOCK * (n - 1)
    return (n - 1) * block_tokens + max(1, round(tail * block_tokens / HASH_BLOCK))


def prompt_tokens(hash_ids: Iterable[int], prompt_len: int, block_tokens: int,
                  runs: dict[int, tuple[int, ...]] | None = None) -> tuple[int, ...]:
    """A prompt of ``prompt_len`` tokens: the runs of its hash ids, the last one cut to what is
    left. ``runs`` caches the runs by id (requests that share ids then share the token objects);
    the runs it lacks are made together, by one :func:`token_runs` call."""
    ids = list(hash_ids)[: max(0, -(-prompt_len // block_tokens))]
    if not ids:
        return ()
    runs = {} if runs is None else runs
    missing = [h for h in dict.fromkeys(ids) if h not in runs]
    made = dict(zip(missing, map(tuple, token_runs(missing, block_tokens).tolist()))) if missing else {}
    parts = [made.get(h) or runs[h] for h in ids]
    runs.update(made)  # a bounded cache (_RecentRuns) drops its oldest after
    parts[-1] = parts[-1][: prompt_len - (len(ids) - 1) * block_tokens]
    return parts[0] if len(parts) == 1 else tuple(chain.from_iterable(parts))


def dividing_block_sizes(block_tokens: int) -> list[int]:
    return [b for b in range(1, min(block_tokens, MAX_BLOCK_SIZE) + 1) if block_tokens % b == 0]


def block_size_problem(block_tokens: int, block_size: int) -> str | None:
    """Why an engine block size cannot replay a hashed log whose blocks are ``block_tokens``
    tokens (None: it divides them, and the sharing is exact)."""
    if block_tokens % block_size == 0:
        return None
    sizes = dividing_block_sizes(block_tokens)
    listed = ", ".join(map(str, sizes[:-1])) + f" or {sizes[-1]}" if len(sizes) > 1 else str(sizes[0])
    return (f"block size {block_size} does not divide the log's {block_tokens}-token hash blocks, so its shared "
            f"prefixes would not line up with the engine's blocks; use a block size of {listed}")


# ---------------------------------------------------------------------------- reading
def _int(where: str, obj: dict, key: str, lo: int, hi: int | None = None) -> int:
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi:,}]"
        raise ConfigError(f"{where}: {key} must be a whole number {bound}, got {value!r}")
    return value


def _row(where: str, line: int, text: str) -> HashedLogRow:
    obj = loads_json(text, where, max_depth=3)
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: must be a JSON object with {', '.join(FIELDS)}, got {type(obj).__name__}")
    missing = [k for k in FIELDS if k not in obj]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(map(repr, missing))}")
    t = obj["timestamp"]
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
        raise ConfigError(f"{where}: timestamp must be a number of milliseconds >= 0, got {t!r}")
    prompt = _int(where, obj, "input_length", 1)
    answer = _int(where, obj, "output_length", 1)
    ids = obj["hash_ids"]
    if not isinstance(ids, list):
        raise ConfigError(f"{where}: hash_ids must be a list of whole numbers, got {type(ids).__name__}")
    for h in ids:
        if isinstance(h, bool) or not isinstance(h, int) or h < 0 or h > MAX_HASH_ID:
            raise ConfigError(f"{where}: hash_ids must hold whole numbers in [0, 2^63), got {h!r}")
    need = -(-prompt // HASH_BLOCK)
    if len(ids) != need:
        raise ConfigError(f"{where}: hash_ids has {len(ids):,} ids, but input_length {prompt:,} is {need:,} "
                          f"blocks of {HASH_BLOCK} tokens (one id each)")
    return HashedLogRow(line, t / 1000.0, prompt, answer, tuple(ids))


def hashed_log_rows(stream: io.TextIOBase, name: str, start: int = 0) -> Iterator[HashedLogRow]:
    """Stream the requests of a hashed log after the first ``start`` (those are counted, not
    parsed); blank lines are skipped. Raises ConfigError naming the line and the field."""
    row = 0
    line = 0
    with stream:
        try:
            for line, text in enumerate(stream, 1):
                if not text.strip():
                    continue
                row += 1
                if row > MAX_LOG_ROWS:
                    raise ConfigError(f"{name}: more than {MAX_LOG_ROWS:,} requests; use a shorter request log")
                if row <= start:
                    continue
                yield _row(f"{name} line {line}", line, text)
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{name}: not UTF-8 text after line {line} ({exc.reason})") from None
        except (OSError, EOFError) as exc:  # a truncated or corrupt gzip stream
            raise ConfigError(f"{name}: cannot read the request log: {exc}") from None


def read_hashed_log(path, start: int = 0, count: int | None = None) -> list[HashedLogRow]:
    """The requests of a hashed log file after the first ``start``: ``count`` of them (None: all).
    For callers that need the ids themselves (:mod:`pagedkv_core.workloads.prefix_replay`, the benchmark)."""
    path = Path(path)
    rows = []
    for r in hashed_log_rows(_open_log(path), path.name, start):
        rows.append(r)
        if len(rows) == count:
            break
    if not rows:
        raise ConfigError(f"{path.name}: no requests after request {start:,}")
    return rows


def hashed_log_options(**options) -> LogOptions:
    """LogOptions from keyword options (None = the default), with a hashed log's context."""
    given = {k: v for k, v in options.items() if v is not None}
    return LogOptions.of(**{"max_context": DEFAULT_CONTEXT, **given})


def load_hashed_log(path, seed: int = 0, **options) -> Workload:
    """A hashed log file as a workload (``options``: the fields of LogOptions)."""
    path = Path(path)
    opt = hashed_log_options(**options)
    hash_block_tokens(opt.length_scale)  # before the file is read
    return hashed_log_workload(hashed_log_rows(_open_log(path), path.name, opt.start), path.name, opt)


def hashed_log_from_bytes(data: bytes, name: str, seed: int = 0, **options) -> Workload:
    """The same as :func:`load_hashed_log`, for an upload's bytes (size already checked)."""
    opt = hashed_log_options(**options)
    hash_block_tokens(opt.length_scale)
    return hashed_log_workload(hashed_log_rows(_open_bytes(data, name), name, opt.start), name, opt)


# ---------------------------------------------------------------------------- the workload
def hashed_log_workload(rows: Iterable[HashedLogRow], file_name: str, opt: LogOptions, *, name: str | None = None,
                        description: str | None = None, limits: bool = True) -> Workload:
    """Requests from hashed-log rows under ``opt``; request ``r<line>``'s prompt is made from
    its hash ids (:func:`prompt_tokens`). ``limits``: the bounds of every workload file (at most
    MAX_BUILT_LOG_REQUESTS requests without a count, MAX_WORKLOAD_TOKENS prompt tokens); a trusted
    caller (a benchmark over the whole shipped log) may lift them with False."""
    block = hash_block_tokens(opt.length_scale)
    w = select_window(rows, file_name, opt, where="line", prompt_len=lambda r: scaled_prompt_len(r, block),
                      limit=(MAX_BUILT_LOG_REQUESTS if limits else None) if opt.count is None else opt.count)
    kept, steps = w.kept, w.steps
    problems = [_row_problem(prompt, answer, mt) for _r, prompt, answer, mt in kept]
    if limits:
        _check_total_tokens(file_name, sum(k[1] for k, p in zip(kept, problems) if p is None),
                            "use fewer requests (count) or a length_scale below 1")
    runs: dict[int, tuple[int, ...]] = {}
    reqs = []
    for (r, prompt, answer, mt), step, problem in zip(kept, steps, problems):
        rid = f"r{r.line}"
        if problem is not None:
            reqs.append(WorkloadRequest(rid, (), 1, 1, arrival_step=step, reject_reason=problem))
            continue
        reqs.append(WorkloadRequest(rid, prompt_tokens(r.hash_ids, prompt, block, runs), answer, mt, arrival_step=step))
    if description is None:
        description = _log_description(file_name, opt, len(kept), kept[0][0].line, w.last, w.left_out, w.context,
                                         w.cap, w.over)
        description = description.replace(" rows ", " lines ", 1) + f"; hash blocks of {block} tokens"
    return Workload(name or file_name, description, tuple(reqs), opt.pool_slots, hash_block=block,
                    left_out=left_out_of(w.left_out, w.context))


# ---------------------------------------------------------------------------- streamed
STREAM_RUN_CACHE = 2048  # token runs a streamed log keeps (conversation turns reuse recent ids)


class _RecentRuns(dict):
    """Token runs by hash id, the oldest dropped past :data:`STREAM_RUN_CACHE` (a streamed log
    of any length holds a bounded cache; a dropped run is remade, the same tokens)."""

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        if len(self) > STREAM_RUN_CACHE:
            del self[next(iter(self))]

    def update(self, runs: dict) -> None:
        """Many runs at once, then the oldest dropped past the bound (one pass, not one a run)."""
        super().update(runs)
        for old in list(islice(iter(self), max(0, len(self) - STREAM_RUN_CACHE))):
            del self[old]


def stream_hashed_log(path, seed: int = 0, **options) -> LogStream | None:
    """A hashed log file as a :class:`~pagedkv_core.workloads.scenarios.LogStream` (the same
    requests :func:`load_hashed_log` builds, read while the run goes); None when its lines are
    not in time order."""
    path = Path(path)
    opt = hashed_log_options(**options)
    block = hash_block_tokens(opt.length_scale)
    runs = _RecentRuns()

    def make(r: HashedLogRow, prompt: int, answer: int, mt: int, step: int) -> WorkloadRequest:
        problem = _row_problem(prompt, answer, mt)
        if problem is not None:
            return WorkloadRequest(f"r{r.line}", (), 1, 1, arrival_step=step, reject_reason=problem)
        return WorkloadRequest(f"r{r.line}", prompt_tokens(r.hash_ids, prompt, block, runs), answer, mt, arrival_step=step)

    stream = stream_log(lambda: hashed_log_rows(_open_log(path, MAX_STREAMED_LOG_BYTES), path.name, opt.start),
                        path.name, opt, where="line", prompt_len=lambda r: scaled_prompt_len(r, block),
                        make_request=make, hash_block=block, label="requests")
    if stream is None:
        return None
    description = stream.description.replace(" rows ", " lines ", 1) + f"; hash blocks of {block} tokens"
    return LogStream(stream.name, description, stream.num_requests, stream.pool_slots, block, stream.requests,
                     stream.left_out)
