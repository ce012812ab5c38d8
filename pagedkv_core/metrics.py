"""The signals of a healthy serving loop, per step and over a run (names as in vLLM).

- ``kv_usage``: allocated blocks / pool blocks (vLLM ``kv_cache_usage_perc``); for the
  contiguous baseline reserved slots / pool slots. Cached-free blocks count as free.
- ``token_utilization``: slots holding a token's K/V / allocated slots: the figure that
  exposes internal fragmentation (0 when nothing is allocated).
- preemptions (swap and recompute), cumulative and this step.
- ``prefix_cache_hit_rate``: cumulative hit tokens / queried tokens at admission: the prompt
  tokens served from the prefix cache / the prompt tokens of admitted requests, each request
  counted at its first admission; a re-admission after recompute is counted apart
  (``prefix_cache_preempted_*`` in the run summary), as vLLM's ``PrefixCacheStats`` does.
- blocks per sequence: ``mean_blocks_per_seq`` / ``max_blocks_per_seq`` over live sequences
  (the full distribution is ``StepSnapshot.seq_num_blocks``).
- the counts describe one moment, the end of the step: ``num_running`` (sequences running
  then; one that finished in the step is finished, not running), ``num_waiting`` (queued, or
  preempted for recompute), ``num_swapped``, and the cumulative ``num_finished`` and
  ``num_rejected`` (requests). With one sample per request, every request that has arrived
  (``arrival_step <= step``) is in exactly one of them: running + waiting + swapped + finished
  + rejected = requests arrived. A request with ``n`` samples counts once per live sample while
  it runs (after its prefill forks them) and once when finished.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from operator import attrgetter


@dataclass
class StepCounts:
    """What one step did: the scheduler's ``complete()`` returns it, ``totals`` sums them."""

    num_running: int = 0  # sequences running at the end of the step (see StepMetrics)
    preemptions: int = 0  # swap + recompute
    swaps_out: int = 0
    swaps_in: int = 0
    recomputes: int = 0
    tokens: int = 0  # tokens whose K/V the step computed
    prefill_tokens: int = 0
    decode_tokens: int = 0
    tokens_generated: int = 0

    def add(self, other: "StepCounts") -> None:
        for name in _COUNT_NAMES:
            setattr(self, name, getattr(self, name) + getattr(other, name))


_COUNT_NAMES = tuple(f.name for f in fields(StepCounts))


# StepMetrics names (kept as vLLM-style signal names, and as traces store them) -> StepCounts names.
_PER_STEP = {"num_running": "num_running", "step_preemptions": "preemptions", "step_tokens": "tokens",
             "step_prefill_tokens": "prefill_tokens", "step_decode_tokens": "decode_tokens",
             "step_tokens_generated": "tokens_generated"}
_CUMULATIVE = {"num_preemptions": "preemptions", "num_swaps_out": "swaps_out", "num_swaps_in": "swaps_in",
               "num_recomputes": "recomputes", "tokens_generated": "tokens_generated"}
_PER_STEP_OF, _CUMULATIVE_OF = attrgetter(*_PER_STEP.values()), attrgetter(*_CUMULATIVE.values())
_SUMMARY_TOTALS = ("preemptions", "swaps_out", "swaps_in", "recomputes", "tokens_generated")


