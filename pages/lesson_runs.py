"""Real-model runs that the teaching pages record step by step, and the scenarios they play.

A :class:`Recording` drives one :class:`~pagedkv_core.engine.Engine` through its public API and
keeps, per step, the snapshot, the wall time of ``engine.step()`` (``time.perf_counter``) and every
sample's output tokens so far. Every number a lesson shows (time to first token, prefill tokens
computed or skipped, bytes swapped, tokens recomputed) is read back from these recordings: measured,
not asserted. The scenario functions take ``make_engine(config)`` so that they run the same with the
real model (the pages) or any other token source; they never allocate anything themselves.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import streamlit as st

from pagedkv_core.config import EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.events import ADMIT, CACHE_HIT, PREEMPT_RECOMPUTE, PREEMPT_SWAP, SWAP_IN, Event
from pagedkv_core.sampling import SamplingParams
from pagedkv_core.snapshot import StepSnapshot

MAX_STEPS = 400  # a lesson run that has not ended by then is cut short

# The system prompt that requests A, B, C and D of the prefix-sharing lesson share (~620 tokens
# with SmolLM2's chat template).
PREAMBLE = """You are Ada, the help-desk assistant of the Riverside Public Library. Follow these rules in every answer.

About the library. The Riverside Public Library has a main building on Elm Street and two branches, one in the Harbour district and one in Northfield. The main building is open from nine in the morning to eight in the evening on weekdays, and from ten to five on Saturdays. It is closed on Sundays and on public holidays. The branches open at ten and close at six, Monday to Saturday. The reading room on the second floor of the main building is a quiet zone: no phone calls, no group work and no food. The children's corner on the ground floor hosts a story hour every Wednesday at four. The makerspace in the basement has two 3D printers, a laser cutter and a sewing machine; members book it online for up to two hours a week after a short safety course.

Membership. Anyone who lives, works or studies in the city can join for free with a photo identity document and a proof of address. Visitors from elsewhere pay twenty dollars a year. A member card lets you borrow up to fifteen items at a time: books, audiobooks, films, board games and museum passes. Children under twelve need a parent or guardian to sign their application. Lost cards cost two dollars to replace.

Loans. Books and audiobooks are lent for three weeks, films and board games for one week, museum passes for three days. A loan can be renewed twice, online or at any desk, unless another member has reserved the item. Overdue books cost ten cents a day, up to a maximum of five dollars per item; children's books never collect fines. Items returned to any branch count as returned on the day they are dropped off. Members can reserve items that are out on loan; we send an email or a text message when a reserved item is ready, and we hold it for seven days.

Digital services. Members can borrow e-books and e-audiobooks through the library app, up to ten at a time, for two weeks each. Wi-Fi is free in every building and needs no password. Public computers can be booked for one hour a day, and printing costs ten cents a page in black and white and fifty cents in colour.

How to answer. Be friendly, brief and concrete: two or three sentences are usually enough. Give opening hours, prices and limits exactly as written above, and never invent a rule, a price or an event that is not listed here. If a question is not about the library, answer it briefly and kindly, then offer help with library services. If you do not know the answer, say so and suggest that the member call the front desk at 555-0142 or ask a librarian in person. Never ask for a member's password or card number. Write in plain English, without lists, headings or emojis, and sign nothing."""


@dataclass(frozen=True)
class RequestInfo:
    request_id: str
    label: str  # what the lesson calls it ("A", "B", ...)
    text: str  # the question, for display
    prompt_ids: tuple[int, ...]
    n: int
    max_tokens: int
    arrival_step: int


