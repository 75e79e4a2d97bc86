"""The work a mask makes dead, found from the Einsums' algebra, for every cascade alike.

A constant mask input (a :class:`~mambalaya.einsum.ir.TensorSpec` with a
:class:`~mambalaya.einsum.ir.Mask`: the causal masks of attention and of the chunked scans'
in-chunk products, a blocked softmax's key mask, a strictly lower or diagonal mask) holds a known
value, 0 or -inf, at every key its query does not see. This module follows those values through
the cascade, Einsum by Einsum in order, and finds where an Einsum's result is known without
computing it, as a kernel that skips masked tiles knows it:

* A **fact** on a tensor says that at every dead cell of a mask's band (a cell: one key, or one
  block of keys; dead: it holds no key its query sees) over two of the tensor's dimensions
  (query row, key column) the tensor holds a known value: 0, -inf, 1, or its own value at the
  previous key cell (*carried*: a recurrence along the keys whose step adds nothing). A mask
  has the fact its declaration states.
* An Einsum is evaluated symbolically at a generic dead point of a **frame** (a fact of one of
  its inputs, placed on two of its variables): an input with a fact on the same variables whose
  live band lies inside the frame's has its known value; a read one key cell back (``t-1``) is
  the tensor's previous value. The rules are the algebra's: ``0 * x = 0``, ``1 * x = x``,
  ``x + 0 = x``, ``x + (-inf) = -inf``, ``x - x = 0``, ``max(x, -inf) = x``, ``exp(-inf) = 0``,
  ``exp(0) = 1``, ``0 / x = 0`` (a divisor is taken as nonzero); anything else is unknown. An
  unknown value has a *kind*, followed through the cascade the same way: finite (the inputs and
  weights, a mask's seen keys), finite or -inf (a sum or max with -inf; ``exp`` makes it finite
  again), or anything (a product, quotient or difference with -inf may be NaN or +inf). The
  rules that drop a value (``0 * x = 0``, ``-inf + x = -inf``, ``x - x = 0``) hold only for the
  kinds they need: ``0 * P[t-1]`` is not 0 where ``P`` may be -inf. A tensor's kind is taken at
  its live cells (its fact gives the rest), so a max over a row's keys of which one is seen is
  finite; a recurrence's kind is a fixed point from finite.
* The frame holds when the work at its dead points is known: for an Einsum that keeps both frame
  variables, the whole expression is a known value (for a reduction, its identity: 0 for a sum,
  -inf for a max; for a recurrence, its previous value), which becomes the fact of its output;
  for one that reduces a frame variable, every additive term over both frame variables is the
  reduction's identity (the terms that lack one run per output point, unskipped).
* Of the frames that hold, the one with the fewest live cells is the Einsum's. Its operations
  over both frame variables run on the live cells only (:func:`masked_variables`,
  :mod:`mambalaya.einsum.stats`), and a tensor with a fact moves its live cells only (its dead
  ones are known; a mask's dead keys the same).
* Cells are skipped by the mask's tiles (``Mask.row_tile``/``col_tile``, :func:`with_mask_tiles`):
  one key or key block by default, the least work; a kernel's tiles where a model says them.

What it finds on the shipped cascades: a causal prefill's scores and softmax (every form: the
three-pass and online forms per key, the blocked form per block of keys, as block-skipping
kernels compute whole blocks), the chunked scans' segment decay and in-chunk products (Mamba-2's
``LD`` and ``YDG``, the gated delta rule's ``LD``, ``AS``, ``QE``, ``YI`` and the forward
substitution's product ``AS[q,t] * TI[t,s]`` on ``t < q``); nothing in decode (a step's query
sees every cached key) or without a causal mask. What it leaves computed: the products no mask
reaches (``C Bᵀ``, ``K Kᵀ``, ``Q Kᵀ``, as ``mamba_ssm``'s ``_bmm_chunk_fwd`` computes ``C Bᵀ``
whole), the forward substitution's ``TI`` itself (its triangularity needs induction over its own
rows) and its identity term, all counted whole: the count never goes below what the algebra
proves dead. The checks: ``tests/test_dead_work.py`` (every fact against executed values, on the
shipped layers and on random programs).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction
from functools import lru_cache

import numpy as np

from mambalaya.einsum.cascade import Cascade
from mambalaya.errors import SpecError
from mambalaya.einsum.ir import (Access, AffineIndex, Binary, Const, Einsum, Expr, Mask, Unary, additive_terms,
                                 expr_variables, rank_of_variable)

ZERO, NEG_INF, ONE, CARRIED = "0", "-inf", "1", "carried"
#: A reduction's identity: what a term known dead adds to it.
IDENTITY = {"sum": ZERO, "max": NEG_INF}


@dataclass(frozen=True)
class Band:
    """A mask's band without its rank names: key ``k`` in cell ``c`` (``width`` keys a cell)
    is seen by query ``q = row + offset`` iff ``lower <= k - q <= upper`` (``relative``; else
    ``lower <= k <= upper``). Work is skipped by tiles of ``row_tile`` rows by ``col_tile``
    cells (aligned at 0): a tile with a seen key is live whole."""

    lower: int | None
    upper: int | None
    offset: int
    relative: bool
    width: int
    row_tile: int = 1
    col_tile: int = 1

    def inside(self, other: "Band") -> bool:
        """Whether every cell this band sees, ``other`` sees too (same cells, tiles and query origin)."""
        if (self.offset, self.relative, self.width, self.row_tile, self.col_tile) != \
                (other.offset, other.relative, other.width, other.row_tile, other.col_tile):
            return False
        low_ok = other.lower is None or (self.lower is not None and self.lower >= other.lower)
        high_ok = other.upper is None or (self.upper is not None and self.upper <= other.upper)
        return low_ok and high_ok

    def live_cells(self, rows: int, cols: int, *, first_row: int = 0, first_col: int = 0,
                   row_limit: int | None = None, col_limit: int | None = None) -> int:
        """The (row, cell) pairs in live tiles, over the ``rows`` queries from ``first_row``
        and the ``cols`` cells from ``first_col`` (of a tensor whose rows and cells start at 0;
        ``row_limit`` and ``col_limit``: its rows and cells, where a last tile stops; default the
        last counted)."""
        if rows <= 0 or cols <= 0:
            return 0
        counts = self.live_cells_per_row(rows, cols, first_row=first_row, first_col=first_col,
                                         row_limit=row_limit, col_limit=col_limit)
        return int(counts.sum()) * (1 if self.relative else rows)

    def live_cells_per_row(self, rows: int, cols: int, *, first_row: int = 0, first_col: int = 0,
                           row_limit: int | None = None, col_limit: int | None = None) -> np.ndarray:
        """:meth:`live_cells` row by row (one entry for all rows of a band that is not relative)."""
        limit = first_row + rows if row_limit is None else row_limit
        keys = (first_col + cols if col_limit is None else col_limit) * self.width  # the keys that exist
        row = np.arange(first_row, first_row + rows, dtype=np.int64)
        if self.relative:  # the tile's first and last queries
            top = row // self.row_tile * self.row_tile
            first_query, last_query = top + self.offset, np.minimum(top + self.row_tile, limit) - 1 + self.offset
        else:
            first_query = last_query = np.zeros(1, dtype=np.int64)
        span = self.col_tile * self.width  # keys per column tile
        first_key = np.maximum(first_query + self.lower, 0) if self.lower is not None else np.zeros_like(first_query)
        last_key = np.minimum(last_query + self.upper, keys - 1) if self.upper is not None else np.full_like(last_query, keys - 1)
        first_cell = np.maximum(first_key // span * self.col_tile, first_col)
        last_cell = np.minimum((last_key // span + 1) * self.col_tile - 1, first_col + cols - 1)
        return np.where((last_key >= first_key) & (first_cell <= last_cell), last_cell - first_cell + 1, 0)

    def live_share(self, rows: int, cols: int) -> Fraction:
        """The share of a ``rows`` x ``cols`` tensor's (row, cell) pairs in live tiles."""
        return _live_share(self, rows, cols)

    def has_dead_row(self, rows: int, cols: int) -> bool:
        """Whether some row of a ``rows`` x ``cols`` tensor has no live tile."""
        return _has_dead_row(self, rows, cols)


