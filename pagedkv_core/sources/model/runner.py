"""The real token source: SmolLM2 (or any Llama) over our own paged KV pool.

``ModelRunner`` implements :class:`pagedkv_core.batch.TokenSource`. ``bind`` allocates one K and
one V pool per layer, each a flat ``[num_slots, kv_heads, head_dim]`` tensor (one slot = one
token), plus a host pool of the same layout for swapped-out blocks. Every step the pool is viewed
as ``[num_slots // block_size, block_size, kv_heads, head_dim]`` for the batch's block size, so the
paged allocator (blocks of 16, say) and the contiguous baseline (presented with block size 1) drive
the same memory and the same forward.

``execute`` does what :class:`~pagedkv_core.batch.ScheduledBatch` lists, in order: swap-out
(device -> host, ``kernels.swap_blocks``), swap-in (host -> device), copy-on-write
(``kernels.copy_blocks``), then one forward over every sequence of the step (prefill chunks and
decodes mixed, see :mod:`pagedkv_core.sources.model.llama`) and the sampler.
:meth:`ModelRunner.execute_together` does the same for several runners of one model (engines in
lockstep, :mod:`pagedkv_core.lockstep`) with one forward for all their batches.
"""
from __future__ import annotations

import numbers
import os
import random
import time
from dataclasses import dataclass

import numpy as np
import torch

import kernels

from ...batch import ScheduledBatch, SeqWork
from ...sizing.kv_math import KVShape
from .llama import AttentionMetadata, BatchPart, LlamaModel
from .sampler import Draw, request_seed, sample

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
}
_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``"auto"``/None: CUDA when available, else CPU. Raises ValueError for CUDA without one."""
    name = str(device or "auto").lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but CUDA is not available")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {name!r}: use auto, cpu or cuda")
    return dev


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """None: float32 on CPU, bfloat16 on CUDA."""
    if dtype is None or dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPE_NAMES:
            raise ValueError(f"unsupported dtype {dtype}")
        return dtype
    key = str(dtype).replace("torch.", "").lower()
    if key not in _DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}: use float32, bfloat16 or float16")
    return _DTYPES[key]


def check_threads(threads) -> int:
    """``threads`` as an int in ``[1, os.cpu_count()]``, else a one-line ValueError (torch aborts
    the whole process on an absurd count instead of raising)."""
    cores = os.cpu_count() or 1
    if isinstance(threads, bool) or not isinstance(threads, numbers.Integral) or not 1 <= threads <= cores:
        raise ValueError(f"threads must be an integer in [1, {cores}] (the CPU cores), got {threads!r}")
    return int(threads)


def thread_cap() -> int | None:
    """``OMP_NUM_THREADS`` when it is a whole number of at least 1 (None otherwise): the most
    threads whoever started this process lets torch use. torch takes it as its default; the
    app's split of the cores (:func:`session_threads`) must not raise a forward above it."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) >= 1 else None


def available_cores() -> int:
    """The cores this process may run forwards on: its affinity mask where the OS has one, at
    most :func:`thread_cap` (``OMP_NUM_THREADS=1``: one thread in all, as its setter meant;
    ``make test`` sets it for each of its two workers, which share two cores)."""
    try:
        cores = max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        cores = max(1, os.cpu_count() or 1)
    cap = thread_cap()
    return min(cores, cap) if cap is not None else cores


