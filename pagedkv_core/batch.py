"""What the scheduler hands to a token source for one step, and the token-source contract.

The scheduler and the allocators never know which token source runs: the real model
(``pagedkv_core.sources.model.runner.ModelRunner``) or the instant scripted one
(``pagedkv_core.sources.scripted.ScriptedSource``). Both implement :class:`TokenSource`.

KV memory is a flat array of *slots* (one slot holds the K and V of one token in every layer).
A paged allocator groups slots into blocks of ``block_size``; slot = block_id * block_size + offset.
The contiguous baseline is presented the same way with ``block_size == 1``: its block table is
then a run of consecutive slot ids, so one attention path serves both allocators.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Protocol

from .sampling import SamplingParams


@dataclass
class SeqWork:
    """One sequence's share of a step."""

    seq_id: int
    request_id: str
    sample_index: int  # which of the request's n samples this sequence is (0 before a fork)
    token_ids: list[int]  # tokens whose K/V this step computes (a prefill chunk, or 1 for decode)
    start_pos: int  # position of token_ids[0] (= tokens whose K/V were already in the pool)
    slots: list[int]  # flat slot for each of token_ids (len(slots) == len(token_ids)); [] for a source that reads none
    block_table: Sequence[int]  # physical block ids covering positions [0, context_len) (a range for contiguous); [] likewise
    num_samples: int  # 0: a prefill chunk that samples nothing; 1: next token; n>1: fork into n
    sampling: SamplingParams
    num_output_tokens: int  # output tokens this sequence already has (the next one is at this index)
    output_len: int | None = None  # scripted sources only: how long the answer is meant to be

    @property
    def context_len(self) -> int:
        """Tokens attended to by the last new token, itself included."""
        return self.start_pos + len(self.token_ids)

    @property
    def is_prefill(self) -> bool:
        return len(self.token_ids) > 1 or self.start_pos == 0


_SEQ_ID, _REQUEST_ID, _SAMPLE_INDEX = map(attrgetter, ("seq_id", "request.request_id", "sample_index"))


@dataclass(slots=True)
class DecodeLane:
    """A step's *plain decodes*: each sequence writes the K/V of its last token at ``slots[i]``,
    a slot it already holds alone (see ``Allocator.decode_slot``), and samples one token. The
    scheduler writes them in one call; a token source that reads the lane (``reads_lane``) gets
    them here, as columns (numpy arrays where the scheduler took them by whole columns, lists
    where it took a small batch one at a time), instead of one :class:`SeqWork` each,
    and answers them in ``tokens`` (one new token each, in the lane's order), not in
    ``execute``'s dict. Read the columns before the step completes (it appends each sequence's
    new token)."""

    seqs: list = field(default_factory=list)  # the scheduler's Sequence objects (sources read the columns)
    slots: Sequence[int] = ()
    at: Sequence[int] = ()  # each one's place among the step's sequences
    num_out: Sequence[int] = ()  # output tokens each has so far
    last: Sequence[int] = ()  # each one's last token (the one written at slots[i])
    tokens: list[int] | None = None  # the source's answer: seqs[i]'s new token is tokens[i] (Python ints)

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def seq_ids(self) -> list[int]:
        return list(map(_SEQ_ID, self.seqs))

    @property
    def request_ids(self) -> list[str]:
        return list(map(_REQUEST_ID, self.seqs))

    @property
    def sample_indices(self) -> list[int]:
        return list(map(_SAMPLE_INDEX, self.seqs))

    @property
    def num_output_tokens(self) -> Sequence[int]:
        """Each one's next token is at this output index."""
        return self.num_out


@dataclass
class ScheduledBatch:
    """Everything a token source must do for one engine step, in this order:
    1. ``swap_out``: copy (device block -> host block) for sequences preempted by swap;
    2. ``swap_in``: copy (host block -> device block) for sequences resumed from the host pool;
    3. ``copies``: copy-on-write (src block -> dst block) within the device pool;
    4. the forward over ``seqs``: write K/V at ``slots``, attend through ``block_table``;
       and over ``lane``, when the source reads one: plain decodes, as columns (``seqs`` then
       holds the other sequences only).
    Block ids in all four are in units of ``block_size`` slots.
    """

    step: int
    block_size: int
    seqs: list[SeqWork] = field(default_factory=list)
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)
    lane: DecodeLane | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.seqs) + (len(self.lane) if self.lane is not None else 0)

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.seqs) + (len(self.lane) if self.lane is not None else 0)


class TokenSource(Protocol):
    """Produces the next token(s) of every sequence in a batch."""

    eos_token_id: int | None  # the scheduler finishes a sequence on it (None: never)
    max_model_len: int  # longest sequence (prompt + output) the source can handle
    vocab_size: int  # prompt token ids must be below it (the engine rejects a request that has one)
    # Optional: ``reads_lane = True`` asks for plain decodes as ``batch.lane`` (columns) rather than
    # one SeqWork each in ``batch.seqs``; a source without it sees every sequence in ``batch.seqs``.
    # ``reads_slots = False`` says it reads no K/V places: its SeqWorks come with ``slots`` and
    # ``block_table`` empty (a source that writes no K/V need not pay for them).

    def bind(self, num_slots: int, num_host_slots: int) -> None:
        """Allocate (or re-allocate) KV storage: ``num_slots`` device slots and
        ``num_host_slots`` host slots for swapped-out blocks. Called once by the engine
        before the first step."""

    def execute(self, batch: ScheduledBatch) -> dict[int, list[int]]:
        """Run one step. Returns seq_id -> new token ids for every SeqWork with
        num_samples > 0 (a list of length num_samples; one per sample, sample i's token
        first-drawn for sample_index i). Sequences with num_samples == 0 are absent. A source
        that reads the lane puts its sequences' tokens in ``batch.lane.tokens``, in its order."""