@dataclass
class Recording:
    """One engine run, recorded step by step (see the module docstring)."""

    label: str
    config: EngineConfig
    bytes_per_block: int = 0
    snapshots: list[StepSnapshot] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    outputs: list[dict[str, list[list[int]]]] = field(default_factory=list)
    requests: dict[str, RequestInfo] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)  # request id -> reason
    engine: Engine | None = None
    done: bool = False

    # ------------------------------------------------------------------ driving
    def add(self, request_id: str, prompt_ids: list[int], sampling: SamplingParams, *, label: str = "",
            text: str = "", arrival_step: int | None = None) -> None:
        eng = self.engine
        arrival = eng.step_index if arrival_step is None else arrival_step
        eng.add_request(request_id, prompt_ids, sampling, arrival_step=arrival)
        self.requests[request_id] = RequestInfo(request_id, label or request_id, text, tuple(prompt_ids),
                                                sampling.n, sampling.max_tokens, arrival)
        self.done = False

    def step(self) -> StepSnapshot:
        """One ``engine.step()``, timed, with every request's outputs so far."""
        eng = self.engine
        t0 = time.perf_counter()
        outs, snap = eng.step()
        self.wall_s.append(time.perf_counter() - t0)
        for o in outs:
            if o.reject_reason:
                self.rejected[o.request_id] = o.reject_reason
        self.snapshots.append(snap)
        self.outputs.append({rid: [list(ids) for ids in eng.get_request(rid).output_token_ids] for rid in self.requests})
        self.done = not eng.has_unfinished()
        return snap

    def run(self, max_steps: int = MAX_STEPS) -> "Recording":
        while self.engine.has_unfinished() and len(self.snapshots) < max_steps:
            self.step()
        return self

    def release(self) -> "Recording":
        """Drop the engine (and with it the KV pool) of a finished run; the recording stays."""
        self.engine = None
        return self

    # ------------------------------------------------------------------ reading back
    @property
    def request_ids(self) -> list[str]:
        """Request ids by request index (the owner ids in snapshots)."""
        return list(self.requests)

    def at(self, step: int) -> StepSnapshot:
        return self.snapshots[max(0, min(step, len(self.snapshots) - 1))]

    def outputs_at(self, step: int) -> dict[str, list[list[int]]]:
        if not self.outputs:
            return {rid: [[] for _ in range(r.n)] for rid, r in self.requests.items()}
        out = self.outputs[max(0, min(step, len(self.outputs) - 1))]
        return {rid: out.get(rid, [[] for _ in range(r.n)]) for rid, r in self.requests.items()}

    def events(self, *kinds: str, upto: int | None = None) -> list[tuple[int, Event]]:
        """(step, event) of the given kinds (all kinds when none given), in order."""
        last = len(self.snapshots) if upto is None else min(upto + 1, len(self.snapshots))
        return [(s.step, e) for s in self.snapshots[:last] for e in s.events if not kinds or e.kind in kinds]

    def first_token_step(self, request_id: str) -> int | None:
        for i, out in enumerate(self.outputs):
            if any(out.get(request_id) or []):
                return i
        return None

    def finish_step(self, request_id: str) -> int | None:
        """The step in which the request's last sample finished (None while it runs)."""
        first = self.first_token_step(request_id)
        if first is None:
            return None
        idx = self.request_ids.index(request_id)
        for i in range(first, len(self.snapshots)):
            if not (self.snapshots[i].seq_request == idx).any():
                return i
        return None

    def ttft_s(self, request_id: str) -> float | None:
        """Measured time to first token: wall time of the steps from the request's arrival to
        the step that sampled its first token, inclusive."""
        first = self.first_token_step(request_id)
        if first is None:
            return None
        return sum(self.wall_s[self.requests[request_id].arrival_step : first + 1])

    def prefill_tokens(self, request_id: str) -> tuple[int, int]:
        """(computed, skipped) prompt tokens at the request's first admission: skipped = the
        tokens whose K/V came from the prefix cache."""
        for _, e in self.events(ADMIT):
            if e.request_id == request_id and not e.detail.get("recompute"):
                cached = int(e.detail.get("cached_tokens", 0))
                return len(self.requests[request_id].prompt_ids) - cached, cached
        return 0, 0

    def cache_hit_blocks(self, request_id: str) -> list[int]:
        for _, e in self.events(CACHE_HIT):
            if e.request_id == request_id:
                return list(e.detail.get("blocks", []))
        return []

    def output_ids(self, request_id: str) -> list[list[int]]:
        return self.outputs_at(len(self.outputs) - 1)[request_id] if self.outputs else []

    # ------------------------------------------------------------------ pressure
    def swap_bytes(self) -> tuple[int, int]:
        """(bytes copied to host, bytes copied back) over the run."""
        out = sum(len(e.detail.get("host_blocks", [])) for _, e in self.events(PREEMPT_SWAP))
        back = sum(len(e.detail.get("host_blocks", [])) for _, e in self.events(SWAP_IN))
        return out * self.bytes_per_block, back * self.bytes_per_block

    def recomputed_tokens(self) -> int:
        """Tokens prefilled again after a recompute preemption (prefix-cache hits excluded)."""
        total = 0
        for step, e in self.events(ADMIT):
            if not e.detail.get("recompute"):
                continue
            snap = self.snapshots[step]
            try:
                computed = int(snap.seq_num_computed[snap.seq_index(e.seq_id)])
            except KeyError:  # finished within the same step: it computed all but its last token
                computed = 0
            total += max(0, computed - int(e.detail.get("cached_tokens", 0)))
        return total

    def preempted_tokens(self) -> int:
        """Tokens whose K/V the preempted sequences had in the pool when they were evicted."""
        total = 0
        for step, e in self.events(PREEMPT_SWAP, PREEMPT_RECOMPUTE):
            if step == 0:
                continue
            before = self.snapshots[step - 1]
            try:
                total += int(before.seq_num_computed[before.seq_index(e.seq_id)])
            except KeyError:
                pass
        return total

    def preemptions(self) -> list[dict]:
        """Every preemption, with the running sequences it was chosen from (the snapshot before)."""
        rows = []
        ids = self.request_ids
        for step, e in self.events(PREEMPT_SWAP, PREEMPT_RECOMPUTE):
            before = self.snapshots[step - 1] if step > 0 else None
            running = []
            if before is not None:
                for sid in before.running:
                    i = before.seq_index(sid)
                    running.append(ids[int(before.seq_request[i])])
            rows.append({
                "step": step,
                "victim": e.request_id,
                "mode": "swap" if e.kind == PREEMPT_SWAP else "recompute",
                "blocks": len(e.detail.get("blocks", [])),
                "running_before": running,
                "reason": e.detail.get("reason", ""),
            })
        return rows