@lru_cache(maxsize=1024)
def _live_share(band: Band, rows: int, cols: int) -> Fraction:
    return Fraction(band.live_cells(rows, cols, row_limit=rows, col_limit=cols), rows * cols)


@lru_cache(maxsize=1024)
def _has_dead_row(band: Band, rows: int, cols: int) -> bool:
    return bool((band.live_cells_per_row(rows, cols, row_limit=rows, col_limit=cols) == 0).any())


@dataclass(frozen=True)
class Fact:
    """At the dead cells of ``band`` over dimensions ``row_dim`` (None: every row) and
    ``col_dim`` of a tensor, the tensor holds ``value`` (``0``, ``-inf``, ``1`` or ``carried``)."""

    band: Band
    row_dim: int | None
    col_dim: int
    value: str


@dataclass(frozen=True)
class Frame:
    """A fact placed on an Einsum's variables: dead points are the band's dead cells of
    ``(row, col)``."""

    band: Band
    row: str | None
    col: str


@dataclass(frozen=True)
class DeadWork:
    """Per Einsum, its frame and the share of the frame's cells that are live; per tensor, its
    fact and the share of its elements a pass moves (only shares below 1)."""

    frames: dict[str, tuple[Frame, Fraction]]
    facts: dict[str, Fact]
    tensor_shares: dict[str, Fraction]


