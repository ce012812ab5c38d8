"""Level-of-detail pool cells and their heatmap: exact counts, owners, bounded payloads, hovers."""
from __future__ import annotations

import base64
import json
import re
from collections import Counter
from functools import lru_cache

import numpy as np
import pytest

from pagedkv_core.config import EngineConfig
from pagedkv_core.engine import Engine
from pagedkv_core.sources.scripted import ScriptedSource
from pagedkv_core.record.slot_state import SlotState
from pagedkv_core.workloads.scenarios import build_workload
from ui.pool_cells import (
    CONTIGUOUS_STATES, GAP_COLUMNS, GRID_COLOR, MAX_GROUPS, NUM_STATES, PAGED_STATES, TEXT_CELLS, cell_codes,
    cell_grid, cell_size, grid_columns, pool_cells, pool_heatmap, snapshot_cells, window_label, zoom_windows,
)

PAYLOAD_LIMIT = 300_000  # bytes of figure JSON per step, at every pool size


# ---------------------------------------------------------------------------------------- states
@lru_cache(maxsize=None)
def engine_snapshot(workload: str, pool_slots: int, allocator: str, steps: int):
    """The engine's snapshot after ``steps`` steps of a built-in workload (scripted tokens)."""
    engine = Engine(EngineConfig(pool_slots=pool_slots, allocator=allocator), ScriptedSource())
    build_workload(workload).submit(engine)
    for _ in range(steps - 1):
        engine.step(snapshot=False)
    _, snap = engine.step()
    return snap, list(engine.requests)