# ---------------------------------------------------------------------------- scenarios
def chat_prompt(tokenizer, question: str, system: str | None = None) -> list[int]:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    enc = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    return [int(t) for t in (enc if isinstance(enc, list) else enc["input_ids"])]


def new_recording(label: str, config: EngineConfig, make_engine: Callable[[EngineConfig], Engine]) -> Recording:
    engine = make_engine(config)
    bpb = 0
    source = engine.source
    if hasattr(source, "bytes_per_block"):
        bpb = int(source.bytes_per_block(config.block_size))
    return Recording(label, config, bytes_per_block=bpb, engine=engine)


# Prefix sharing: A and B share the preamble; C asks for 3 parallel samples; D comes after all
# of them have finished and still finds the preamble cached.
PREFIX_REQUESTS = [
    # (label, question, max_tokens, n, arrival step)
    ("A", "When does the main building open on Saturdays?", 12, 1, 0),
    ("B", "How much does it cost to replace a lost card?", 24, 1, 1),
    ("C", "Suggest a catchy name for the story hour.", 10, 3, 2),  # an odd length: its tail block is partial
]
LATE_REQUEST = ("D", "Can I print in colour?", 8, 1)
PARALLEL_TEMPERATURE = 0.7


def prefix_sharing_run(make_engine, tokenizer, config: EngineConfig, seed: int = 0) -> Recording:
    """Requests A, B, C (n=3, sampled) and then D, all with the same ~620-token preamble."""
    rec = new_recording("prefix sharing", config, make_engine)
    for label, question, max_tokens, n, arrival in PREFIX_REQUESTS:
        sampling = (SamplingParams(max_tokens=max_tokens) if n == 1 else
                    SamplingParams(max_tokens=max_tokens, n=n, temperature=PARALLEL_TEMPERATURE, seed=seed))
        rec.add(label, chat_prompt(tokenizer, question, PREAMBLE), sampling, label=label, text=question,
                arrival_step=arrival)
    rec.run()
    label, question, max_tokens, n = LATE_REQUEST
    rec.add(label, chat_prompt(tokenizer, question, PREAMBLE), SamplingParams(max_tokens=max_tokens), label=label,
            text=question)
    return rec.run().release()