def mask_band(cascade: Cascade, mask: Mask) -> Band:
    width = cascade.size(mask.block) if mask.block else 1
    return Band(mask.lower, mask.upper, mask.offset, mask.row is not None, width, mask.row_tile, mask.col_tile)


def mask_fact(cascade: Cascade, tensor: str) -> Fact:
    spec = cascade.tensors[tensor]
    mask = spec.mask
    assert mask is not None
    row_dim = spec.ranks.index(mask.row) if mask.row else None
    return Fact(mask_band(cascade, mask), row_dim, spec.ranks.index(mask.col), NEG_INF if mask.dead < 0 else ZERO)


def _volume(box) -> int:
    volume = 1
    for start, stop in box:
        volume *= max(0, stop - start)
    return volume


def live_in_box(band: Band, row_dim: int | None, col_dim: int, box, limits: tuple[int | None, int | None] = (None, None)
                ) -> int:
    """How many elements of ``box`` (a ``(start, stop)`` per dimension) lie in live cells of
    ``band`` placed on dimensions ``row_dim`` (None: every row) and ``col_dim`` (``limits``:
    their sizes, where a last tile stops)."""
    volume = _volume(box)
    if not volume:
        return 0
    (c0, c1) = box[col_dim]
    (r0, r1) = box[row_dim] if row_dim is not None else (0, 1)
    live = band.live_cells(r1 - r0, c1 - c0, first_row=r0, first_col=c0, row_limit=limits[0], col_limit=limits[1])
    return volume // ((r1 - r0) * (c1 - c0)) * live


def live_elements(cascade: Cascade, tensor: str, box) -> int:
    """How many elements of ``box`` of ``tensor`` a pass moves: all of them, or, for a tensor
    with a fact, those in its live cells."""
    fact = dead_work(cascade).facts.get(tensor)
    if fact is None:
        return _volume(box)
    shape = cascade.shape(tensor)
    rows = shape[fact.row_dim] if fact.row_dim is not None else None
    return live_in_box(fact.band, fact.row_dim, fact.col_dim, box, (rows, shape[fact.col_dim]))


def reads_aligned(cascade: Cascade, tensor: str, accesses) -> bool:
    """Whether every access reads a masked tensor's fact dimensions at plain variables, so that
    the reads reach whole cells and move the live ones only."""
    fact = dead_work(cascade).facts.get(tensor)
    if fact is None:
        return False
    dims = [fact.col_dim] + ([fact.row_dim] if fact.row_dim is not None else [])
    return bool(accesses) and all(acc.indices[d].plain_variable is not None for acc in accesses for d in dims)


def frame_live_elements(cascade: Cascade, einsum: str, dims: tuple[int | None, int], box) -> int:
    """How many elements of ``box`` of an operand of ``einsum`` lie in its frame's live cells,
    the frame placed on the operand's dimensions ``dims`` (:func:`frame_dims`)."""
    frame = dead_work(cascade).frames[einsum][0]
    sizes = cascade.variable_sizes
    return live_in_box(frame.band, *dims, box, (sizes[frame.row] if frame.row else None, sizes[frame.col]))