@lru_cache(maxsize=None)
def synthetic_paged(num_slots: int, block_size: int = 16, seed: int = 0):
    """A busy paged pool: requests own scattered whole blocks, the last one part-filled; some cached
    and shared blocks. Returns slot_state, slot_owner (shared between tests: read only)."""
    rng = np.random.default_rng(seed)
    blocks = num_slots // block_size
    state = np.zeros(num_slots, np.int8)
    owner = np.full(num_slots, -1, np.int32)
    perm = rng.permutation(blocks)
    used, request = 0, 0
    while True:
        length = 1 + int(rng.exponential(min(1250, num_slots // 40)))
        need = -(-length // block_size)
        if used + need > blocks * 0.7:
            break
        for j, b in enumerate(perm[used:used + need]):
            fill = block_size if j < need - 1 else length - (need - 1) * block_size
            state[b * block_size:b * block_size + fill] = SlotState.FILLED
            state[b * block_size + fill:(b + 1) * block_size] = SlotState.EMPTY
            owner[b * block_size:(b + 1) * block_size] = request
        used += need
        request += 1
    for b in perm[used:used + blocks // 20]:
        state[b * block_size:(b + 1) * block_size] = SlotState.CACHED
    for b in perm[:blocks // 50]:
        row = state[b * block_size:(b + 1) * block_size]
        row[row == SlotState.FILLED] = SlotState.SHARED
    state.flags.writeable = owner.flags.writeable = False
    return state, owner


def noise(num_slots: int, seed: int = 0, owners: int = 60_000):
    """Every slot a random state and owner: the worst case for owners and payload."""
    rng = np.random.default_rng(seed)
    state = rng.integers(0, NUM_STATES, num_slots).astype(np.int8)
    owner = rng.integers(0, owners, num_slots).astype(np.int32)
    owner[np.isin(state, (SlotState.FREE, SlotState.CACHED, SlotState.FRAGMENT))] = -1
    return state, owner


def brute_force(state, owner, cells):
    """Per-cell counts and top-3 owners by plain Python, for comparison."""
    counts, owners, owner_counts = [], [], []
    for a, b in zip(cells.starts.tolist(), cells.stops.tolist()):
        counts.append(np.bincount(state[a:b], minlength=NUM_STATES).tolist())
        top = sorted(Counter(o for o in owner[a:b].tolist() if o >= 0).items(), key=lambda kv: (-kv[1], kv[0]))[:3]
        owners.append([o for o, _ in top] + [-1] * (3 - len(top)))
        owner_counts.append([c for _, c in top] + [0] * (3 - len(top)))
    return counts, owners, owner_counts


# ---------------------------------------------------------------------------------------- figure JSON
DTYPES = {"i1": np.int8, "u1": np.uint8, "i2": np.int16, "u2": np.uint16, "i4": np.int32, "u4": np.uint32,
          "f4": np.float32, "f8": np.float64}


def decode(value):
    """A plotly JSON array: a base64 typed-array spec, or a plain list."""
    if isinstance(value, dict) and "bdata" in value:
        a = np.frombuffer(base64.b64decode(value["bdata"]), dtype=DTYPES[value["dtype"]])
        return a.reshape([int(s) for s in value["shape"].split(",")]) if "shape" in value else a
    return value


def heatmap_points(fig_json: dict):
    """Yields (trace, x, y) of every heatmap trace, the off-screen padding points left out."""
    width = round(fig_json["layout"]["xaxis"]["range"][1] + 0.5)
    rows = round(fig_json["layout"]["yaxis"]["range"][0] + 0.5)
    for trace in fig_json["data"]:
        if trace["type"] == "heatmap":
            x, y = decode(trace["x"]).astype(int), decode(trace["y"]).astype(int)
            real = (x < width) & (y < rows)
            yield trace, np.flatnonzero(real), x, y, width


def hover_of(fig, cell: int) -> str:
    """The hover text plotly.js would show for ``cell``: its trace's template filled in."""
    data = json.loads(fig.to_json())
    for trace, real, x, y, width in heatmap_points(data):
        hit = real[(x[real] == cell % width) & (y[real] == cell // width)]
        if len(hit):
            p = int(hit[0])
            values = {k: decode(trace[k])[p] for k in ("text", "hovertext") if k in trace}
            custom = decode(trace["customdata"])[p] if "customdata" in trace else None

            def fill(m):
                name, index, fmt = m.group(1), m.group(2), m.group(3)
                v = custom[int(index)] if name == "customdata" else values[name]
                v = v.item() if hasattr(v, "item") else v
                return f"{v:,}" if fmt == ":," else str(v)

            text = re.sub(r"%\{(\w+)(?:\[(\d+)\])?(:,)?\}", fill, trace["hovertemplate"])
            return text.replace("<extra></extra>", "").replace("<b>", "").replace("</b>", "").replace("<br>", "\n")
    raise AssertionError(f"cell {cell} is in no heatmap trace")


# ---------------------------------------------------------------------------------------- cells
@pytest.mark.parametrize("num_slots, block_size, expected", [
    (2048, 16, 1), (16_384, 16, 1), (16_385, 16, 16), (65_536, 16, 16), (262_144, 16, 64),
    (1_048_576, 16, 256), (1_048_576, 1, 256), (1_048_576, 1024, 1024), (100_003, 7, 28),
])
def test_cell_size_is_whole_blocks_in_a_power_of_two(num_slots, block_size, expected):
    spc = cell_size(num_slots, block_size)
    assert spc == expected
    if spc > 1:
        g = spc // block_size
        assert spc % block_size == 0 and g & (g - 1) == 0  # a power of two of whole blocks
        assert -(-num_slots // spc) <= MAX_GROUPS  # few enough cells ...
        assert g == 1 or -(-num_slots // (spc // 2)) > MAX_GROUPS  # ... with the smallest such g


@pytest.mark.parametrize("case", [
    ("explainer40", 2048, "paged", 60), ("explainer40", 2048, "contiguous", 60),
    ("shared_preamble", 2048, "paged", 30), ("azure-conv", 262_144, "paged", 700),
    ("azure-conv", 262_144, "contiguous", 700),
])
def test_counts_equal_bincount_on_engine_states(case):
    snap, _ = engine_snapshot(*case)
    expected = np.bincount(snap.slot_state, minlength=NUM_STATES)
    cells = pool_cells(snap.slot_state, snap.slot_owner, snap.block_size)
    assert cells.per_slot == (snap.num_slots <= 16_384)
    assert cells.state_totals.tolist() == expected.tolist()
    assert cells.counts.sum(axis=1).tolist() == (cells.stops - cells.starts).tolist()
    # The listed owners' slots never exceed the cell's owned slots, and equal them when fewer than 3 are listed.
    owned = np.add.reduceat((snap.slot_owner >= 0).astype(int), cells.starts - cells.lo)
    listed = cells.owner_counts.sum(axis=1)
    assert (listed <= owned).all()
    fewer = (cells.owner_counts > 0).sum(axis=1) < 3
    assert (listed[fewer] == owned[fewer]).all()
    for lo, hi in [(0, 1000), (17, 2000), (snap.num_slots - 777, snap.num_slots)]:
        w = pool_cells(snap.slot_state, snap.slot_owner, snap.block_size, window=(lo, hi))
        assert w.per_slot and w.state_totals.tolist() == np.bincount(snap.slot_state[lo:hi], minlength=NUM_STATES).tolist()


@pytest.mark.parametrize("num_slots, block_size, window", [
    (16_385, 16, None), (262_151, 16, None), (1_048_576, 16, None), (1_048_573, 1, None),
    (1_048_576, 16, (1_000, 800_001)), (300_000, 3, (5, 299_999)),
])
def test_counts_equal_bincount_at_odd_sizes_and_windows(num_slots, block_size, window):
    state, owner = noise(num_slots, seed=num_slots)
    cells = pool_cells(state, owner, block_size, window=window)
    lo, hi = window or (0, num_slots)
    assert not cells.per_slot and (cells.lo, cells.hi) == (lo, hi)
    assert cells.state_totals.tolist() == np.bincount(state[lo:hi], minlength=NUM_STATES).tolist()
    assert cells.starts[0] == lo and cells.stops[-1] == hi and cells.num_cells <= MAX_GROUPS


@pytest.mark.parametrize("layout", ["noise", "blocks"])  # as many runs as slots; runs of whole blocks
@pytest.mark.parametrize("seed", range(4))
def test_cells_match_brute_force(seed, layout):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(700, 1300))  # rarely a multiple of the cell size
    if layout == "noise":
        state, owner = noise(n, seed=seed, owners=int(rng.integers(2, 9)))
    else:
        state, owner = (a[:n] for a in synthetic_paged(2048, 16, seed))
    lo, hi = int(rng.integers(0, 50)), n - int(rng.integers(0, 50))
    cells = pool_cells(state, owner, 4, max_cells=64, max_groups=20, window=(lo, hi))
    assert cells.slots_per_cell == 64 and cells.num_cells == -(-(hi - lo) // 64)
    counts, owners, owner_counts = brute_force(state, owner, cells)
    assert cells.counts.tolist() == counts
    assert cells.owners.tolist() == owners
    assert cells.owner_counts.tolist() == owner_counts


def test_owners_on_a_hand_made_pool():
    F, E, C, S = SlotState.FILLED, SlotState.EMPTY, SlotState.CACHED, SlotState.SHARED
    state = np.array([F, F, F, E, F, F, E, E,      # cell 0: request 5 holds 4, request 2 holds 4
                      S, S, F, F, F, 0, 0, 0,      # cell 1: requests 7 (2), 1 (1), 9 (2), none (3)
                      C, C, C, C, F, F, F, F,      # cell 2: request 3 holds 4, cached 4
                      F, F, F], dtype=np.int8)     # cell 3 (short): request 4 holds 2, request 6 holds 1
    owner = np.array([5, 5, 5, 5, 2, 2, 2, 2,
                      7, 7, 1, 9, 9, -1, -1, -1,
                      -1, -1, -1, -1, 3, 3, 3, 3,
                      6, 4, 4], dtype=np.int32)
    cells = pool_cells(state, owner, 4, max_cells=8, max_groups=4)
    assert cells.slots_per_cell == 8 and cells.blocks_per_cell == 2 and cells.num_cells == 4
    assert cells.starts.tolist() == [0, 8, 16, 24] and cells.stops.tolist() == [8, 16, 24, 27]
    assert cells.owners.tolist() == [[2, 5, -1], [7, 9, 1], [3, -1, -1], [4, 6, -1]]  # ties: lower index first
    assert cells.owner_counts.tolist() == [[4, 4, 0], [2, 2, 1], [4, 0, 0], [2, 1, 0]]
    assert cells.counts.tolist() == [[0, 5, 3, 0, 0, 0], [3, 3, 0, 0, 2, 0], [0, 4, 0, 4, 0, 0], [0, 3, 0, 0, 0, 0]]
    # Colour: holding tokens (filled + shared) wins ties, in the main owner's palette colour.
    assert cell_codes(cells).tolist() == [4 + 2, 4 + 7, 4 + 3, 4 + 4]


def test_per_slot_colours_follow_the_legend():
    state = np.array([0, 1, 2, 3, 4, 5, 1, 4], dtype=np.int8)
    owner = np.array([-1, 3, 3, -1, 18, -1, -1, 40], dtype=np.int32)
    cells = pool_cells(state, owner, 4)
    assert cells.per_slot and cells.owners[:, 0].tolist() == owner.tolist()
    # free 0, empty 1, cached 2, fragment 3, a token of request r: 4 + r % 16
    assert cell_codes(cells).tolist() == [0, 4 + 3, 1, 2, 4 + 18 % 16, 3, 4, 4 + 40 % 16]


def test_aggregate_colour_is_the_majority_state():
    state = np.array([0] * 5 + [2] * 3 + [3] * 6 + [1] * 2 + [5] * 8, dtype=np.int8)
    cells = pool_cells(state, np.full(len(state), -1, np.int32), 8, max_cells=4, max_groups=4)
    assert cells.counts.tolist() == [[5, 0, 3, 0, 0, 0], [0, 2, 0, 6, 0, 0], [0, 0, 0, 0, 0, 8]]
    assert cell_codes(cells).tolist() == [0, 2, 3]  # free, cached, fragment


def test_bad_input_is_one_line_error():
    state, owner = np.zeros(64, np.int8), np.full(64, -1, np.int32)
    with pytest.raises(ValueError, match="window"):
        pool_cells(state, owner, 16, window=(10, 10))
    with pytest.raises(ValueError, match="window"):
        pool_cells(state, owner, 16, window=(0, 65))
    with pytest.raises(ValueError, match="equally long"):
        pool_cells(state, owner[:10], 16)
    with pytest.raises(ValueError, match="codes outside"):
        pool_cells(np.full(64, 9, np.int8), owner, 16)
    with pytest.raises(ValueError, match="block_size"):
        pool_cells(state, owner, 0)


# ---------------------------------------------------------------------------------------- zoom
@pytest.mark.parametrize("num_slots, block_size", [(1_048_576, 16), (262_151, 16), (100_000, 48), (2048, 16)])
def test_zoom_windows_are_block_aligned_and_drawn_slot_by_slot(num_slots, block_size):
    windows = zoom_windows(num_slots, block_size)
    assert windows[0][0] == 0 and windows[-1][1] == num_slots
    assert all(a[1] == b[0] for a, b in zip(windows, windows[1:]))  # they tile the pool
    assert all(lo % block_size == 0 and hi - lo <= 16_384 for lo, hi in windows)
    state, owner = noise(num_slots)
    for w in (windows[0], windows[-1]):
        assert pool_cells(state, owner, block_size, window=w).per_slot
    if num_slots <= 16_384:
        assert windows == [(0, num_slots)]
    assert window_label((16_384, 32_768), 16) == "slots 16,384–32,767 (blocks 1,024–2,047)"
    assert window_label((0, 5)) == "slots 0–4"


# ---------------------------------------------------------------------------------------- figures
def payload(cells, ids, **kw) -> tuple[int, dict]:
    text = pool_heatmap(cells, "pool", ids, **kw).to_json()
    return len(text), json.loads(text)


@pytest.mark.parametrize("make", ["paged", "contiguous", "noise"])
def test_payload_is_bounded_at_a_million_slots(make):
    n = 1 << 20
    if make == "paged":
        state, owner = synthetic_paged(n)
    elif make == "contiguous":
        state, owner = noise(n, owners=900)
        state[state > SlotState.EMPTY] = SlotState.FREE
    else:
        state, owner = noise(n)
    cells = pool_cells(state, owner, 16)
    size, data = payload(cells, [f"r{i}" for i in range(60_000)])
    assert size < PAYLOAD_LIMIT, f"{size:,} bytes"
    covered = []
    for trace, real, x, y, width in heatmap_points(data):
        for key in ("x", "y", "z", "text", "hovertext", "customdata"):
            assert key not in trace or "bdata" in trace[key], f"{key} is not sent as binary"
        covered.append(y[real] * width + x[real])
    covered = np.sort(np.concatenate(covered))
    assert covered.tolist() == list(range(cells.num_cells))  # every cell in exactly one trace


@pytest.mark.parametrize("case", [
    ("explainer40", 2048, "paged", 60), ("trickle", 16_384, "paged", 200),
    ("azure-conv", 262_144, "paged", 700), ("azure-conv", 262_144, "contiguous", 700),
])
def test_payload_is_bounded_on_engine_states(case):
    snap, ids = engine_snapshot(*case)
    cells = pool_cells(snap.slot_state, snap.slot_owner, snap.block_size)
    size, _ = payload(cells, ids, snapshot=snap, token_text=lambda t: f"<tok {t}>")
    assert size < PAYLOAD_LIMIT, f"{size:,} bytes"


@pytest.mark.parametrize("allocator", ["paged", "contiguous"])
def test_payload_is_bounded_slot_by_slot_at_16384_cells(allocator):
    state, owner = noise(1 << 20)
    lo, hi = zoom_windows(1 << 20, 16)[-1]  # the largest slot and block numbers
    cells = pool_cells(state, owner, 16 if allocator == "paged" else 1, window=(lo, hi))
    assert cells.per_slot and cells.num_cells == 16_384
    size, data = payload(cells, [f"r{i}" for i in range(60_000)], token_text=str)
    assert size < PAYLOAD_LIMIT, f"{size:,} bytes"
    assert all("bdata" in t.get("hovertext", {"bdata": 1}) for t in data["data"])  # token ids, not text


def test_aggregate_hover_gives_range_counts_and_owners():
    state, owner = synthetic_paged(1 << 20)
    cells = pool_cells(state, owner, 16)
    fig = pool_heatmap(cells, "pool", [])
    for i in (0, 1234, cells.num_cells - 1):
        a, b = int(cells.starts[i]), int(cells.stops[i])
        lines = hover_of(fig, i).split("\n")
        assert lines[0] == f"slots {a:,}–{b - 1:,} · blocks {a // 16:,}–{(b - 1) // 16:,}"
        counts = np.bincount(state[a:b], minlength=NUM_STATES)
        assert lines[1] == f"free {counts[0]} · filled {counts[1]} · empty {counts[2]} · cached {counts[3]} · shared {counts[4]}"
        top = Counter(o for o in owner[a:b].tolist() if o >= 0).most_common()
        top = sorted(top, key=lambda kv: (-kv[1], kv[0]))[:3]
        assert lines[2] == ("no owner" if not top else
                            "main owners: " + " · ".join(f"request #{o} ({c} slots)" for o, c in top))
    assert "a cell = 256 slots (16 blocks)" in fig.layout.xaxis.title.text


def test_per_slot_hover_names_requests_tokens_and_blocks():
    snap, ids = engine_snapshot("shared_preamble", 2048, "paged", 30)
    words = {t: f"w{t}" for t in range(60_000)}
    cells = pool_cells(snap.slot_state, snap.slot_owner, snap.block_size)
    assert cells.num_cells <= TEXT_CELLS
    fig = pool_heatmap(cells, "pool", ids, token_text=words, snapshot=snap)
    bs = snap.block_size
    seen = set()
    for s in range(snap.num_slots):
        state = SlotState(int(snap.slot_state[s]))
        if state in seen:
            continue
        seen.add(state)
        text = hover_of(fig, s)
        assert f"block {s // bs}, slot {s % bs + 1} of {bs}" in text
        if state in (SlotState.FILLED, SlotState.SHARED, SlotState.EMPTY):
            assert f"request {ids[snap.slot_owner[s]]}" in text
        if state in (SlotState.FILLED, SlotState.SHARED):
            assert f"token 'w{snap.slot_token[s]}'" in text
        if state == SlotState.SHARED:
            assert f"ref count {snap.block_ref[s // bs]}" in text
    assert {SlotState.FREE, SlotState.FILLED, SlotState.EMPTY, SlotState.SHARED} <= seen
    # Shared blocks carry the white dot.
    dots = [t for t in fig.data if t.type == "scattergl"]
    assert len(dots) == 1 and len(dots[0].x) == int((snap.slot_state == SlotState.SHARED).sum())


def test_per_slot_hover_beyond_text_cells_shows_indices_and_token_ids():
    snap, ids = engine_snapshot("trickle", 16_384, "paged", 200)
    cells = pool_cells(snap.slot_state, snap.slot_owner, snap.block_size)
    assert cells.per_slot and cells.num_cells > TEXT_CELLS
    fig = pool_heatmap(cells, "pool", ids, token_text=lambda t: "never shown", snapshot=snap)
    s = int(np.flatnonzero(snap.slot_state == SlotState.FILLED)[0])
    text = hover_of(fig, s)
    assert text == (f"request #{snap.slot_owner[s]}\nblock {s // 16}, slot {s % 16 + 1} of 16\nholds a token\n"
                    f"token {snap.slot_token[s]}")


def test_contiguous_hover_gives_the_reservation():
    snap, ids = engine_snapshot("explainer40", 2048, "contiguous", 60)
    cells = pool_cells(snap.slot_state, snap.slot_owner, snap.block_size)
    fig = pool_heatmap(cells, "pool", ids, snapshot=snap)
    i = int(np.flatnonzero(snap.seq_reserved_start >= 0)[0])
    start, length = int(snap.seq_reserved_start[i]), int(snap.seq_num_blocks[i])
    s = start + length - 1  # the reservation's last slot: allocated, nothing written yet
    text = hover_of(fig, s)
    assert text.startswith(f"request {ids[snap.seq_request[i]]}\n")
    assert f"slot {s:,} · offset {length - 1} of a {length}-slot reservation" in text
    assert "allocated, holding nothing yet" in text


@pytest.mark.parametrize("case", ["per-slot paged, words", "per-slot contiguous", "aggregate", "window", "free"])
def test_the_unvalidated_figure_is_what_validation_makes_of_it(case):
    """pool_heatmap builds its figure as plotly.js reads it, without plotly's validation (the most of
    a frame's figure time): validating the same figure must change nothing that the browser gets."""
    import plotly.graph_objects as go

    from ui.pool_cells import free_pool_heatmap

    if case == "per-slot paged, words":
        snap, ids = engine_snapshot("shared_preamble", 2048, "paged", 30)
        fig = pool_heatmap(pool_cells(snap.slot_state, snap.slot_owner, snap.block_size), "pool", ids,
                           token_text=lambda t: f"<w{t}>", snapshot=snap)
        assert any(t.type == "scattergl" for t in fig.data) and fig.layout.shapes  # the dots and block lines
    elif case == "per-slot contiguous":
        snap, ids = engine_snapshot("explainer40", 2048, "contiguous", 60)
        fig = pool_heatmap(pool_cells(snap.slot_state, snap.slot_owner, 16), "pool", ids, snapshot=snap)
    elif case == "aggregate":
        state, owner = synthetic_paged(1 << 20)
        fig = pool_heatmap(pool_cells(state, owner, 16), "pool", [])
    elif case == "window":
        state, owner = noise(1 << 20)
        fig = pool_heatmap(pool_cells(state, owner, 16, window=zoom_windows(1 << 20, 16)[3]), "pool",
                           [f"r{i}" for i in range(60_000)], token_text=str)
    else:
        fig = free_pool_heatmap(2048, 16, "all free")[0]
    sent = json.loads(fig.to_json())
    assert sent == json.loads(go.Figure(fig.to_dict()).to_json())  # go.Figure(dict) validates every key and value


def test_cell_grid_runs_along_every_boundary_between_cells():
    assert cell_grid(3, 2)["path"] == "M0.5,-0.5V1.5M1.5,-0.5V1.5M-0.5,0.5H2.5"
    assert cell_grid(1, 1)["path"] == ""


@pytest.mark.parametrize("allocator", ["paged", "contiguous"])
def test_cells_are_parted_by_one_grid_path_under_the_block_lines(allocator):
    """The heatmap traces have no gaps (plotly.js then paints a pixel a cell): one white path parts
    the cells, drawn first, so the block boundaries lie over it."""
    snap, ids = engine_snapshot("explainer40", 2048, allocator, 30)
    cells = pool_cells(snap.slot_state, snap.slot_owner, 16)
    width = grid_columns(cells.num_cells, 16)
    rows = -(-cells.num_cells // width)
    assert width <= GAP_COLUMNS
    fig = pool_heatmap(cells, "pool", ids, snapshot=snap)
    assert all(not t.xgap and not t.ygap for t in fig.data if t.type == "heatmap")
    grids = [s for s in fig.layout.shapes if s.line.color == GRID_COLOR]
    assert len(grids) == 1 and fig.layout.shapes[0] is grids[0]
    moves = re.findall(r"M(-?[\d.]+),(-?[\d.]+)([VH])(-?[\d.]+)", grids[0].path)
    assert sorted(float(x) for x, _, d, _ in moves if d == "V") == [c - 0.5 for c in range(1, width)]
    assert sorted(float(y) for _, y, d, _ in moves if d == "H") == [r - 0.5 for r in range(1, rows)]
    assert len(moves) == (width - 1) + (rows - 1)
    assert len(fig.layout.shapes[1:]) == (width // 16 - 1 if allocator == "paged" else 0)  # the block boundaries


@pytest.mark.parametrize("allocator, states", [("paged", PAGED_STATES), ("contiguous", CONTIGUOUS_STATES)])
def test_a_pool_has_the_same_traces_on_the_same_grid_at_every_step(allocator, states):
    """The figure a playing page sends at each step has a layer per state this pool can show,
    present or not, each padded onto the grid of width + 1 by rows + 1: so the browser repaints the
    cells of the traces it drew (ui.live_chart) rather than drawing other traces."""
    engine = Engine(EngineConfig(pool_slots=2048, allocator=allocator), ScriptedSource())
    build_workload("explainer40").submit(engine)
    shapes, seen = set(), set()
    for step in range(1, 121):
        _, snap = engine.step(snapshot=step % 10 == 0)
        if snap is None:
            continue
        cells = snapshot_cells(snap)
        fig = json.loads(pool_heatmap(cells, "pool", [], snapshot=snap).to_json())
        heat = [t for t in fig["data"] if t["type"] == "heatmap"]
        shapes.add(tuple(t["type"] for t in fig["data"]))
        assert len(heat) == len(states)
        width = round(fig["layout"]["xaxis"]["range"][1] + 0.5)
        rows = round(fig["layout"]["yaxis"]["range"][0] + 0.5)
        for t in heat:
            x, y = decode(t["x"]).astype(int), decode(t["y"]).astype(int)
            assert set(x.tolist()) == set(range(width + 1)) and set(y.tolist()) == set(range(rows + 1))
        seen.update(int(v) for v in np.unique(snap.slot_state))
    assert len(shapes) == 1, shapes
    assert len(seen) >= 3, seen  # the run went through steps with different states present


def test_a_grid_too_wide_for_lines_has_none():
    state, owner = synthetic_paged(1 << 20)
    cells = pool_cells(state, owner, 16, window=zoom_windows(1 << 20, 16)[0])
    assert grid_columns(cells.num_cells, 16) > GAP_COLUMNS
    fig = pool_heatmap(cells, "pool", [])
    assert not [s for s in fig.layout.shapes or () if s.line.color == GRID_COLOR]


@pytest.mark.browser
def test_hover_in_a_real_browser(tmp_path):
    """plotly.js itself fills the templates from the binary arrays (column-form heatmaps)."""
    from tests.browser import chromium_page

    state, owner = synthetic_paged(1 << 20)
    cells = pool_cells(state, owner, 16)
    fig = pool_heatmap(cells, "pool", [])
    page_file = tmp_path / "fig.html"
    fig.write_html(page_file, include_plotlyjs=True)
    with chromium_page() as page:
        page.goto(page_file.as_uri())
        page.wait_for_selector(".hm image", timeout=30_000)
        for cell in (0, 1234):
            width = round(fig.layout.xaxis.range[1] + 0.5)
            x, y = page.evaluate("""([c, r]) => { const gd = document.querySelector('.js-plotly-plot');
                const box = gd.querySelector('.nsewdrag').getBoundingClientRect();
                return [box.left + gd._fullLayout.xaxis.l2p(c), box.top + gd._fullLayout.yaxis.l2p(r)]; }""",
                                 [cell % width, cell // width])
            page.mouse.move(x, y)
            page.wait_for_timeout(200)
            shown = page.evaluate("() => document.querySelector('.hoverlayer .hovertext').textContent")
            assert shown == hover_of(fig, cell).replace("\n", "")
