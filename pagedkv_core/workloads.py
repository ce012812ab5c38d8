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

A workload file is a JSON list of
``{"id": str, "prompt": [ints] | "prompt_len": int, "output_len": int, "max_tokens": int,
"arrival_step": int = 0, "n": int = 1}``; ``prompt_len`` makes a seeded random prompt.
"""
from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .config import ConfigError
from .sampling import SamplingParams
from .scripted import FIRST_TOKEN, VOCAB_SIZE


@dataclass(frozen=True)
class WorkloadRequest:
    id: str
    prompt: tuple[int, ...]
    output_len: int
    max_tokens: int
    arrival_step: int = 0
    n: int = 1

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "prompt": list(self.prompt),
            "output_len": self.output_len,
            "max_tokens": self.max_tokens,
            "arrival_step": self.arrival_step,
            "n": self.n,
        }


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    requests: tuple[WorkloadRequest, ...]
    pool_slots: int = 2048  # suggested pool size

    def submit(self, engine) -> None:
        """Add every request to ``engine``."""
        for r in self.requests:
            engine.add_request(
                r.id,
                list(r.prompt),
                SamplingParams(max_tokens=r.max_tokens, n=r.n),
                arrival_step=r.arrival_step,
                output_len=r.output_len,
            )


def _tokens(rng: np.random.Generator, n: int) -> tuple[int, ...]:
    return tuple(int(t) for t in rng.integers(FIRST_TOKEN, VOCAB_SIZE, size=n))


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


WORKLOADS = {"explainer40": explainer40, "shared_preamble": shared_preamble, "burst": burst, "trickle": trickle}


def build_workload(name: str, seed: int = 0) -> Workload:
    if name not in WORKLOADS:
        raise ConfigError(f"unknown workload {name!r}: use one of {', '.join(WORKLOADS)}")
    return WORKLOADS[name](seed)


# ---------------------------------------------------------------------------- files
_FIELDS = {"id", "prompt", "prompt_len", "output_len", "max_tokens", "arrival_step", "n"}


def _int_field(where: str, obj: dict, key: str, minimum: int, default: int | None = None) -> int:
    if key not in obj:
        if default is None:
            raise ConfigError(f"{where}: missing {key!r}")
        return default
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: {key} must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{where}: {key} must be >= {minimum}, got {value}")
    return value


def parse_workload(data, name: str = "file", seed: int = 0) -> Workload:
    """Validate a decoded workload (a list of request objects). Raises ConfigError."""
    if not isinstance(data, list):
        raise ConfigError(f"{name}: a workload must be a JSON list of requests, got {type(data).__name__}")
    if not data:
        raise ConfigError(f"{name}: the workload has no requests")
    reqs, seen = [], set()
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
        if "prompt" in obj:
            prompt = obj["prompt"]
            if not isinstance(prompt, list) or not prompt:
                raise ConfigError(f"{where}: prompt must be a non-empty list of token ids")
            for t in prompt:
                if isinstance(t, bool) or not isinstance(t, int) or t < 0:
                    raise ConfigError(f"{where}: prompt token ids must be integers >= 0, got {t!r}")
            prompt = tuple(prompt)
        else:
            prompt_len = _int_field(where, obj, "prompt_len", 1)
            rng = np.random.default_rng([seed, zlib.crc32(rid.encode())])
            prompt = _tokens(rng, prompt_len)
        reqs.append(
            WorkloadRequest(
                rid,
                prompt,
                output_len=_int_field(where, obj, "output_len", 1),
                max_tokens=_int_field(where, obj, "max_tokens", 1),
                arrival_step=_int_field(where, obj, "arrival_step", 0, default=0),
                n=_int_field(where, obj, "n", 1, default=1),
            )
        )
    return Workload(name, f"{len(reqs)} requests from {name}", tuple(reqs))


def load_workload_file(path, seed: int = 0) -> Workload:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read workload file {str(path)!r}: {exc.strerror if isinstance(exc, OSError) else exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"workload file {str(path)!r} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    return parse_workload(data, path.name, seed)