def frame_dims(cascade: Cascade, einsum: str, accesses) -> tuple[int | None, int] | None:
    """The dimensions of an operand at which every one of its ``accesses`` in ``einsum`` reads
    the Einsum's frame variables, each at a plain variable: the operand is then read on the
    frame's live cells only. None if the Einsum has no frame or an access reads them otherwise."""
    found = dead_work(cascade).frames.get(einsum)
    if found is None:
        return None
    frame = found[0]
    dims = None
    for acc in accesses:
        plain = [i.plain_variable for i in acc.indices]
        if frame.col not in plain or (frame.row is not None and frame.row not in plain):
            return None
        here = (plain.index(frame.row) if frame.row is not None else None, plain.index(frame.col))
        if dims is not None and here != dims:
            return None
        dims = here
    return dims


def with_mask_tiles(cascade: Cascade, rows: int = 1, keys: int | None = None) -> Cascade:
    """``cascade`` with every mask skipped by a kernel's tiles: ``rows`` queries by ``keys``
    keys (a multiple of a blocked mask's keys per cell; None: one cell). ``with_mask_tiles(c)``
    is the least work, every mask by its own cells."""
    tensors = {}
    for name, spec in cascade.tensors.items():
        mask = spec.mask
        if mask is not None:
            width = cascade.size(mask.block) if mask.block else 1
            if keys is not None and (keys < width or keys % width):
                raise SpecError(f"tiles of {keys} keys do not hold whole cells of mask {name} ({width} keys each)")
            tiles = (rows, 1 if keys is None else keys // width)
            if tiles != (mask.row_tile, mask.col_tile):
                spec = replace(spec, mask=replace(mask, row_tile=tiles[0], col_tile=tiles[1]))
        tensors[name] = spec
    if all(tensors[n] is s for n, s in cascade.tensors.items()):
        return cascade
    return replace(cascade, tensors=tensors)


def live_mask(cascade: Cascade, tensor: str) -> np.ndarray:
    """The boolean array of the keys a mask tensor's queries see, in the tensor's rank order:
    what its declaration says, to check against its values."""
    spec = cascade.tensors[tensor]
    mask = spec.mask
    assert mask is not None
    sizes = {r: cascade.size(r) for r in spec.ranks}
    width = sizes[mask.block] if mask.block else 1
    grids = np.meshgrid(*(np.arange(sizes[r]) for r in spec.ranks), indexing="ij")
    at = dict(zip(spec.ranks, grids))
    key = at[mask.col] * width + (at[mask.block] if mask.block else 0)
    rel = key - (at[mask.row] + mask.offset) if mask.row else key
    live = np.ones(key.shape, dtype=bool)
    if mask.lower is not None:
        live &= rel >= mask.lower
    if mask.upper is not None:
        live &= rel <= mask.upper
    return live


def mask_array(cascade: Cascade, tensor: str) -> np.ndarray:
    """The values a mask's declaration gives it (float64): ``dead`` at every hidden key, and at
    every seen key 0 (a mask in log space) or 1 (a mask that multiplies)."""
    mask = cascade.tensors[tensor].mask
    assert mask is not None
    return np.where(live_mask(cascade, tensor), 0.0 if mask.dead < 0 else 1.0, mask.dead)


def mask_contradiction(cascade: Cascade, tensor: str, values: np.ndarray) -> str | None:
    """What in ``values`` contradicts the tensor's mask declaration, or None: a hidden key that
    does not hold ``dead``, a seen key that does (one key a cell), or a block with a seen key
    that holds ``dead`` throughout (a blocked mask)."""
    mask = cascade.tensors[tensor].mask
    assert mask is not None
    live = live_mask(cascade, tensor)
    dead_valued = values == mask.dead
    dead_text = "-inf" if mask.dead < 0 else "0"
    if mask.block is not None:
        axis = cascade.tensors[tensor].ranks.index(mask.block)
        live = np.broadcast_to(np.any(live, axis=axis, keepdims=True), live.shape)
        if np.any(np.all(dead_valued | ~live, axis=axis) & np.any(live, axis=axis)):
            return f"a block of keys its declaration says a query sees holds {dead_text} throughout"
    elif np.any(dead_valued & live):
        return f"a key its declaration says a query sees holds {dead_text}"
    if not np.all(dead_valued[~live]):
        return f"a key its declaration hides does not hold {dead_text}"
    return None


# ----------------------------------------------------------------------------------------------
# kinds: what an unknown value may be
# ----------------------------------------------------------------------------------------------

#: An unknown value's kind: finite, finite or -inf, or anything (+inf or NaN too).
FINITE, MINUS_INF, ANY = "finite", "finite or -inf", "any"


def _join(*kinds: str) -> str:
    return ANY if ANY in kinds else MINUS_INF if MINUS_INF in kinds else FINITE


def _kind_rule(op: str, a: str, b: str = FINITE) -> str:
    """The kind of ``a op b`` (or of ``op(a)``): -inf survives a sum, a max with it and an
    ``exp`` (to 0); a product, quotient or difference with it may be NaN or +inf."""
    if op == "+":
        return _join(a, b)
    if op == "-":
        return ANY if ANY in (a, b) or b == MINUS_INF else a
    if op in ("*", "/"):
        return FINITE if a == b == FINITE else ANY
    if op == "max":
        return ANY if ANY in (a, b) else FINITE if FINITE in (a, b) else MINUS_INF
    if op == "min":
        return _join(a, b)
    if op == "exp":
        return FINITE if a != ANY else ANY
    return FINITE if a == FINITE else ANY  # any other function of a finite value is finite


def _const_kind(value: float) -> str:
    return FINITE if np.isfinite(value) else MINUS_INF if value == -np.inf else ANY


def _expr_kind(expr: Expr, read) -> str:
    """The kind of ``expr`` with each access of kind ``read(access)`` (a reduction of it too:
    a sum or a max of finite values is finite, of -inf values -inf)."""
    if isinstance(expr, Access):
        return read(expr)
    if isinstance(expr, Const):
        return _const_kind(expr.value)
    if isinstance(expr, Unary):
        return _kind_rule(expr.fn, _expr_kind(expr.arg, read))
    if isinstance(expr, Binary):
        return _kind_rule(expr.op, _expr_kind(expr.lhs, read), _expr_kind(expr.rhs, read))
    return FINITE


def _sum_kind(einsum: Einsum, term_kind) -> str:
    """The kind of the Einsum's result from each additive term's kind (``term_kind(term)``)."""
    kind = None
    for sign, term in additive_terms(einsum.expr):
        here = term_kind(term)
        kind = here if kind is None else _kind_rule("+" if sign > 0 else "-", kind, here)
    return kind or FINITE


# ----------------------------------------------------------------------------------------------
# the value at a dead point
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Unknown:
    """A value not known at a dead point: its kind and, if it is one access's value there, the
    access (two reads of the same access are the same value; a carried cell is the cell one key
    back)."""

    kind: str
    at: str | None = None


def _kind_of(value) -> str:
    return value.kind if isinstance(value, Unknown) else MINUS_INF if value == NEG_INF else FINITE


def _index_of(acc: Access, dim: int | None) -> str | None:
    return None if dim is None else acc.indices[dim].plain_variable


def _placed(fact: Fact, acc: Access) -> Frame | None:
    """The fact of ``acc``'s tensor on the Einsum's variables, if both its dimensions are read
    at a plain variable."""
    col = _index_of(acc, fact.col_dim)
    row = _index_of(acc, fact.row_dim)
    if col is None or (fact.row_dim is not None and row is None):
        return None
    return Frame(fact.band, row, col)


def _on_frame(fact: Fact | None, acc: Access, frame: Frame) -> bool:
    """Whether ``acc`` places its tensor's fact on the frame's variables."""
    placed = _placed(fact, acc) if fact is not None else None
    return placed is not None and (placed.row, placed.col) == (frame.row, frame.col)


def _inside(fact: Fact | None, acc: Access, frame: Frame) -> bool:
    """Whether ``acc`` places its tensor's fact on the frame's variables with a band inside the
    frame's: every dead point of the frame is a dead cell of the tensor."""
    return _on_frame(fact, acc, frame) and fact.band.inside(frame.band)  # type: ignore[union-attr]


def _previous(acc: Access, col_dim: int) -> str:
    """The text of ``acc`` one key cell back: what a carried value equals."""
    index = acc.indices[col_dim]
    back = AffineIndex(index.terms, index.const - 1)
    return str(Access(acc.tensor, acc.indices[:col_dim] + (back,) + acc.indices[col_dim + 1:]))


class _Pass:
    """The analysis state, Einsum by Einsum: each tensor's fact and kind (at its live cells, and
    wherever it is read)."""

    def __init__(self, cascade: Cascade) -> None:
        self.cascade = cascade
        self.facts: dict[str, Fact] = {}
        self.live_kind: dict[str, str] = {}  # the kind of a tensor at its live cells (everywhere if no fact)

    def read_kind(self, tensor: str) -> str:
        """The kind of a tensor read anywhere: at its live cells, or its fact's value."""
        live = self.live_kind.get(tensor, FINITE)  # an input or weight is finite
        fact = self.facts.get(tensor)
        if fact is None or fact.value == CARRIED:
            return live
        return _join(live, MINUS_INF if fact.value == NEG_INF else FINITE)

    # -- the value at a dead point of a frame --------------------------------------------------

    def value(self, expr: Expr, frame: Frame):
        """The value of ``expr`` at a dead point of ``frame``: ``0``, ``-inf``, ``1`` or an
        :class:`Unknown`."""
        if isinstance(expr, Access):
            fact = self.facts.get(expr.tensor)
            if _inside(fact, expr, frame):
                if fact.value == CARRIED:
                    return Unknown(self.read_kind(expr.tensor), _previous(expr, fact.col_dim))
                return fact.value
            return Unknown(self.read_kind(expr.tensor), str(expr))
        if isinstance(expr, Const):
            return ZERO if expr.value == 0 else ONE if expr.value == 1 else \
                NEG_INF if expr.value == -np.inf else Unknown(_const_kind(expr.value))
        if isinstance(expr, Unary):
            arg = self.value(expr.arg, frame)
            if expr.fn == "exp" and arg in (NEG_INF, ZERO):
                return ZERO if arg == NEG_INF else ONE
            if expr.fn == "neg" and arg == ZERO:
                return ZERO
            return Unknown(_kind_rule(expr.fn, _kind_of(arg)))
        if isinstance(expr, Binary):
            return _binary(expr.op, self.value(expr.lhs, frame), self.value(expr.rhs, frame))
        return Unknown(FINITE)

    def output_value(self, einsum: Einsum, frame: Frame) -> str | None:
        """What the Einsum's output holds at the frame's dead points when it keeps both frame
        variables: a constant, ``carried`` (its previous value), or None (the frame fails).
        Every point a reduced term reduces over is dead (the frame's variables are kept), so
        the term is the reduction of its value (:func:`_reduction`)."""
        reduced = set(einsum.reduced_variables)
        value = ZERO
        for sign, term in additive_terms(einsum.expr):
            term_value = self.value(term, frame)
            if reduced & set(expr_variables(term)):
                term_value = _reduction(einsum.reduce_op, term_value)
            value = _binary("+" if sign > 0 else "-", value, term_value)
        if value in (ZERO, NEG_INF, ONE):
            return value
        col_dim = einsum.output_variables.index(frame.col)
        if isinstance(value, Unknown) and value.at == _previous(einsum.output, col_dim):
            return CARRIED
        return None

    def terms_dead(self, einsum: Einsum, frame: Frame) -> bool:
        """Whether every additive term over both frame variables is the reduction's identity."""
        needed = {frame.col} | ({frame.row} if frame.row else set())
        identity = IDENTITY.get(einsum.reduce_op)
        over = [term for _, term in additive_terms(einsum.expr) if needed <= set(expr_variables(term))]
        return bool(over) and all(self.value(term, frame) == identity for term in over)

    # -- kinds ---------------------------------------------------------------------------------

    def einsum_kind(self, einsum: Einsum, frame: Frame | None) -> str:
        """The kind of the Einsum's result at its frame's live points (everywhere without one),
        its own earlier values (a recurrence) taken to a fixed point from finite."""
        mine = FINITE
        for _ in range(3):  # a three-level lattice: at most two rises
            found = self._kind_once(einsum, frame, mine)
            if found == mine:
                return mine
            mine = found
        return mine

    def _kind_once(self, einsum: Einsum, frame: Frame | None, mine: str) -> str:
        def read(acc: Access) -> str:
            if acc.tensor == einsum.name:
                return mine
            fact = self.facts.get(acc.tensor)
            if frame is not None and _on_frame(fact, acc, frame) and frame.band.inside(fact.band):
                return self.live_kind.get(acc.tensor, FINITE)  # the frame's live points are the tensor's live cells
            return self.read_kind(acc.tensor)

        reduced = set(einsum.reduced_variables)
        empty_row = frame is not None and frame.col in reduced and self._some_row_dead(frame)

        def term_kind(term: Expr) -> str:
            kind = _expr_kind(term, read)
            if reduced & set(expr_variables(term)) and empty_row and einsum.reduce_op == "max":
                kind = _join(kind, MINUS_INF)  # a row whose every point is dead reduces to -inf
            return kind
        return _sum_kind(einsum, term_kind)

    def _some_row_dead(self, frame: Frame) -> bool:
        sizes = self.cascade.variable_sizes
        rows = sizes[frame.row] if frame.row else 1
        cols = sizes[frame.col]
        return frame.band.has_dead_row(rows, cols)

    # -- frames ----------------------------------------------------------------------------------

    def frames(self, einsum: Einsum) -> list[Frame]:
        found: dict[Frame, None] = {}
        for acc in einsum.inputs:
            fact = self.facts.get(acc.tensor)
            placed = _placed(fact, acc) if fact else None
            if placed is not None:
                found.setdefault(placed)
        return list(found)

    def einsum_frame(self, einsum: Einsum) -> tuple[Frame, Fraction, Fact | None] | None:
        """The Einsum's frame with the fewest live cells among those that hold, its live share
        and the fact of its output (None if it reduces a frame variable)."""
        best = None
        outputs = einsum.output_variables
        self.live_kind[einsum.name] = self.einsum_kind(einsum, None)  # its own reads while frames are tried
        for frame in self.frames(einsum):
            keeps = frame.col in outputs and (frame.row is None or frame.row in outputs)
            fact = None
            if keeps:
                value = self.output_value(einsum, frame)
                if value is None:
                    continue
                fact = Fact(frame.band, outputs.index(frame.row) if frame.row else None, outputs.index(frame.col), value)
            elif not self.terms_dead(einsum, frame):
                continue
            share = _share(self.cascade, frame)
            if share < 1 and (best is None or share < best[1]):
                best = (frame, share, fact)
        return best


def _binary(op: str, a, b):
    """The value of ``a op b`` at a dead point (``0``, ``-inf``, ``1`` or an :class:`Unknown`)."""
    ka, kb = _kind_of(a), _kind_of(b)
    if op == "+":
        if a == ZERO:
            return b
        if b == ZERO:
            return a
        return NEG_INF if NEG_INF in (a, b) and ANY not in (ka, kb) else Unknown(_kind_rule("+", ka, kb))
    if op == "-":
        if b == ZERO:
            return a
        if a == NEG_INF and kb == FINITE:
            return NEG_INF
        if isinstance(a, Unknown) and a == b and a.at is not None and a.kind == FINITE:
            return ZERO
        return Unknown(_kind_rule("-", ka, kb))
    if op == "*":
        if ZERO in (a, b) and ka == kb == FINITE:
            return ZERO
        return b if a == ONE else a if b == ONE else Unknown(_kind_rule("*", ka, kb))
    if op == "/":  # a divisor is taken as nonzero, as a layer's are
        if a == ZERO and kb == FINITE and b != ZERO:
            return ZERO
        return a if b == ONE else Unknown(_kind_rule("/", ka, kb))
    if op == "max":
        return b if a == NEG_INF else a if b == NEG_INF else Unknown(_kind_rule("max", ka, kb))
    if op == "min" and NEG_INF in (a, b) and ANY not in (ka, kb):
        return NEG_INF
    return Unknown(_kind_rule(op, ka, kb))


def _reduction(op: str, value):
    """A reduction of ``value`` over every point: 0 and -inf stay (a sum of zeros, of -inf; a
    max of any constant); anything else is unknown (a sum of ones counts the points)."""
    if value in (ZERO, NEG_INF) or (op == "max" and value == ONE):
        return value
    return Unknown(_kind_of(value))


def _share(cascade: Cascade, frame: Frame) -> Fraction:
    sizes = cascade.variable_sizes
    return frame.band.live_share(sizes[frame.row] if frame.row else 1, sizes[frame.col])


def dead_work(cascade: Cascade) -> DeadWork:
    """Every Einsum's frame and every tensor's fact (the module doc), memoised on the cascade."""
    memo = cascade.__dict__.get("_dead_work")
    if memo is not None:
        return memo
    if not any(spec.mask is not None for spec in cascade.tensors.values()):  # nothing is dead without a mask
        out = cascade.__dict__["_dead_work"] = DeadWork({}, {}, {})
        return out
    state = _Pass(cascade)
    shares: dict[str, Fraction] = {}
    frames: dict[str, tuple[Frame, Fraction]] = {}
    for name, spec in cascade.tensors.items():
        if spec.mask is not None:
            fact = state.facts[name] = mask_fact(cascade, name)
            # a mask's seen keys hold finite values; a cell of a block of keys may also hold -inf
            state.live_kind[name] = MINUS_INF if spec.mask.block and spec.mask.dead < 0 else FINITE
            rows = cascade.shape(name)[fact.row_dim] if fact.row_dim is not None else 1
            share = fact.band.live_share(rows, cascade.shape(name)[fact.col_dim])
            if share < 1:
                shares[name] = share
    for einsum in cascade.einsums:
        found = state.einsum_frame(einsum)
        if found is None:
            continue
        frame, share, fact = found
        frames[einsum.name] = (frame, share)
        if fact is not None:
            state.facts[einsum.name] = fact
            shares[einsum.name] = share
        state.live_kind[einsum.name] = state.einsum_kind(einsum, frame)
    out = DeadWork(frames, state.facts, shares)
    cascade.__dict__["_dead_work"] = out
    return out


def check_history_reads(cascade: Cascade) -> None:
    """A history-read recurrence (:mod:`mambalaya.einsum.cascade`: step ``q`` reads every row
    ``t`` of its own output) gives the rows not yet computed no weight: its values must be dead
    wherever ``t >= q``, a strictly-lower mask this analysis finds on its frame. Without one the
    executor read those rows as zeros while the cost counted them (``H[i] = X[i] + A[i,t]*H[t]``
    solved nothing and said nothing); a :class:`SpecError` naming the Einsum."""
    for e in cascade.einsums:
        if cascade.recurrence(e) is None or not cascade.is_history_recurrence(e):
            continue
        rank = cascade.recurrence(e)[0]  # type: ignore[index]
        dim = cascade.tensors[e.name].ranks.index(rank)
        row = e.output.indices[dim].plain_variable
        col = next(a.indices[dim].plain_variable for a in e.inputs if a.tensor == e.name)
        found = dead_work(cascade).frames.get(e.name)
        band = found[0].band if found is not None and (found[0].row, found[0].col) == (row, col) else None
        if band is None or not band.relative or band.width != 1 or band.upper is None or band.upper + band.offset > -1:
            raise SpecError(f"{e.name} reads its own rows {col} at every step {row} (a history read), but nothing makes "
                            f"its terms zero where {col} >= {row}: rows not yet computed would be read as zeros while "
                            f"the cost counts them. Multiply the self-read by a tensor masked strictly below the "
                            f"diagonal (mask: {{row: {rank_of_variable(row or '?')}, col: {rank_of_variable(col or '?')}, "
                            f"upper: -1, dead: 0}}, or a product with one)", einsum=e.name)


def masked_variables(cascade: Cascade, einsum: str) -> tuple[frozenset[str], Fraction] | None:
    """The variables an Einsum's skipped work spans (an operation over all of them runs on the
    live share only) and that share; None if a mask skips none of its work."""
    found = dead_work(cascade).frames.get(einsum)
    if found is None:
        return None
    frame, share = found
    return frozenset(v for v in (frame.row, frame.col) if v is not None), share


__all__ = ["CARRIED", "NEG_INF", "ONE", "ZERO", "Band", "DeadWork", "Fact", "Frame", "dead_work", "frame_dims", "frame_live_elements", "live_elements", "live_in_box", "live_mask", "mask_array", "mask_contradiction", "reads_aligned", "with_mask_tiles",
           "mask_band", "mask_fact", "masked_variables", "check_history_reads"]