def session_threads(expected_sessions: int = 1, cores: int | None = None) -> int:
    """Torch threads for one engine when ``expected_sessions`` engines step at the same time: the
    cores split evenly, at least one each (pass it as ``ModelRunner(threads=...)``).

    torch's default is every core, and the count is not shared: each Python thread that runs a
    forward (a Streamlit session, say) gets its own OpenMP team of that many threads, so k
    sessions stepping at once run k x threads. Beyond one thread per core the teams preempt each
    other in the middle of GEMMs and wait at their barriers, and every session slows down far
    more than an even split of the cores would."""
    if (isinstance(expected_sessions, bool) or not isinstance(expected_sessions, numbers.Integral)
            or expected_sessions < 1):
        raise ValueError(f"expected_sessions must be a positive integer, got {expected_sessions!r}")
    return max(1, (cores or available_cores()) // expected_sessions)


@dataclass
class StepInputs:
    """One batch's forward inputs (:meth:`ModelRunner._inputs`): the flattened token ids and
    positions (prefill chunks first, then decodes), the attention metadata, the rows that sample
    and, per sampling row, (its SeqWork, its index among them)."""

    ids: np.ndarray
    positions: np.ndarray
    meta: AttentionMetadata
    sample_rows: np.ndarray
    works: list

    @property
    def num_rows(self) -> int:
        return int(self.ids.shape[0])


@dataclass(frozen=True)
class StepShape:
    """What the last forward computed: its FLOPs follow from these (see ``bench roofline``)."""

    prefill_tokens: int = 0
    decode_seqs: int = 0
    decode_context_tokens: int = 0  # sum of the decoding sequences' context lengths (new token included)
    sampled_rows: int = 0


class ModelRunner:
    """Runs a loaded Llama model over a paged KV pool; a :class:`TokenSource`.

    ``loaded_model``: a :class:`pagedkv_core.sources.model.loader.LoadedModel`, read directly
    (``open_model``: each weight is read from the file as it is copied, and nothing else is held) or
    through transformers (``load_model``). ``device``: "cpu",
    "cuda" or "auto". ``dtype``: None (fp32 on CPU, bf16 on CUDA), or a name / torch dtype.
    ``threads``: torch CPU threads (process-wide) in ``[1, os.cpu_count()]``, None leaves torch's
    default (see :func:`session_threads` for a server with several sessions).
    ``release_source``: free the transformers model's layer weights once copied (the runner then
    owns the only copy; ``loaded_model.model`` becomes None). For a model loaded for this runner
    alone (a model read directly holds no weights to free).
    """

    def __init__(self, loaded_model, device: str | torch.device | None = "cpu", dtype=None, threads: int | None = None,
                 release_source: bool = False):
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        if threads is not None:
            torch.set_num_threads(check_threads(threads))
        self.loaded = loaded_model
        self.tokenizer = getattr(loaded_model, "tokenizer", None)
        checkpoint = getattr(loaded_model, "checkpoint", None)
        if checkpoint is not None:  # read directly (open_model): each weight read from the file as it is copied
            self.config = checkpoint.config
            with torch.no_grad(), checkpoint.tensors() as weight:
                self.model = LlamaModel(checkpoint.config, weight, self.device, self.dtype)
            eos_list = list(checkpoint.eos_token_ids)
        else:
            hf = loaded_model.model
            self.config = hf.config
            with torch.no_grad():
                self.model = LlamaModel.from_transformers(hf, self.device, self.dtype, release_source=release_source)
            eos = getattr(getattr(hf, "generation_config", None), "eos_token_id", None)
            if eos is None:
                eos = getattr(self.config, "eos_token_id", None)
            eos_list = [int(e) for e in eos] if isinstance(eos, (list, tuple)) else ([] if eos is None else [int(eos)])
        self.kv_shape = KVShape.from_config(self.config, name=getattr(loaded_model, "name", None))
        self.max_model_len = int(self.model.max_position)
        self.vocab_size = int(self.model.vocab_size)  # the engine rejects prompt ids at or past it
        self.eos_token_id: int | None = eos_list[0] if eos_list else None
        self.extra_eos_token_ids: tuple[int, ...] = tuple(eos_list[1:])  # more end tokens, for stop_token_ids
        if release_source and checkpoint is None:
            loaded_model.model = None  # its layers are empty now: nobody may run it
        self._salt = random.getrandbits(63)
        self.num_slots = 0
        self.num_host_slots = 0
        self.k_pools: list[torch.Tensor] = []
        self.v_pools: list[torch.Tensor] = []
        self.k_host: list[torch.Tensor] = []
        self.v_host: list[torch.Tensor] = []
        self._pool = self._host = None
        self.last_step_seconds = 0.0
        self.last_step_shape = StepShape()

    # ------------------------------------------------------------------ sizing
    @property
    def dtype_name(self) -> str:
        return _DTYPE_NAMES[self.dtype]

    @property
    def bytes_per_slot(self) -> int:
        """KV bytes of one token: 2 x layers x kv_heads x head_dim x dtype bytes."""
        return self.kv_shape.bytes_per_token(self.dtype_name)

    def bytes_per_block(self, block_size: int) -> int:
        return self.kv_shape.bytes_per_block(block_size, self.dtype_name)

    def slots_for_budget(self, budget_bytes: int, block_size: int = 1) -> int:
        """The most slots (a whole number of blocks) whose K/V fit in ``budget_bytes``."""
        blocks = int(budget_bytes) // self.bytes_per_block(block_size)
        return max(0, blocks) * block_size

    def profile_kv_budget(self, memory_fraction: float = 0.9, max_num_batched_tokens: int = 4096) -> int:
        """CUDA: the bytes left for the KV pool when this process may use ``memory_fraction`` of
        the GPU. A profiling forward of ``max_num_batched_tokens`` prefill tokens (against a tiny
        pool) measures the activation peak; that peak (which includes the weights) and memory
        held by anything else on the GPU are subtracted. CPU: raises (give a budget instead)."""
        if self.device.type != "cuda":
            raise ValueError("profiling the KV budget needs CUDA; give the pool in slots, blocks or bytes")
        if not 0.0 < memory_fraction <= 1.0:
            raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction}")
        saved = (self.num_slots, self.num_host_slots, self._pool, self._host,
                 self.k_pools, self.v_pools, self.k_host, self.v_host)
        from ...sampling import SamplingParams

        n = max(16, int(max_num_batched_tokens))
        block = 16
        chunk = max(1, n // 2)  # one long prefill chunk ...
        decodes = min(256, n - chunk)  # ... plus a batch of decodes: the heaviest step shapes
        chunk_blocks = -(-chunk // block)
        greedy = SamplingParams(max_tokens=1)
        seqs = [SeqWork(seq_id=0, request_id="profile-0", sample_index=0, token_ids=[0] * chunk, start_pos=0,
                        slots=list(range(chunk)), block_table=list(range(chunk_blocks)), num_samples=1,
                        sampling=greedy, num_output_tokens=0)]
        for i in range(decodes):
            b = chunk_blocks + i
            seqs.append(SeqWork(seq_id=i + 1, request_id=f"profile-{i + 1}", sample_index=0, token_ids=[0],
                                start_pos=block - 1, slots=[b * block + block - 1], block_table=[b],
                                num_samples=1, sampling=greedy, num_output_tokens=0))
        batch = ScheduledBatch(step=0, block_size=block, seqs=seqs)
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        try:
            self.bind((chunk_blocks + decodes) * block, 0)
            pool_bytes = self._pool.numel() * self._pool.element_size()
            torch.cuda.reset_peak_memory_stats(self.device)
            self.execute(batch)
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device) - pool_bytes
        finally:
            (self.num_slots, self.num_host_slots, self._pool, self._host,
             self.k_pools, self.v_pools, self.k_host, self.v_host) = saved
            torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(self.device)
        others = max(0, (total - free) - torch.cuda.memory_reserved(self.device))
        return max(0, int(total * memory_fraction) - int(peak) - int(others))

    # ------------------------------------------------------------------ TokenSource
    def bind(self, num_slots: int, num_host_slots: int) -> None:
        """One K and one V pool per layer (flat ``[num_slots, kv_heads, head_dim]``, views of one
        tensor) on the device, and a host pool of ``num_host_slots`` (pinned with CUDA)."""
        num_slots, num_host_slots = int(num_slots), int(num_host_slots)
        if num_slots < 1 or num_host_slots < 0:
            raise ValueError(f"need num_slots >= 1 and num_host_slots >= 0, got {num_slots}, {num_host_slots}")
        L, Hkv, D = self.model.num_layers, self.model.num_kv_heads, self.model.head_dim
        if self._pool is not None and (num_slots, num_host_slots) == (self.num_slots, self.num_host_slots):
            return  # same sizes: keep the buffers (a new engine never reads a slot before writing it)
        self._pool = self._host = None
        self.k_pools = self.v_pools = self.k_host = self.v_host = []
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self._pool = torch.zeros((L, 2, num_slots, Hkv, D), device=self.device, dtype=self.dtype)
        self._host = kernels.alloc_host_cache((L, 2, num_host_slots, Hkv, D), self.dtype,
                                              pin=self.device.type == "cuda")
        self.k_pools = [self._pool[i, 0] for i in range(L)]
        self.v_pools = [self._pool[i, 1] for i in range(L)]
        self.k_host = [self._host[i, 0] for i in range(L)]
        self.v_host = [self._host[i, 1] for i in range(L)]
        self.num_slots, self.num_host_slots = num_slots, num_host_slots

    def execute(self, batch: ScheduledBatch) -> dict[int, list[int]]:
        return ModelRunner.execute_together([(self, batch)])[0]

    @staticmethod
    def execute_together(jobs: list[tuple["ModelRunner", ScheduledBatch]]) -> list[dict[int, list[int]]]:
        """:meth:`execute` for several runners that share one model (engines made from one loaded
        model, each with its own pools), their forwards as one (:meth:`LlamaModel.forward_parts`):
        the weights are read once for all their rows. Each runner's result is what its own
        :meth:`execute` (this, with one job) would return, token for token. Raises ValueError for
        runners of different models."""
        if not jobs:
            return []
        model = jobs[0][0].model
        if any(r.model is not model for r, _ in jobs):
            raise ValueError("execute_together needs runners that share one model")
        t0 = time.perf_counter()
        with torch.inference_mode():
            for runner, batch in jobs:
                if runner._pool is None:
                    raise RuntimeError("ModelRunner.bind(num_slots, num_host_slots) must be called before execute")
                runner._block_ops(batch)
            busy = [(runner, batch) for runner, batch in jobs if batch.seqs]
            answers = []
            if len(busy) == 1:  # one runner's forward (model.forward, its one-part case)
                runner, batch = busy[0]
                answers.append(runner._sample(*runner._forward(batch)))
            elif busy:
                todo = [(runner, runner._inputs(batch)) for runner, batch in busy]
                parts, start, sample_rows = [], 0, []
                for runner, inputs in todo:
                    parts.append(BatchPart(start, start + inputs.num_rows, inputs.meta, runner.k_pools, runner.v_pools))
                    sample_rows.append(inputs.sample_rows + start)
                    start += inputs.num_rows
                dev = model.device
                ids = np.concatenate([inputs.ids for _, inputs in todo])
                pos = np.concatenate([inputs.positions for _, inputs in todo])
                model.ensure_rope(int(pos.max()) + 1)
                logits = model.forward_parts(torch.from_numpy(ids).to(dev), torch.from_numpy(pos).to(dev), parts,
                                             torch.from_numpy(np.concatenate(sample_rows)).to(dev))
                first = 0
                for runner, inputs in todo:  # each part's sampling rows, in order
                    n = int(inputs.sample_rows.shape[0])
                    answers.append(runner._sample(logits[first:first + n], inputs.works))
                    first += n
            answered = iter(answers)
            results = [next(answered) if batch.seqs else {} for _, batch in jobs]
        seconds = time.perf_counter() - t0
        for runner, _ in jobs:
            runner.last_step_seconds = seconds
        return results

    # ------------------------------------------------------------------ pieces
    def block_views(self, pools: list[torch.Tensor], block_size: int) -> list[torch.Tensor]:
        """``[num_blocks, block_size, kv_heads, head_dim]`` views of flat per-layer pools."""
        Hkv, D = self.model.num_kv_heads, self.model.head_dim
        out = []
        for p in pools:
            usable = (p.shape[0] // block_size) * block_size
            out.append(p[:usable].view(-1, block_size, Hkv, D))
        return out

    def _block_ops(self, batch: ScheduledBatch) -> None:
        bs = batch.block_size
        if batch.swap_out or batch.swap_in:
            dev = [v for pair in zip(self.block_views(self.k_pools, bs), self.block_views(self.v_pools, bs)) for v in pair]
            host = [v for pair in zip(self.block_views(self.k_host, bs), self.block_views(self.v_host, bs)) for v in pair]
            if batch.swap_out:
                kernels.swap_blocks(dev, host, batch.swap_out)
            if batch.swap_in:
                kernels.swap_blocks(host, dev, batch.swap_in)
        if batch.copies:
            kernels.copy_blocks(self.block_views(self.k_pools, bs), self.block_views(self.v_pools, bs), batch.copies)

    def _forward(self, batch: ScheduledBatch) -> tuple[torch.Tensor, list[tuple[SeqWork, int]]]:
        """One forward over the batch; returns the logits of the sampling rows and, per row,
        (the SeqWork, its row)."""
        inputs = self._inputs(batch)
        dev = self.device
        sample_rows = torch.from_numpy(inputs.sample_rows).to(dev, non_blocking=True)
        if inputs.num_rows:
            self.model.ensure_rope(int(inputs.positions.max()) + 1)
        logits = self.model.forward(torch.from_numpy(inputs.ids).to(dev, non_blocking=True),
                                    torch.from_numpy(inputs.positions).to(dev, non_blocking=True),
                                    inputs.meta, self.k_pools, self.v_pools, sample_rows)
        return logits, inputs.works

    def _inputs(self, batch: ScheduledBatch) -> "StepInputs":
        """The forward's inputs for ``batch``: token ids, positions, attention metadata (its
        index tensors on the device) and the sampling rows."""
        bs = batch.block_size
        prefill = [s for s in batch.seqs if len(s.token_ids) > 1]
        decode = [s for s in batch.seqs if len(s.token_ids) == 1]
        order = prefill + decode
        lens = np.fromiter((len(s.token_ids) for s in order), dtype=np.int64, count=len(order))
        T = int(lens.sum())
        P = int(lens[: len(prefill)].sum())
        ids = np.empty(T, dtype=np.int64)
        pos = np.empty(T, dtype=np.int64)
        slots = np.empty(T, dtype=np.int64)
        o = 0
        sample_rows, works = [], []
        for s, n in zip(order, lens.tolist()):
            ids[o : o + n] = s.token_ids
            slots[o : o + n] = s.slots
            pos[o : o + n] = np.arange(s.start_pos, s.start_pos + n)
            o += n
            if s.num_samples > 0:
                works.append((s, len(sample_rows)))
                sample_rows.append(o - 1)
        dev = self.device

        def to_dev(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(a).to(dev, non_blocking=True)

        meta = AttentionMetadata(slot_mapping=to_dev(slots), block_size=bs, num_prefill_tokens=P)
        if prefill:
            self._prefill_meta(meta, prefill, lens[: len(prefill)], bs, to_dev)
        if decode:
            ctx = np.fromiter((s.context_len for s in decode), dtype=np.int32, count=len(decode))
            nblk = -(-ctx // bs)
            table = np.zeros((len(decode), int(nblk.max())), dtype=np.int32)
            for i, s in enumerate(decode):
                table[i, : nblk[i]] = s.block_table[: nblk[i]]
            if bs & (bs - 1):  # not a power of two: hand the kernel slot-level tables (block size 1)
                kp = np.arange(int(ctx.max()))
                table = np.where(kp[None, :] < ctx[:, None], table[:, kp // bs] * bs + kp % bs, 0).astype(np.int32)
                meta.decode_block_size = 1
            meta.decode_block_tables = to_dev(table)
            meta.decode_context_lens = to_dev(ctx)
        self.last_step_shape = StepShape(P, len(decode), int(ctx.sum()) if decode else 0, len(sample_rows))
        return StepInputs(ids, pos, meta, np.asarray(sample_rows, dtype=np.int64), works)

    def _prefill_meta(self, meta: AttentionMetadata, prefill: list[SeqWork], lens: np.ndarray, bs: int, to_dev) -> None:
        B = len(prefill)
        if B == 1 and prefill[0].start_pos == 0:
            meta.prefill_simple = True
            return
        Tq = int(lens.max())
        starts = np.fromiter((s.start_pos for s in prefill), dtype=np.int64, count=B)
        ctx = starts + lens
        Tk = int(ctx.max())
        offsets = np.concatenate(([0], np.cumsum(lens)[:-1]))
        qi = np.arange(Tq)[None, :]
        valid_q = qi < lens[:, None]
        q_index = np.where(valid_q, offsets[:, None] + qi, 0).reshape(-1)
        out_index = (np.arange(B)[:, None] * Tq + qi)[valid_q]
        nblk = int(-(-Tk // bs))
        table = np.zeros((B, nblk), dtype=np.int64)
        for b, s in enumerate(prefill):
            need = -(-int(ctx[b]) // bs)
            table[b, :need] = s.block_table[:need]
        kp = np.arange(Tk)
        kv_slots = table[:, kp // bs] * bs + (kp % bs)[None, :]
        kv_slots = np.where(kp[None, :] < ctx[:, None], kv_slots, 0).reshape(-1)
        qpos = starts[:, None] + qi  # [B, Tq]
        mask = (kp[None, None, :] <= qpos[:, :, None]) & (kp[None, None, :] < ctx[:, None, None])
        meta.prefill_q_index = to_dev(q_index.astype(np.int64))
        meta.prefill_out_index = to_dev(out_index.astype(np.int64))
        meta.prefill_kv_slots = to_dev(kv_slots.astype(np.int64))
        meta.prefill_mask = to_dev(mask[:, None, :, :])
        meta.prefill_shape = (B, Tq, Tk)

    def _sample(self, logits: torch.Tensor, works: list[tuple[SeqWork, int]]) -> dict[int, list[int]]:
        draws: list[Draw] = []
        owners: list[int] = []
        for s, row in works:
            seed = s.sampling.seed if s.sampling.seed is not None else request_seed(s.request_id, self._salt)
            k = s.num_samples
            for i in range(k):
                idx = s.sample_index if k == 1 else i
                draws.append(Draw(row, s.sampling, seed, idx, s.num_output_tokens))
                owners.append(s.seq_id)
        tokens = sample(logits, draws)
        out: dict[int, list[int]] = {}
        for sid, t in zip(owners, tokens):
            out.setdefault(sid, []).append(t)
        return out

    def logits(self, batch: ScheduledBatch) -> dict[int, torch.Tensor]:
        """Run ``batch`` (block ops and forward) and return seq_id -> float32 logits of its
        sampling row, without sampling. For tests and inspection."""
        with torch.inference_mode():
            self._block_ops(batch)
            logits, works = self._forward(batch)
        return {s.seq_id: logits[row].to(torch.float32, copy=True) for s, row in works}
