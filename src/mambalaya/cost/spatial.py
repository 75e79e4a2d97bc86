"""Spatial mapping of each Einsum onto the compute units (the Timeloop-class part of the model).

An Einsum's operations (:mod:`mambalaya.einsum.stats`) run on a unit; how many cycles they take
depends on how its ranks map onto the unit's spatial dimensions, not only on how many there are.
A group runs its Einsums once per step over the step's tile of each fused rank (the rest in
full), so the cycles of an Einsum are summed over the group's steps. Steps come in at most
``2^k`` shapes for ``k`` fused loops (each loop's tile is full or the remainder), so the sum is
a short closed form whatever the number of steps (:func:`step_shapes`).

**The 2D array** runs every contraction it can (:func:`contraction`): a GEMM with a weight,
and a product of two activations that is a matrix product (the SSD's CB, YDG, ST and YO,
attention's scores and value product). Its two sides are the operands of the product's top
multiply: side B the weight (or the right operand), side A the other. It runs in the best of
the design's dataflows (``compute.dataflows``), named by the operand held in the PEs during a
*fold*:

================== ======================= ================================ =================
dataflow           stationary operand       spatial dimensions (rows, cols)  streamed in time
================== ======================= ================================ =================
weight-stationary  weight (side B)          reduced (K) x weight-only (N)    output-only (M)
output-stationary  output                   output-only (M) x weight-only (N) reduced (K)
input-stationary   activation (side A)      reduced (K) x output-only (M)    weight-only (N)
================== ======================= ================================ =================

A product of two activations may hold either side in a weight- or input-stationary array (a
stationary port takes any operand). A dataflow other than the design's first costs
``compute.dataflow_switch_cycles`` per step.

K are the reduced ranks, N the ranks of the output and the weight the activation lacks, M the
ranks of the output and the activation the weight lacks. A spatial mapping puts a product of
some ranks of one role on the rows and of the other role on the columns (or the transpose):
``X_r`` and ``X_c`` are those extents. Every value of the stationary operand's other ranks is a
separate fold, and so is every ``R x C`` piece of ``X_r x X_c``:

    folds = ceil(X_r / R) * ceil(X_c / C) * prod(extents of stationary ranks not on the array)
    T     = prod(extents of the streamed ranks)              (vectors streamed through one fold)

With ``stationary_double_buffered`` (TPU v1, Jouppi et al. ISCA 2017, section 2: the next
weight tile shifts in while the current one computes, and one matrix multiply's wavefront
follows the previous one's) a fold takes ``T`` cycles; loading the stationary tiles is on-chip
traffic (:mod:`mambalaya.cost.traffic`, ``group_buffer_accesses``), and the fill of a fused
group's pipeline is ``compute.pipeline_wind_up_cycles`` per Einsum and step. Without double
buffering each fold loads, fills and drains on its own: ``2r + c + T - 2`` cycles for the ``r``
rows and ``c`` columns it uses (SCALE-Sim's runtime of one fold, Samajdar et al., ISPASS 2020;
the folds split ``X_r`` and ``X_c`` evenly). Either way more PEs never cost cycles. The best
spatial mapping is found by exhaustive search over the rank subsets and the two orientations
(a few dozen candidates). ``spatial_util`` is the fraction of the PEs doing useful MACs while
the folds stream, ``macs / (R * C * folds * T)``.

With ``dataflow: roofline`` the array is an ideal ``macs / (R * C)`` (a GPU's tensor cores,
whose tiling is not an array's).

**The 1D mode** (and a vector unit) spreads the iteration points of an elementwise Einsum, or
of a contraction the array does not run (a dot product, a window, a recurrence), over its
lanes, one operation (a MAC is one) per lane per cycle: a product of some ranks spans the lanes, the rest (always the
generational rank of a recurrence, whose positions depend on each other) are visited in time:

    cycles = ceil(X_lanes / lanes) * prod(other extents) * ops per point / ops per lane per cycle

A reduction over a rank on the lanes is assumed to combine on the array's reduction network at
no extra cycle (MARCA's reduction tree, arXiv 2409.11440 section 4). With ``roofline`` the 1D
mode is ideal (``ops / rate``).

**The MFUs** are a pool that takes one function result every ``cost`` cycles per unit:
``ops * cost / units`` (ideal, a queue in front of the pool).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from mambalaya.einsum.routing import einsum_scale
from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.ir import Einsum, rank_of_variable
from mambalaya.cost.contraction import (
    STATIONARY_ROLES,
    Contraction,
    contraction,
    contractions,
    stationary_options,
)

DATAFLOWS = ("weight-stationary", "output-stationary", "input-stationary", "roofline")
ELEMENTWISE_OPS = ("add", "mul", "div", "max")

_SHORT = {"weight-stationary": "WS", "output-stationary": "OS", "input-stationary": "IS", "roofline": "roofline"}


@dataclass(frozen=True)
class StepShape:
    """``count`` steps whose fused ranks have these extents (a rank absent: untiled)."""

    count: Any  # int, or an array over tilings
    extents: dict[str, Any]


def step_shapes(sizes: dict[str, int], loops: Iterable[tuple[str, Any]]) -> list[StepShape]:
    """The shapes of a group's steps: per fused loop ``(rank, tile)``, the full tiles
    (``size // tile`` of them) and the remainder (one, when ``size % tile``). ``tile`` may be
    an array (every tiling of a search at once)."""
    options: list[list[tuple[Any, str, Any]]] = []
    for rank, tile in loops:
        size = sizes[rank]
        full, rem = size // tile, size % tile
        if isinstance(full, np.ndarray):  # counts over many tilings: float64, so products of trips cannot wrap
            full, rem_steps = full.astype(float), np.where(rem > 0, 1.0, 0.0)
        else:
            rem_steps = int(rem > 0)
        options.append([(full, rank, tile), (rem_steps, rank, rem)])
    shapes = []
    for combo in itertools.product(*options) if options else [()]:
        count: Any = 1
        extents: dict[str, Any] = {}
        for n, rank, ext in combo:
            count = count * n
            extents[rank] = ext
        if isinstance(count, int) and count == 0:
            continue
        if isinstance(count, np.ndarray) and not count.any():
            continue  # a remainder no tiling has (the size is a multiple of every tile)
        shapes.append(StepShape(count, extents))
    return shapes


@dataclass(frozen=True)
class SpatialMapping:
    """How one Einsum's ranks sit on its unit (the best candidate of the search)."""

    unit: str  # "array_2d", "array_1d", "vector", "mfu", "none"
    dataflow: str
    rows: tuple[str, ...] = ()  # ranks across the array's rows (the lanes in 1D)
    cols: tuple[str, ...] = ()
    streamed: tuple[str, ...] = ()  # ranks visited in time within a fold
    reduce_on: str = ""  # "rows", "cols", "time", "lanes" or ""
    spatial_util: float = 1.0
    stationary: tuple[str, ...] = ()  # tensors held in the PEs during a fold (2D)

    @property
    def label(self) -> str:
        def prod(ranks: tuple[str, ...]) -> str:
            return "·".join(ranks) if ranks else "1"

        if self.unit == "array_2d":
            if self.dataflow == "roofline":
                return "2D roofline"
            red = f", reduce on {self.reduce_on}" if self.reduce_on else ""
            held = f"[{'·'.join(self.stationary)}]" if self.stationary else ""
            return f"2D {_SHORT[self.dataflow]}{held} rows={prod(self.rows)} cols={prod(self.cols)} stream={prod(self.streamed)}{red}"
        if self.unit in ("array_1d", "vector"):
            name = "1D" if self.unit == "array_1d" else "vector"
            if self.dataflow == "roofline":
                return f"{name} roofline"
            return f"{name} lanes={prod(self.rows)} time={prod(self.streamed)}"
        if self.unit == "mfu":
            return "MFU pool"
        return "-"


def _subsets(ranks: list[str]) -> list[tuple[str, ...]]:
    return [c for n in range(len(ranks) + 1) for c in itertools.combinations(ranks, n)]


def _extent(shape: StepShape, sizes: dict[str, int], rank: str) -> Any:
    """A rank's extent in a step: a Python int (exact at any size), or over many tilings a
    float64 array (no wrap-around: products of extents can pass int64's range)."""
    ext = shape.extents.get(rank, sizes[rank])
    return ext.astype(float) if isinstance(ext, np.ndarray) else ext


def _prod(shape: StepShape, sizes: dict[str, int], ranks: Iterable[str]) -> Any:
    out: Any = 1
    for r in ranks:
        out = out * _extent(shape, sizes, r)
    return out


def _array_candidates(compute: Any, found: Contraction, sizes: dict[str, int]) -> list[tuple]:
    """(rows, cols, other stationary ranks, streamed ranks, reduce_on, dataflow, stationary
    operand) for every spatial mapping in every allowed dataflow. A rank of one element is left
    out (on the array or not, it changes nothing), so layers that differ in which ranks are 1
    (decode, one group) do not search the same mapping twice. Memoised per dataflows and sizes."""
    key = (compute.dataflows, tuple(found.roles.items()), found.has_weight, tuple(r for r in sizes if sizes[r] == 1))
    hit = _CANDIDATES_MEMO.get(key)
    if hit is not None:
        return hit
    roles = {role: tuple(r for r in ranks if sizes[r] > 1) for role, ranks in found.roles.items()}
    out = []
    for dataflow, side in stationary_options(compute, found):
        a, b, stationary, streamed_roles = STATIONARY_ROLES[side]
        stationary_ranks = [r for role in stationary for r in roles[role]]
        streamed = tuple(r for role in streamed_roles for r in roles[role])
        for sa in _subsets(list(roles[a])):
            for sb in _subsets(list(roles[b])):
                rest = tuple(r for r in stationary_ranks if r not in sa and r not in sb)
                for rows, cols, rows_role in ((sa, sb, a), (sb, sa, b)):
                    reduce_on = "time" if side == "out" else ("rows" if rows_role == "K" else "cols")
                    out.append((rows, cols, rest, streamed, reduce_on, dataflow, side))
    if len(_CANDIDATES_MEMO) > 4096:
        _CANDIDATES_MEMO.clear()
    _CANDIDATES_MEMO[key] = out
    return out


_CANDIDATES_MEMO: dict[tuple, list[tuple]] = {}


def _array_cycles(compute: Any, extents: list[dict[str, Any]], shapes: list[StepShape], cand) -> tuple[Any, Any]:
    """(cycles, folds x T) of one candidate summed over the step shapes (``extents``: each
    shape's extent of every rank). A dataflow other than the design's first pays
    ``compute.dataflow_switch_cycles`` per step (reconfiguring the array to it and back)."""
    rows, cols, rest, streamed, _, dataflow, _ = cand
    r_, c_ = compute.array_rows, compute.array_cols
    cycles: Any = 0
    busy: Any = 0
    switch = compute.dataflow_switch_cycles if dataflow != compute.dataflows[0] else 0.0
    for sh, ext in zip(shapes, extents):
        xr, xc, other, t = (_product(ext, ranks) for ranks in (rows, cols, rest, streamed))
        n_r, n_c = -(-xr // r_), -(-xc // c_)
        folds = n_r * n_c * other
        per_step = folds * t + switch
        if not compute.stationary_double_buffered:
            # each fold loads, fills and drains on its own: 2 r + c - 2 over the rows r and
            # columns c it uses, the folds splitting X_r and X_c evenly (sum of r = X_r)
            per_step = per_step + other * (2 * n_c * xr + n_r * xc - 2 * n_r * n_c)
        cycles = cycles + sh.count * per_step
        busy = busy + sh.count * folds * t
    return cycles, busy


def _product(extents: dict[str, Any], ranks: tuple[str, ...]) -> Any:
    out: Any = 1
    for r in ranks:
        out = out * extents[r]
    return out


def _lane_candidates(cascade: Cascade, einsum: Einsum) -> tuple[list[str], list[tuple[str, ...]]]:
    """The iteration ranks, and the candidate sets of ranks on the lanes: every rank that may
    span them (all but a recurrence's generational rank), or all of those but one. Spreading
    every rank fills the lanes best unless a ceil-division wastes a pass; leaving one rank in
    time is the move that can fix that (leaving more out leaves fewer points for the lanes)."""
    memo = cascade.__dict__.setdefault("_lane_candidates_memo", {})
    if einsum.name not in memo:
        ranks = [rank_of_variable(v) for v in einsum.iteration_variables]
        gen = cascade.generational_rank(einsum)
        spreadable = tuple(r for r in ranks if r != gen)
        candidates = [spreadable] + [tuple(r for r in spreadable if r != out) for out in spreadable if len(spreadable) > 1]
        memo[einsum.name] = (ranks, candidates)
    return memo[einsum.name]


def _fits_one_pass(lanes: int, sizes: dict[str, int], shapes: list[StepShape], ranks: tuple[str, ...]) -> bool:
    return all(bool(np.all(np.asarray(_prod(sh, sizes, ranks)) <= lanes)) for sh in shapes)


def _lane_cycles(lanes: int, sizes: dict[str, int], shapes: list[StepShape], ranks: list[str],
                 candidates: list[tuple[str, ...]]) -> np.ndarray:
    """Lane-cycles of one point per iteration (multiply by ops per point / ops per lane) for
    every candidate set of ranks on the lanes at once: shape (candidates,) or (candidates,
    tilings)."""
    mask = np.array([[r in c for r in ranks] for c in candidates], dtype=bool)  # (candidates, ranks)
    total: Any = 0
    for sh in shapes:
        exts = [_extent(sh, sizes, r) for r in ranks]
        if any(isinstance(e, np.ndarray) for e in exts):
            dtype: Any = float
        else:  # one shape: int64 while exact, else Python ints
            dtype = np.int64 if math.prod(exts) * max(1, sh.count) < 2**62 else object
        tail = np.broadcast_shapes(*(np.shape(e) for e in exts)) if exts else ()
        stacked = np.empty((len(exts),) + tail, dtype=dtype)  # (ranks, tilings...)
        for k, ext in enumerate(exts):
            stacked[k] = ext
        picked = mask.reshape(mask.shape + (1,) * len(tail))  # (candidates, ranks, 1...)
        # the ranks' extents multiplied in their order (a product along the ranks axis), on
        # the lanes for ``on`` and in time for ``off``
        on = np.where(picked, stacked, 1).prod(axis=1, dtype=dtype)
        off = np.where(picked, 1, stacked).prod(axis=1, dtype=dtype)
        total = total + np.asarray(sh.count) * _ceil_div(on, lanes) * off
    return np.asarray(total)


def _ceil_div(values: Any, divisor: int) -> Any:
    """``ceil(values / divisor)`` of whole numbers: for floats below 2^53 (exact integers) by a
    true division and ceil, which is exact there and far cheaper than a float floor division;
    otherwise ``-(-values // divisor)``."""
    if isinstance(values, np.ndarray) and values.dtype == np.float64 and values.size and values.max() < 2.0**53:
        return np.ceil(values / divisor)
    return -(-values // divisor)


def _split_ops(compute: Any, ops: dict[str, int]) -> tuple[float, float, float]:
    """(MACs, elementwise operations, MFU cycles)."""
    elementwise = float(sum(ops.get(k, 0) for k in ELEMENTWISE_OPS))
    macs = float(ops.get("mac", 0))
    mfu = 0.0
    for fn, n in ops.items():
        if fn == "mac" or fn in ELEMENTWISE_OPS:
            continue
        unit, cost = compute.unary_cost(fn)  # (mambalaya.arch.spec.ComputeSpec.unary_cost)
        if unit == "mfu":
            mfu += n * cost / compute.mfu_units
        else:
            elementwise += n * cost
    return macs, elementwise, mfu


def elementwise_unit(compute: Any) -> tuple[str, int, float]:
    """Where elementwise work runs: (unit, lanes, operations per lane per cycle)."""
    if compute.one_d_mode:
        lanes = compute.one_d_lanes or compute.array_rows * compute.array_cols
        return "array_1d", lanes, compute.one_d_ops_per_lane_per_cycle
    if compute.vector_lanes:
        return "vector", compute.vector_lanes, 1.0
    return "array_1d", compute.array_rows * compute.array_cols, 1.0


def _points(sizes: dict[str, int], ranks: Iterable[str]) -> int:
    return math.prod(sizes[r] for r in ranks)


def einsum_runs(cascade: Cascade, einsum: Einsum, shapes: list[StepShape]) -> Any:
    """How many times the Einsum's iteration space runs over the steps: 1, or more when a
    fused loop over a rank it lacks recomputes it in every tile."""
    sizes = {r: cascade.size(r) for r in cascade.ranks}
    ranks = [rank_of_variable(v) for v in einsum.iteration_variables]
    full = _points(sizes, ranks)
    run: Any = 0
    for sh in shapes:
        run = run + sh.count * _prod(sh, sizes, ranks)
    return run / full if full else 1


def einsum_unit_cycles(
    compute: Any, cascade: Cascade, einsum: Einsum, ops: dict[str, int], shapes: list[StepShape],
    shapes_key: Any = None,
) -> tuple[dict[str, Any], SpatialMapping | None]:
    """Cycles per unit (``array_2d``, ``array_1d``, ``vector``, ``mfu``) of one Einsum over the
    step shapes, and its best spatial mapping (None when the shapes are arrays of tilings).

    The MACs of a contraction the array can run (:func:`contraction`) go to the 2D array in
    the best of the design's dataflows; with ``gemm_in_1d_mode`` they may instead run on the
    lanes, wherever that takes fewer cycles. Every other MAC, and every elementwise operation,
    runs on the lanes (the 1D mode or the vector unit), one per lane per cycle.

    ``shapes_key`` names the step shapes (a search's grid of tilings of some ranks): the best
    array mapping and the best lane mapping are then memoised on the cascade apart, by the
    compute fields each depends on, so designs that differ only in their dataflows share the
    lanes' results."""
    sizes = {r: cascade.size(r) for r in cascade.ranks}
    macs, elementwise, mfu = _split_ops(compute, ops)
    terms = contractions(cascade, einsum) if macs else ()
    on_array = bool(terms) and all(t.on_array for t in terms)
    if macs and not on_array:
        elementwise, macs_on_lanes = elementwise + macs, 0.0
    else:
        macs_on_lanes = macs if compute.gemm_in_1d_mode else 0.0  # the lanes' alternative for the array's MACs
    scalar = not any(isinstance(sh.count, np.ndarray) or any(isinstance(v, np.ndarray) for v in sh.extents.values())
                     for sh in shapes)
    # ops are counted over the full iteration space; a step runs its share of them
    ranks = [rank_of_variable(v) for v in einsum.iteration_variables]
    full_points = _points(sizes, ranks)
    scale = einsum_runs(cascade, einsum, shapes)
    run_points = scale * full_points
    cycles: dict[str, Any] = {"array_2d": 0.0, "array_1d": 0.0, "vector": 0.0, "mfu": mfu * scale}
    where, lanes, per_lane = elementwise_unit(compute)
    if compute.dataflows[0] == "roofline":
        return _roofline_cycles(compute, cycles, where, lanes * per_lane, scale, on_array, macs, elementwise, mfu, scalar)
    memo = cascade.__dict__.setdefault("_unit_parts_memo", {}) if shapes_key is not None else None
    best_2d = None
    if on_array:
        key = ("array", compute.array_rows, compute.array_cols, compute.dataflows, compute.dataflow_switch_cycles,
               compute.stationary_double_buffered, einsum.name, shapes_key)
        best_2d = memo.get(key) if memo is not None else None
        if best_2d is None:
            best_2d = _array_part(compute, sizes, shapes, terms, scalar, memo, (einsum.name, shapes_key))
            if memo is not None:
                memo[key] = best_2d
    best_1d = None
    if elementwise or macs_on_lanes:
        key = ("lanes", lanes, einsum.name, shapes_key)
        best_1d = memo.get(key) if memo is not None else None
        if best_1d is None:
            best_1d = _best_lane_mapping(cascade, einsum, lanes, sizes, shapes, scalar)
            if memo is not None:
                memo[key] = best_1d
        cycles[where] = cycles[where] + best_1d[0] * elementwise / full_points / per_lane
    macs_on_array: Any = bool(on_array)
    if best_2d is not None:  # a MoE block's routed Einsum runs its dense form's share (einsum.routing)
        route = float(einsum_scale(cascade, einsum.name))
        if route != 1:
            best_2d = (best_2d[0] * route, best_2d[1] if best_2d[1] is None else best_2d[1] * route, *best_2d[2:])
        cycles["array_2d"] = best_2d[0]
        if macs_on_lanes:
            lane_macs = best_1d[0] * macs_on_lanes / full_points / per_lane  # type: ignore[index]
            macs_on_array = best_2d[0] <= lane_macs
            cycles["array_2d"] = np.where(macs_on_array, best_2d[0], 0.0) if not scalar else (best_2d[0] if macs_on_array else 0.0)
            cycles[where] = cycles[where] + (np.where(macs_on_array, 0.0, lane_macs) if not scalar else (0.0 if macs_on_array else lane_macs))
    if not scalar:
        return cycles, None
    if best_2d is not None and macs_on_array:
        cyc, busy, (rows, cols, _, streamed, reduce_on, dataflow, side), found = best_2d
        util = macs * scale / (compute.array_rows * compute.array_cols * busy) if busy else 0.0
        held = {"A": found.side_a, "B": found.side_b, "out": (einsum.name,)}[side]
        return cycles, SpatialMapping("array_2d", dataflow, rows, cols, streamed, reduce_on, float(util), held)
    if best_1d is not None:
        lc, on_lanes = best_1d
        util = run_points / (lanes * lc) if lc else 0.0
        streamed = tuple(r for r in ranks if r not in on_lanes)
        reduce = "lanes" if any(r in on_lanes for r in (rank_of_variable(v) for v in einsum.reduced_variables)) else ""
        return cycles, SpatialMapping(where, compute.dataflows[0], on_lanes, (), streamed, reduce, float(util))
    return cycles, SpatialMapping("mfu" if mfu else "none", compute.dataflows[0])


def _array_part(compute: Any, sizes: dict[str, int], shapes: list[StepShape], terms: tuple[Contraction, ...],
                scalar: bool, memo: dict | None = None, key: tuple = ()) -> tuple:
    """(cycles, busy fold-cycles, candidate, contraction) of the array's work on an Einsum: the
    sum over its contractions, each in its best mapping (they run one after the other); the
    candidate and contraction shown are the longest one's. Over tilings, the cycles only."""
    cycles: Any = 0.0
    busy: Any = 0.0
    longest = None
    for k, found in enumerate(terms):
        cyc, b, cand = _best_array_mapping(compute, sizes, shapes, found, scalar, memo, (*key, k))
        cycles = cycles + cyc
        if scalar:
            busy = busy + b
            if longest is None or cyc > longest[0]:
                longest = (cyc, cand, found)
    if not scalar:
        return cycles, None, None, None
    assert longest is not None
    return cycles, busy, longest[1], longest[2]


def _best_array_mapping(compute: Any, sizes: dict[str, int], shapes: list[StepShape], found: Any, scalar: bool,
                        memo: dict | None = None, key: tuple = ()) -> tuple:
    """(cycles, busy fold-cycles, candidate) of the fastest spatial mapping over every allowed
    dataflow; over tilings, the least cycles only (:func:`_least_array_cycles`)."""
    ranks = {r for role in found.roles.values() for r in role}
    extents = [{r: _extent(sh, sizes, r) for r in ranks} for sh in shapes]
    if not scalar:
        return _least_array_cycles(compute, extents, shapes, found, sizes, memo, key), None, None
    # no mapping beats every PE busy in every fold: once the best reaches it, stop (a later
    # candidate could only tie, and a tie keeps the earlier one)
    floor: Any = 0
    for sh, ext in zip(shapes, extents):
        floor = floor + sh.count * (_product(ext, tuple(ranks)) / (compute.array_rows * compute.array_cols))
    best = None
    for cand in _array_candidates(compute, found, sizes):
        cyc, busy = _array_cycles(compute, extents, shapes, cand)
        if best is None or cyc < best[0]:
            best = (cyc, busy, cand)
        if best[0] <= floor:
            break
    assert best is not None
    return best


def _least_array_cycles(compute: Any, extents: list[dict[str, Any]], shapes: list[StepShape], found: Contraction,
                        sizes: dict[str, int], memo: dict | None = None, key: tuple = ()) -> np.ndarray:
    """The least cycles over every candidate of :func:`_array_candidates`, for arrays of
    tilings, without visiting the candidates one by one. With ``X_r`` and ``X_c`` the extents
    on the rows and columns (subsets of two roles) and ``S`` the stationary operand's other
    ranks, ``folds = f_r f_c S`` where ``f_r = ceil(X_r/R) x (the row role's ranks left off the
    array)`` and ``f_c`` likewise: a product of a row factor and a column factor, each an
    integer computed once per subset and combined for all pairs at once. The same integers
    as :func:`_array_cycles`, so the same floats while they stay below 2^53.

    The least is taken per stationary operand (:func:`_side_least_cycles`) and then over the
    design's options: with a ``memo`` (and the ``key`` naming the contraction and step shapes),
    each operand's least is kept per array, buffering and switch charge, so designs that
    differ only in their dataflows share it (a minimum is the same float in any order)."""
    best: Any = None
    first = compute.dataflows[0]
    for dataflow, side in stationary_options(compute, found):
        switch = compute.dataflow_switch_cycles if dataflow != first else 0.0
        side_key = None if memo is None else (
            "array-side", compute.array_rows, compute.array_cols, compute.stationary_double_buffered, side, switch, *key)
        least = None if memo is None else memo.get(side_key)
        if least is None:
            least = _side_least_cycles(compute, extents, shapes, found, sizes, side, switch)
            if memo is not None:
                memo[side_key] = least
        best = least if best is None else np.minimum(best, least)
    return best


def _side_least_cycles(compute: Any, extents: list[dict[str, Any]], shapes: list[StepShape], found: Contraction,
                       sizes: dict[str, int], side: str, switch_cycles: float) -> np.ndarray:
    """:func:`_least_array_cycles` of one stationary operand (``side``), ``switch_cycles``
    charged per step (a dataflow other than the design's first): the least over its
    candidates, which depends on the design's array and buffering, not on its other dataflows."""
    roles = {role: tuple(r for r in ranks if sizes[r] > 1) for role, ranks in found.roles.items()}
    n = max((np.size(v) for ext in extents for v in ext.values()), default=1)
    n = max(n, max(np.size(sh.count) for sh in shapes))

    def per_shape(values: list[Any]) -> np.ndarray:  # (shapes, tilings)
        out = np.empty((len(values), n))
        for k, v in enumerate(values):
            out[k] = v
        return out

    count = per_shape([sh.count for sh in shapes])
    best: Any = None
    a, b, stationary, streamed_roles = STATIONARY_ROLES[side]
    others = tuple(r for role in stationary if role not in (a, b) for r in roles[role])
    stream = tuple(r for role in streamed_roles for r in roles[role])
    weight = count * per_shape([_product(ext, stream) * _product(ext, others) for ext in extents])
    switch = (count * switch_cycles).sum(axis=0)

    def factors(role: str, dim: int) -> np.ndarray:  # (subsets, shapes, tilings)
        out = []
        for sub in _subsets(list(roles[role])):
            left = tuple(r for r in roles[role] if r not in sub)
            out.append(per_shape([np.ceil(np.asarray(_product(ext, sub), dtype=float) / dim) * _product(ext, left)
                                  for ext in extents]))
        return np.stack(out)

    for row_role, col_role in ((a, b), (b, a)):
        u, v = factors(row_role, compute.array_rows), factors(col_role, compute.array_cols)
        cyc = np.einsum("st,ist,jst->ijt", weight, u, v) + switch
        if not compute.stationary_double_buffered:
            # each fold loads, fills and drains alone: S (2 f_c X_rows_role + f_r X_cols_role - 2 f_r f_c)
            w = count * per_shape([_product(ext, others) for ext in extents])
            rows_all = per_shape([_product(ext, roles[row_role]) for ext in extents])
            cols_all = per_shape([_product(ext, roles[col_role]) for ext in extents])
            cyc = (cyc + 2 * np.einsum("st,jst->jt", w * rows_all, v)[None] + np.einsum("st,ist->it", w * cols_all, u)[:, None]
                   - 2 * np.einsum("st,ist,jst->ijt", w, u, v))
        least = cyc.reshape(-1, n).min(axis=0)
        best = least if best is None else np.minimum(best, least)
    return best


def _best_lane_mapping(cascade: Cascade, einsum: Einsum, lanes: int, sizes: dict[str, int], shapes: list[StepShape],
                       scalar: bool) -> tuple[Any, tuple[str, ...]]:
    """(lane-cycles of one point per iteration, ranks on the lanes) of the best lane mapping;
    over tilings, the elementwise minimum (the ranks are then the first candidate's, unused)."""
    all_ranks, candidates = _lane_candidates(cascade, einsum)
    if _fits_one_pass(lanes, sizes, shapes, candidates[0]):
        candidates = candidates[:1]  # every point on a lane at once: nothing beats it
    if scalar:
        every = _scalar_lane_cycles(lanes, sizes, shapes, all_ranks, candidates)
        k = every.index(min(every))  # the first least, as np.argmin
        return float(every[k]), candidates[k]
    return _lane_cycles(lanes, sizes, shapes, all_ranks, candidates).min(axis=0), candidates[0]


def _scalar_lane_cycles(lanes: int, sizes: dict[str, int], shapes: list[StepShape], ranks: list[str],
                        candidates: list[tuple[str, ...]]) -> list[int]:
    """:func:`_lane_cycles` of step shapes without arrays (a chosen group's) in exact Python
    integers, the same as its int64 or object arithmetic (numpy's per-call cost would dominate)."""
    per_shape = [(int(sh.count), [int(_extent(sh, sizes, r)) for r in ranks]) for sh in shapes]
    every = []
    for c in candidates:
        total = 0
        for count, exts in per_shape:
            on = math.prod(e for r, e in zip(ranks, exts) if r in c)
            total += count * -(-on // lanes) * math.prod(e for r, e in zip(ranks, exts) if r not in c)
        every.append(total)
    return every


def _roofline_cycles(compute: Any, cycles: dict[str, Any], where: str, lane_rate: float, scale: Any, on_array: bool,
                     macs: float, elementwise: float, mfu: float, scalar: bool) -> tuple[dict[str, Any], SpatialMapping | None]:
    """An ideal array: ``macs / (rows x cols)`` on the 2D array, every other operation at the
    lanes' peak rate."""
    cycles["array_2d"] = macs * scale / (compute.array_rows * compute.array_cols) if on_array else 0.0
    cycles[where] = cycles[where] + elementwise * scale / lane_rate
    if not scalar:
        return cycles, None
    unit = "array_2d" if on_array else (where if elementwise else ("mfu" if mfu else "none"))
    return cycles, SpatialMapping(unit, "roofline")


__all__ = [
    "DATAFLOWS",
    "SpatialMapping",
    "StepShape",
    "einsum_runs",
    "einsum_unit_cycles",
    "elementwise_unit",
    "Contraction",
    "contraction",
    "contractions",
    "stationary_options",
    "step_shapes",
]