# Under pressure: a load spike on a pool too small for it; greedy, so both modes must agree.
PRESSURE_QUESTIONS = [
    "Explain what a CPU does.",
    "Why is the sky blue?",
    "How do plants make food?",
    "Why do we have seasons?",
    "Describe a cat to someone who has never seen one.",
    "What does a librarian do?",
]
PRESSURE_FIRST = 2  # requests at step 0; the rest arrive together at PRESSURE_SPIKE_STEP
PRESSURE_SPIKE_STEP = 2
PRESSURE_MAX_TOKENS = 32
PRESSURE_POOL_SLOTS = 256


def pressure_run(make_engine, tokenizer, config: EngineConfig, max_tokens: int = PRESSURE_MAX_TOKENS) -> Recording:
    rec = new_recording(config.preemption, config, make_engine)
    for i, q in enumerate(PRESSURE_QUESTIONS):
        arrival = 0 if i < PRESSURE_FIRST else PRESSURE_SPIKE_STEP
        rec.add(f"r{i}", chat_prompt(tokenizer, q), SamplingParams(max_tokens=max_tokens), text=q,
                arrival_step=arrival)
    return rec.run().release()


# Live engine: the guide's fixed requests.
LIVE_GUIDE_QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.",
                        "Name three primary colours."]
LIVE_GUIDE_MAX_TOKENS = 16


# ---------------------------------------------------------------------------- Streamlit side
def model_maker():
    """``make_engine(config)`` on the loaded model (each engine gets its own KV pool; all share
    one copy of the weights), after :func:`pages.common.loaded_model` has shown its progress on
    first use. None (after st.error) when the model cannot load."""
    import copy

    from pages import common

    lm = common.loaded_model()
    if lm is None:
        return None
    path = st.session_state.get("model_path", "") or ""

    def make(config: EngineConfig) -> Engine:
        return Engine(config, copy.copy(common._base_runner(path)))

    make.tokenizer = lm.tokenizer
    return make


def cached(kind: str, config: EngineConfig, *args, spinner: str = "Running SmolLM2…") -> Recording | None:
    """A finished lesson run (``kind``: "prefix", "pressure", "live_guide"), computed once per
    process for each config and kept in ``st.cache_resource``."""
    make = model_maker()
    if make is None:
        return None
    path = st.session_state.get("model_path", "") or ""
    with st.spinner(spinner):
        return _cached_run(kind, config, args, path, make)


def _run_kind(kind: str, config: EngineConfig, args: tuple, make) -> Recording:
    tok = make.tokenizer
    if kind == "prefix":
        return prefix_sharing_run(make, tok, config, *args)
    if kind == "pressure":
        return pressure_run(make, tok, config, *args)
    if kind == "live_guide":
        rec = new_recording("live guide", config, make)
        for i, q in enumerate(LIVE_GUIDE_QUESTIONS):
            rec.add(f"q{i}", chat_prompt(tok, q), SamplingParams(max_tokens=LIVE_GUIDE_MAX_TOKENS), text=q,
                    arrival_step=0)
        return rec.run().release()
    raise ValueError(f"unknown lesson run {kind!r}")


@st.cache_resource(show_spinner=False, max_entries=16)
def _cached_run(kind: str, config: EngineConfig, args: tuple, model_path: str, _make) -> Recording:
    return _run_kind(kind, config, args, _make)