@dataclass
class StepMetrics:
    kv_usage: float = 0.0
    token_utilization: float = 0.0
    allocated_slots: int = 0
    filled_slots: int = 0
    num_running: int = 0  # sequences running at the end of the step (finished in it: not counted)
    num_waiting: int = 0  # queue lengths at the end of the step
    num_swapped: int = 0
    num_preemptions: int = 0  # cumulative (swap + recompute)
    step_preemptions: int = 0
    num_swaps_out: int = 0  # cumulative
    num_swaps_in: int = 0
    num_recomputes: int = 0
    prefix_cache_hit_rate: float = 0.0  # cumulative
    prefix_hit_tokens: int = 0
    prefix_queried_tokens: int = 0
    step_tokens: int = 0  # tokens whose K/V this step computed
    step_prefill_tokens: int = 0
    step_decode_tokens: int = 0
    step_tokens_generated: int = 0
    tokens_generated: int = 0  # cumulative
    host_used_blocks: int = 0
    fragmented_slots: int = 0  # contiguous: free slots in holes too small for the next reservation
    largest_free_run: int = 0  # contiguous: longest run of free slots
    next_reservation: int = 0  # contiguous: slots the head of the waiting queue needs in one run (0: none waits)
    mean_blocks_per_seq: float = 0.0
    max_blocks_per_seq: int = 0
    num_finished: int = 0  # requests, cumulative
    num_rejected: int = 0
    execute_s: float = 0.0  # wall time of the token source's execute()
    idle_skipped: int = 0  # idle steps after this one passed in the same step() call (Engine(skip_idle=True))

    def to_json(self) -> dict:
        return asdict(self)

    def after_decodes(self, j: int, n: int) -> "StepMetrics":
        """The metrics of the ``j``-th step (from 1) of a decode run after the step these are the
        metrics of: each of its ``n`` running sequences wrote one token's K/V into a slot it held
        already and sampled one token, and nothing else changed. What the engine counts for the
        steps it coalesces (``Engine(coalesce=True)``) and what a trace's run frame stands for;
        the token source's time is 0."""
        filled = self.filled_slots + j * n
        allocated = self.allocated_slots
        return replace(self, filled_slots=filled, token_utilization=filled / allocated if allocated else 0.0,
                       step_preemptions=0, step_tokens=n, step_prefill_tokens=0, step_decode_tokens=n,
                       step_tokens_generated=n, tokens_generated=self.tokens_generated + j * n, execute_s=0.0,
                       idle_skipped=0)

    @classmethod
    def of(cls, step: StepCounts, totals: StepCounts, **rest) -> "StepMetrics":
        """This step's and the run's counts under their metric names, plus the other signals."""
        return cls(**dict(zip(_PER_STEP, _PER_STEP_OF(step))), **dict(zip(_CUMULATIVE, _CUMULATIVE_OF(totals))), **rest)

    @classmethod
    def from_json(cls, data: dict) -> "StepMetrics":
        names = {f.name: f.type for f in fields(cls)}
        unknown = set(data) - set(names)
        if unknown:
            raise ValueError(f"unknown metric field(s): {', '.join(sorted(unknown))}")
        out = cls()
        for key, value in data.items():
            default = getattr(out, key)
            setattr(out, key, float(value) if isinstance(default, float) else int(value))
        return out


@dataclass
class RunStats:
    """Accumulates step metrics into the figures of a run summary."""

    steps: int = 0
    peak_running: int = 0
    sum_running: int = 0
    sum_kv_usage: float = 0.0
    sum_token_utilization: float = 0.0
    utilization_steps: int = 0  # steps with anything allocated
    sum_execute_s: float = 0.0
    last: StepMetrics = field(default_factory=StepMetrics)

    def add(self, m: StepMetrics) -> None:
        self.steps += 1
        self.peak_running = max(self.peak_running, m.num_running)
        self.sum_running += m.num_running
        self.sum_kv_usage += m.kv_usage
        if m.allocated_slots:
            self.sum_token_utilization += m.token_utilization
            self.utilization_steps += 1
        self.sum_execute_s += m.execute_s
        self.last = m

    @property
    def mean_running(self) -> float:
        return self.sum_running / self.steps if self.steps else 0.0

    @property
    def mean_kv_usage(self) -> float:
        return self.sum_kv_usage / self.steps if self.steps else 0.0

    @property
    def mean_token_utilization(self) -> float:
        """Mean over the steps in which anything was allocated."""
        return self.sum_token_utilization / self.utilization_steps if self.utilization_steps else 0.0


@dataclass
class RunSummary:
    """The figures of one run (the ``simulate --json`` object). Build it with :meth:`of`."""

    CONFIG_FIELDS = ("allocator", "block_size", "pool_slots", "preemption", "watermark", "prefix_caching",
                     "eviction")  # from EngineConfig

    allocator: str
    block_size: int
    pool_slots: int
    preemption: str
    watermark: float
    prefix_caching: bool
    eviction: str
    steps: int
    requests: int
    finished: int
    rejected: list[dict]  # [{"id": ..., "reason": ...}]
    preemptions: int
    swaps_out: int
    swaps_in: int
    recomputes: int
    peak_running: int
    mean_running: float
    mean_kv_usage: float
    mean_token_utilization: float
    prefix_cache_hit_rate: float  # prefix_cache_hit_tokens / prefix_cache_queried_tokens
    prefix_cache_hit_tokens: int  # prompt tokens served from the cache at first admissions
    prefix_cache_queried_tokens: int  # prompt tokens of admitted requests, each counted once
    prefix_cache_preempted_hit_tokens: int  # the same for re-admissions after recompute (vLLM counts them apart)
    prefix_cache_preempted_queried_tokens: int
    tokens_generated: int
    mean_execute_s: float

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def of(cls, stats: RunStats, totals: StepCounts, **rest) -> "RunSummary":
        return cls(
            steps=stats.steps,
            peak_running=stats.peak_running,
            mean_running=stats.mean_running,
            mean_kv_usage=stats.mean_kv_usage,
            mean_token_utilization=stats.mean_token_utilization,
            mean_execute_s=stats.sum_execute_s / stats.steps if stats.steps else 0.0,
            **{name: getattr(totals, name) for name in _SUMMARY_TOTALS},
            **rest,
        )
