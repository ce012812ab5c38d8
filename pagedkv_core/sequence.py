"""Requests and the sequences that carry them through the scheduler.

A request with ``n`` parallel samples is carried by one sequence until its prompt is
prefilled; the paged allocator then forks it into ``n`` sequences that share the prompt's
blocks. The contiguous baseline never shares, so there each sample is its own sequence
from the start.

Status machine of a sequence::

    WAITING -> RUNNING -> (SWAPPED | PREEMPTED) -> RUNNING -> ... -> FINISHED

A request that can never run (invalid, or never fits) is rejected before it gets a sequence:
the request carries the reason (``Request.reject_reason``); no sequence is ever REJECTED.
"""
from __future__ import annotations

from enum import IntEnum

from .sampling import SamplingParams

FINISH_STOP = "stop"
FINISH_LENGTH = "length"
FINISH_REJECTED = "rejected"


class SequenceStatus(IntEnum):
    WAITING = 0  # queued for its first admission
    RUNNING = 1  # holds KV slots and is scheduled every step
    SWAPPED = 2  # preempted by swap: its K/V waits in the host pool
    PREEMPTED = 3  # preempted by recompute: waits to be re-prefilled with prompt + outputs
    FINISHED = 4
    REJECTED = 5  # unused by the engine (requests are rejected, not sequences); kept so codes stay stable


STATUS_NAMES = {int(s): s.name.lower() for s in SequenceStatus}


class Sequence:
    """One token stream: the prompt plus the outputs of one sample."""

    __slots__ = (
        "seq_id",
        "request",
        "sample_index",
        "token_ids",
        "num_prompt_tokens",
        "num_computed",
        "status",
        "finish_reason",
        "fork_into",
        "block_hashes",
        "order",
        "stop_at",
        "stop_ids",
    )

    def __init__(self, seq_id: int, request: "Request", sample_index: int, token_ids: list[int], fork_into: int = 1):
        self.seq_id = seq_id
        self.request = request
        self.sample_index = sample_index
        self.token_ids = token_ids
        self.num_prompt_tokens = len(request.prompt_token_ids)
        self.num_computed = 0  # tokens whose K/V is in the pool
        self.status = SequenceStatus.WAITING
        self.finish_reason: str | None = None
        self.fork_into = fork_into  # >1: the prefill samples this many tokens and forks
        self.block_hashes: list[int] = []  # chained hashes of full blocks (prefix cache keys)
        self.order = (request.index, sample_index)  # FCFS order: earlier = higher priority
        # What the scheduler's stop check may skip (Scheduler.new_sequence sets them): below
        # ``stop_at`` tokens no length limit can end the sequence, and only a token in ``stop_ids``
        # can stop it. 0 here: every token is checked in full.
        self.stop_at = 0
        self.stop_ids: frozenset[int] = frozenset()

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def is_finished(self) -> bool:
        return self.status >= SequenceStatus.FINISHED

    def __repr__(self) -> str:
        return (
            f"Sequence(id={self.seq_id}, request={self.request.request_id!r}, sample={self.sample_index}, "
            f"tokens={self.num_tokens}, computed={self.num_computed}, status={self.status.name})"
        )


class Request:
    """What a client submitted, and where its samples stand."""

    __slots__ = (
        "request_id",
        "index",
        "prompt_token_ids",
        "sampling",
        "arrival_step",
        "output_len",
        "extra_keys",
        "seqs",
        "reject_reason",
        "arrived",
    )

    def __init__(
        self,
        request_id: str,
        index: int,
        prompt_token_ids: list[int],
        sampling: SamplingParams,
        arrival_step: int,
        output_len: int | None = None,
        extra_keys: tuple = (),
    ):
        self.request_id = request_id
        self.index = index  # position in submission order; the owner id in snapshots
        self.prompt_token_ids = prompt_token_ids
        self.sampling = sampling
        self.arrival_step = arrival_step
        self.output_len = output_len
        self.extra_keys = extra_keys
        self.seqs: list[Sequence] = []  # seqs[i] is sample i once all samples exist
        self.reject_reason: str | None = None
        self.arrived = False

    # Read access -------------------------------------------------------------------------
    @property
    def n(self) -> int:
        return self.sampling.n

    @property
    def status(self) -> SequenceStatus:
        """REJECTED, FINISHED when every sample is, else the most advanced live status."""
        if self.reject_reason is not None:
            return SequenceStatus.REJECTED
        live = [s.status for s in self.seqs if not s.is_finished]
        if not self.seqs or (not live and len(self.seqs) < self.n):
            return SequenceStatus.WAITING
        if not live:
            return SequenceStatus.FINISHED
        for status in (SequenceStatus.RUNNING, SequenceStatus.SWAPPED, SequenceStatus.PREEMPTED):
            if status in live:
                return status
        return SequenceStatus.WAITING

    @property
    def finished(self) -> bool:
        if self.reject_reason is not None:
            return True
        seqs = self.seqs
        if len(seqs) < self.sampling.n:
            return False
        for s in seqs:
            if s.status < SequenceStatus.FINISHED:
                return False
        return True

    @property
    def finish_reasons(self) -> list[str | None]:
        """Per sample: "stop", "length", "rejected" or None while it runs."""
        if self.reject_reason is not None:
            return [FINISH_REJECTED] * self.n
        reasons: list[str | None] = [None] * self.n
        for s in self.seqs:
            reasons[s.sample_index] = s.finish_reason
        return reasons

    @property
    def finish_reason(self) -> str | None:
        """"rejected"; "length" if any sample hit a length limit; "stop"; None while unfinished."""
        if self.reject_reason is not None:
            return FINISH_REJECTED
        if not self.finished:
            return None
        reasons = self.finish_reasons
        return FINISH_LENGTH if FINISH_LENGTH in reasons else FINISH_STOP

    @property
    def output_token_ids(self) -> list[list[int]]:
        """Output token ids of each of the n samples (empty for a sample not forked yet)."""
        outs: list[list[int]] = [[] for _ in range(self.n)]
        for s in self.seqs:
            outs[s.sample_index] = s.output_token_ids
        return outs

    def __repr__(self) -> str:
        return f"Request(id={self.request_id!r}, prompt={len(self.prompt_token_ids)}, status={self.status.name})"
