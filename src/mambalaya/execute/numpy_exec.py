"""A numpy interpreter for any cascade.

Each Einsum is evaluated over its whole iteration space at once, except a recurrence, which is
evaluated one step of its generational rank at a time (vectorised over every other rank).
Arrays inside an evaluation are laid out over the Einsum's iteration variables (output
variables first, then reduced ones) with length-1 axes for variables a value does not depend
on, so numpy broadcasting lines them up. A reduced additive term that is a product goes through
``numpy.einsum`` (BLAS for GEMMs) so a GEMM never materialises its full iteration space.

Out-of-range reads (``i-1`` at ``i=0``, the causal window's left edge) return the tensor's
initial value (:attr:`TensorSpec.initial`) or zero: the source array is padded once per Einsum.
"""

from __future__ import annotations

import math

import string
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from mambalaya.errors import ExecutionError, SpecError
from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.dead_work import mask_contradiction
from mambalaya.einsum.ir import (
    Access,
    Binary,
    Const,
    Einsum,
    Expr,
    Param,
    Role,
    Unary,
    additive_terms,
    expr_variables,
)

DTYPES = {"float32": np.float32, "float64": np.float64}


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0, -x))


_ERF = np.frompyfunc(math.erf, 1, 1)


def _gelu(x: np.ndarray) -> np.ndarray:
    """The exact GELU, 0.5*x*(1 + erf(x/sqrt(2))), with math.erf element by element (in double
    precision, the result cast back to x's dtype)."""
    x = np.asarray(x)
    erf = _ERF(x.astype(np.float64) / math.sqrt(2.0)).astype(np.float64)
    return (0.5 * x * (1.0 + erf)).astype(x.dtype)


UNARY_NUMPY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "silu": lambda x: x * _sigmoid(x),
    "softplus": lambda x: np.logaddexp(0, x),
    "neg": np.negative,
    "square": np.square,
    "sigmoid": _sigmoid,
    "tanh": np.tanh,
    "abs": np.abs,
    "step": lambda x: (x > 0).astype(x.dtype),
    "relu": lambda x: np.maximum(x, 0),
    "gelu": _gelu,
}

#: The element-wise functions of two values (:data:`~mambalaya.einsum.ir.BINARY_FUNCTIONS`).
BINARY_NUMPY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {"max": np.maximum, "min": np.minimum}


#: Formats a 16-bit tensor can be stored in by :func:`execute` with ``storage=...``.
STORAGE_FORMATS: tuple[str, ...] = ("bfloat16", "float16")

Rounder = Callable[[np.ndarray], np.ndarray]


def round_to_bfloat16(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to the nearest bfloat16 (ties to even), returned as float32.

    bfloat16 is the upper half of a float32: round the lower 16 bits away with the usual
    bias trick on the integer view. NaN stays NaN (its payload is forced non-zero)."""
    f = np.ascontiguousarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(f), np.float32(np.nan), rounded)


def storage_rounder(bits: int, storage: str) -> Rounder | None:
    """How a tensor of ``bits`` is rounded when stored: 16 bits in ``storage`` (bfloat16 or
    float16), 32 bits as float32, 64 bits exactly (None)."""
    if storage not in STORAGE_FORMATS:
        raise ExecutionError(f"storage must be one of {', '.join(STORAGE_FORMATS)}, not {storage!r}")
    if bits == 64:
        return None
    if bits == 32:
        return lambda a: a.astype(np.float32)
    if bits == 16:
        if storage == "bfloat16":
            return round_to_bfloat16
        return lambda a: a.astype(np.float16).astype(np.float32)
    raise ExecutionError(f"cannot emulate a {bits}-bit storage format (16, 32 and 64 bits are supported)")


def resolve_dtype(dtype: str | np.dtype | type) -> np.dtype:
    d = np.dtype(dtype)
    if d not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ExecutionError(f"dtype {d} is not supported; use float32 or float64")
    return d


@dataclass(frozen=True)
class _Source:
    """An array padded along some dimensions, so out-of-range reads become plain reads."""

    array: np.ndarray
    pad_lo: tuple[int, ...]


def _padded(
    cascade: Cascade,
    tensor: str,
    array: np.ndarray,
    pad_lo: tuple[int, ...],
    pad_hi: tuple[int, ...],
    values: Mapping[str, np.ndarray],
) -> np.ndarray:
    if not any(pad_lo) and not any(pad_hi):
        return array
    out = np.pad(array, list(zip(pad_lo, pad_hi)))
    init = cascade.initial_axis(tensor)
    if init is not None and pad_lo[init[0]]:
        axis, depth = init
        hist = values[cascade.tensors[tensor].initial]  # type: ignore[index]
        if depth == 1 and hist.ndim == array.ndim - 1:
            hist = np.expand_dims(hist, axis)
        take = min(depth, pad_lo[axis])
        # history index h (0..depth-1) holds position h - depth; it lands at pad_lo + h - depth
        dst = [slice(p, p + s) for p, s in zip(pad_lo, array.shape)]
        src = [slice(None)] * array.ndim
        dst[axis] = slice(pad_lo[axis] - take, pad_lo[axis])
        src[axis] = slice(depth - take, depth)
        out[tuple(dst)] = hist[tuple(src)]
    return out


def _gathered(acc: Access) -> bool:
    """Whether an access reads by gathering (a stride, a sum of variables, a variable twice)
    rather than by slicing (each index a variable plus a constant, or a constant)."""
    shifted = [idx.shifted_variable() for idx in acc.indices]
    plain = [sv[0] for sv in shifted if sv is not None]
    return not all(sv is not None or not idx.terms for sv, idx in zip(shifted, acc.indices)) or len(set(plain)) != len(plain)


class _EinsumEvaluator:
    """Evaluates one Einsum; ``ranges`` restrict variables to ``[start, stop)``."""

    def __init__(self, cascade: Cascade, einsum: Einsum, sources: Mapping[str, _Source], dtype: np.dtype):
        self.cascade = cascade
        self.einsum = einsum
        self.sources = sources
        self.dtype = dtype
        self.vars = einsum.iteration_variables
        self.axis = {v: n for n, v in enumerate(self.vars)}
        self.reduced = set(einsum.reduced_variables)
        self.letters = dict(zip(self.vars, string.ascii_letters))
        self.terms = additive_terms(einsum.expr)

    # -- values -------------------------------------------------------------------------
    def load(self, acc: Access, ranges: Mapping[str, tuple[int, int]]) -> np.ndarray:
        src = self.sources[acc.tensor]
        return self._load_gathered(acc, src, ranges) if _gathered(acc) else self._load_sliced(acc, src, ranges)

    def _load_sliced(self, acc: Access, src: _Source, ranges) -> np.ndarray:
        key: list[slice | int] = []
        kept: list[str] = []
        for idx, pad in zip(acc.indices, src.pad_lo):
            sv = idx.shifted_variable()
            if sv is None:  # a constant index
                key.append(idx.const + pad)
                continue
            v, off = sv
            start, stop = ranges[v]
            key.append(slice(start + off + pad, stop + off + pad))
            kept.append(v)
        view = np.asarray(src.array[tuple(key)])  # (a rank-0 tensor's element: an array, not a numpy scalar)
        if not kept:
            return view.reshape([1] * len(self.vars))
        order = sorted(range(len(kept)), key=lambda n: self.axis[kept[n]])
        view = view.transpose(order)
        shape = [1] * len(self.vars)
        for n in order:
            shape[self.axis[kept[n]]] = view.shape[order.index(n)]
        return view.reshape(shape)

    def _load_gathered(self, acc: Access, src: _Source, ranges) -> np.ndarray:
        grids = {}
        for v in acc.variables:
            start, stop = ranges[v]
            shape = [1] * len(self.vars)
            shape[self.axis[v]] = stop - start
            grids[v] = np.arange(start, stop).reshape(shape)
        keys = []
        for idx, pad in zip(acc.indices, src.pad_lo):
            k = np.asarray(idx.const + pad).reshape([1] * len(self.vars))
            for v, c in idx.terms:
                k = k + c * grids[v]
            keys.append(k)
        inside = np.ones((), dtype=bool)
        for axis, k in enumerate(keys):  # a position past the padding reads zero, as padding does
            inside = inside & (k >= 0) & (k < src.array.shape[axis])
        if inside.all():
            return src.array[tuple(keys)]
        clipped = tuple(np.clip(k, 0, n - 1) for k, n in zip(keys, src.array.shape))
        return np.where(inside, src.array[clipped], 0).astype(src.array.dtype, copy=False)

    def value(self, expr: Expr, ranges) -> np.ndarray:
        if isinstance(expr, Access):
            return self.load(expr, ranges)
        if isinstance(expr, Const):
            return np.asarray(expr.value, dtype=self.dtype)
        if isinstance(expr, Param):
            return np.asarray(self.cascade.param_value(expr.name), dtype=self.dtype)
        if isinstance(expr, Unary):
            return UNARY_NUMPY[expr.fn](self.value(expr.arg, ranges))
        lhs = self.value(expr.lhs, ranges)
        rhs = self.value(expr.rhs, ranges)
        if expr.op == "+":
            return lhs + rhs
        if expr.op == "-":
            return lhs - rhs
        if expr.op == "*":
            return lhs * rhs
        if expr.op in BINARY_NUMPY:
            return BINARY_NUMPY[expr.op](lhs, rhs)
        return lhs / rhs

    # -- reductions ---------------------------------------------------------------------
    def _factors(self, expr: Expr) -> list[tuple[Expr, bool]]:
        """A product tree as ``(factor, is_divisor)`` pairs."""
        if isinstance(expr, Binary) and expr.op == "*":
            return self._factors(expr.lhs) + self._factors(expr.rhs)
        if isinstance(expr, Binary) and expr.op == "/":
            return self._factors(expr.lhs) + [(expr.rhs, True)]
        return [(expr, False)]

    def _sum_reduced_term(self, expr: Expr, ranges) -> np.ndarray:
        operands, subscripts = [], []
        scalar = np.asarray(1.0, dtype=self.dtype)
        for factor, divisor in self._factors(expr):
            val = self.value(factor, ranges)
            if divisor:
                val = 1.0 / val
            fvars = [v for v in self.vars if v in set(expr_variables(factor))]
            if not fvars:
                scalar = scalar * val
                continue
            squeeze = tuple(n for n, v in enumerate(self.vars) if v not in fvars)
            operands.append(val.squeeze(axis=squeeze))
            subscripts.append("".join(self.letters[v] for v in fvars))
        term_vars = set(expr_variables(expr))
        out_vars = [v for v in self.einsum.output_variables if v in term_vars]
        spec = ",".join(subscripts) + "->" + "".join(self.letters[v] for v in out_vars)
        result = np.einsum(spec, *operands, optimize=len(operands) > 1) * scalar
        shape = [1] * len(self.einsum.output_variables)
        for v, s in zip(out_vars, result.shape):
            shape[self.einsum.output_variables.index(v)] = s
        return result.reshape(shape)

    def _max_reduced_term(self, expr: Expr, sign: int, ranges) -> np.ndarray:
        """The ``max=`` reduction of a signed term: ``max_k(-a) = -min_k(a)``, so the
        sign goes in before it (``Y max= C - A[k]`` is ``C + max_k(-A)``; applied after, it was
        ``C - max_k(A)``, unlike ``C + neg(A)``)."""
        val = self.value(expr, ranges)
        full = [ranges[v][1] - ranges[v][0] for v in self.vars]
        val = np.broadcast_to(val if sign > 0 else -val, full)
        n_out = len(self.einsum.output_variables)
        return val.max(axis=tuple(range(n_out, len(self.vars))))

    def evaluate(self, ranges) -> np.ndarray:
        """The output over ``ranges``, axes in the output tensor's order."""
        n_out = len(self.einsum.output_variables)
        out_shape = [ranges[v][1] - ranges[v][0] for v in self.einsum.output_variables]
        total: np.ndarray | None = None
        for sign, term in self.terms:
            if set(expr_variables(term)) & self.reduced:
                if self.einsum.reduce_op == "sum":
                    val = self._sum_reduced_term(term, ranges)
                else:  # (the term's sign taken inside the reduction)
                    val, sign = self._max_reduced_term(term, sign, ranges), 1
            else:
                val = self.value(term, ranges)
                if val.ndim:
                    val = val.reshape(val.shape[:n_out]) if val.ndim == len(self.vars) else val
            total = (val if sign > 0 else -val) if total is None else (total + val if sign > 0 else total - val)
        assert total is not None
        return np.broadcast_to(total, out_shape).astype(self.dtype, copy=False)


def _source_for(
    cascade: Cascade,
    einsum: Einsum,
    tensor: str,
    values: Mapping[str, np.ndarray],
    sizes: Mapping[str, int],
) -> _Source:
    array = values[tensor]
    ndim = array.ndim
    lo = [0] * ndim
    hi = [0] * ndim
    for acc in einsum.inputs:
        if acc.tensor != tensor:
            continue
        init = cascade.initial_axis(tensor)
        for p, idx in enumerate(acc.indices):
            a, b = idx.bounds(sizes)
            # a gather reads zero past the padding itself: its padding is at most the tensor's extent
            # and its initial value's history (X[1000000000000*i] once padded X to 36 TiB)
            cap = array.shape[p] + (init[1] if init is not None and init[0] == p else 0) if _gathered(acc) else None
            lo[p] = max(lo[p], -a if cap is None else min(-a, cap))
            hi[p] = max(hi[p], b - (array.shape[p] - 1) if cap is None else min(b - (array.shape[p] - 1), cap))
    return _Source(_padded(cascade, tensor, array, tuple(lo), tuple(hi), values), tuple(lo))


def run_einsum(
    cascade: Cascade, einsum: Einsum, values: Mapping[str, np.ndarray], dtype: np.dtype, rounder: Rounder | None = None
) -> np.ndarray:
    """Evaluate one Einsum given the values of the tensors it reads; ``rounder`` (if any) rounds
    the result as it is stored, each step of a recurrence before the next step reads it."""
    sizes = cascade.variable_sizes
    sources = {
        t: _source_for(cascade, einsum, t, values, sizes) for t in einsum.input_tensors if t != einsum.name
    }
    full = {v: (0, sizes[v]) for v in einsum.iteration_variables}
    rec = cascade.recurrence(einsum)
    if rec is None:
        out = _EinsumEvaluator(cascade, einsum, sources, dtype).evaluate(full)
        return np.ascontiguousarray(out if rounder is None else rounder(out), dtype=dtype)

    rank, distance = rec
    shape = cascade.shape(einsum.name)
    axis = cascade.tensors[einsum.name].ranks.index(rank)
    pad_lo = tuple(distance if p == axis else 0 for p in range(len(shape)))
    buffer = _padded(cascade, einsum.name, np.zeros(shape, dtype), pad_lo, (0,) * len(shape), values)
    sources[einsum.name] = _Source(buffer, pad_lo)
    evaluator = _EinsumEvaluator(cascade, einsum, sources, dtype)
    var = rank.lower()
    for t in range(shape[axis]):
        step = dict(full)
        step[var] = (t, t + 1)
        dst = [slice(None)] * len(shape)
        dst[axis] = slice(distance + t, distance + t + 1)
        value = evaluator.evaluate(step)
        buffer[tuple(dst)] = value if rounder is None else rounder(value)
    keep = [slice(None)] * len(shape)
    keep[axis] = slice(distance, None)
    return np.ascontiguousarray(buffer[tuple(keep)])


#: Public name of an on-chip operand: ``array`` with ``pad_lo`` per dimension, so that index
#: ``x`` of the tensor reads ``array[x + pad_lo]`` (used by :mod:`mambalaya.execute.tiled`).
Source = _Source


def evaluate_einsum(
    cascade: Cascade,
    einsum: Einsum,
    sources: Mapping[str, _Source],
    ranges: Mapping[str, tuple[int, int]],
    dtype: np.dtype,
    *,
    carried: np.ndarray | None = None,
) -> np.ndarray:
    """Evaluate one Einsum over ``ranges`` (variable -> ``[start, stop)``) from given sources.

    ``sources`` maps every tensor the Einsum reads (other than itself) to a :data:`Source`
    covering what the accesses reach over ``ranges``. The result has the output tensor's axes
    in order, each of the length of its variable's range. A recurrence runs one step of its
    generational rank at a time; ``carried`` holds its output at the ``distance`` positions
    just before the range of that rank (axes in output order, that rank of length
    ``distance``, the others over ``ranges``); ``None`` means zeros.
    """
    rec = cascade.recurrence(einsum)
    if rec is None:
        return np.ascontiguousarray(_EinsumEvaluator(cascade, einsum, sources, dtype).evaluate(ranges))
    rank, distance = rec
    axis = cascade.tensors[einsum.name].ranks.index(rank)
    out_vars = einsum.output_variables
    shape = [ranges[v][1] - ranges[v][0] for v in out_vars]
    steps = shape[axis]
    buffer_shape = list(shape)
    buffer_shape[axis] += distance
    buffer = np.zeros(buffer_shape, dtype)
    head = [slice(None)] * len(shape)
    head[axis] = slice(0, distance)
    if carried is not None:
        buffer[tuple(head)] = carried
    pad = tuple(distance - ranges[v][0] if p == axis else -ranges[v][0] for p, v in enumerate(out_vars))
    own = dict(sources)
    own[einsum.name] = _Source(buffer, pad)
    evaluator = _EinsumEvaluator(cascade, einsum, own, dtype)
    var = out_vars[axis]
    start = ranges[var][0]
    for t in range(steps):
        step = dict(ranges)
        step[var] = (start + t, start + t + 1)
        dst = [slice(None)] * len(shape)
        dst[axis] = slice(distance + t, distance + t + 1)
        buffer[tuple(dst)] = evaluator.evaluate(step)
    keep = [slice(None)] * len(shape)
    keep[axis] = slice(distance, None)
    return np.ascontiguousarray(buffer[tuple(keep)])


def check_arrays(cascade: Cascade, arrays: Mapping[str, np.ndarray], dtype: np.dtype) -> dict[str, np.ndarray]:
    """The external arrays as ``dtype``, or an :class:`ExecutionError` naming what is wrong."""
    needed = cascade.external_tensors()
    unknown = sorted(set(arrays) - set(cascade.tensors))
    if unknown:
        raise ExecutionError(
            f"arrays {', '.join(unknown)} are not tensors of cascade {cascade.name!r}; "
            f"it reads {', '.join(needed)}"
        )
    produced = sorted(t for t in arrays if cascade.producer(t) is not None)
    if produced:
        raise ExecutionError(f"arrays {', '.join(produced)} are computed by the cascade and cannot be given")
    missing = [t for t in needed if t not in arrays]
    if missing:
        roles = ", ".join(f"{t} ({cascade.tensors[t].role.value}, shape {cascade.shape(t)})" for t in missing)
        raise ExecutionError(f"cascade {cascade.name!r} needs arrays that were not given: {roles}")
    out = {}
    for t in needed:
        a = np.asarray(arrays[t])
        if a.shape != cascade.shape(t):
            ranks = ", ".join(cascade.tensors[t].ranks)
            raise ExecutionError(
                f"array {t} has shape {a.shape} but tensor {t}[{ranks}] has shape {cascade.shape(t)}"
            )
        if not np.issubdtype(a.dtype, np.number):
            raise ExecutionError(f"array {t} has dtype {a.dtype}, not a number type")
        if cascade.tensors[t].mask is not None and (wrong := mask_contradiction(cascade, t, a)) is not None:
            raise ExecutionError(f"array {t} is not the mask tensor {t} declares ({cascade.tensors[t].mask}): {wrong}; "
                                 "the cost model skips the work the declaration makes dead, so its values must agree")
        out[t] = np.ascontiguousarray(a, dtype=dtype)
    return out


def last_uses(cascade: Cascade) -> dict[str, int]:
    """Index of the last Einsum reading each tensor (-1 if none)."""
    last = {t: -1 for t in cascade.tensors}
    for n, e in enumerate(cascade.einsums):
        for t in e.input_tensors + cascade.initial_reads(e):
            last[t] = n
    return last


def execute(
    cascade: Cascade,
    arrays: Mapping[str, np.ndarray],
    *,
    dtype: str | np.dtype = "float64",
    keep: str = "outputs",
    storage: str | None = None,
) -> dict[str, np.ndarray]:
    """Run ``cascade`` on the given input, weight and state arrays.

    ``keep="outputs"`` returns the outputs and outgoing states and frees every intermediate
    after its last reader; ``keep="all"`` returns every tensor, the given ones included.

    ``storage`` emulates the tensors' declared widths (:attr:`TensorSpec.bits`, set by a
    precision policy): every given array and every computed tensor is rounded as it is stored,
    16-bit tensors to ``storage`` (``bfloat16`` or ``float16``), 32-bit ones to float32, while
    arithmetic runs in ``dtype``. ``None`` (the default) stores everything in ``dtype``.
    """
    if keep not in ("outputs", "all"):
        raise ExecutionError(f"keep must be 'outputs' or 'all', not {keep!r}")
    dt = resolve_dtype(dtype)
    values: dict[str, np.ndarray] = check_arrays(cascade, arrays, dt)
    rounders = {}
    if storage is not None:
        rounders = {t: storage_rounder(spec.bits, storage) for t, spec in cascade.tensors.items()}
        for t, a in values.items():
            if rounders[t] is not None:
                values[t] = np.ascontiguousarray(rounders[t](a), dtype=dt)
    wanted = set(cascade.output_tensors())
    last = last_uses(cascade)
    with np.errstate(over="ignore", under="ignore"):
        for n, e in enumerate(cascade.einsums):
            values[e.name] = run_einsum(cascade, e, values, dt, rounders.get(e.name))
            if keep == "outputs":
                for t in e.input_tensors + cascade.initial_reads(e):
                    if last[t] == n and t not in wanted and cascade.producer(t) is not None:
                        del values[t]
    if keep == "outputs":
        return {t: values[t] for t in cascade.output_tensors()}
    return values


def carry_states(cascade: Cascade, results: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The incoming-state arrays of the next step, from a run's outgoing states.

    Each tensor with ``updates: S`` gives state ``S``; ranks of size 1 that ``S`` lacks are
    dropped (the decode step's ``H[b,i,e,n]`` with ``I=1`` becomes ``H0[b,e,n]``). A layer
    whose recurrent scan (its ``ssm`` region, as the Mamba and Gated DeltaNet builders mark it)
    carries no state out was built without ``state_io``: asking it for its states is a
    SpecError saying so, not an empty result.
    """
    if "ssm" in cascade.regions and not any(spec.updates for spec in cascade.tensors.values()):
        raise SpecError(
            f"cascade {cascade.name!r} runs a recurrent scan but carries no state out: it was built without state_io, "
            "so it writes no final recurrent or conv states (HN, CS*N) for a next step to continue from; build the "
            "prefill with state_io=True (build_layer(..., state_io=True), gdn_layer(..., state_io=True), "
            "mamba2_layer(..., state_io=True)) to hand its states to decode")
    out: dict[str, np.ndarray] = {}
    for t, spec in cascade.tensors.items():
        if spec.updates is None:
            continue
        if t not in results:
            raise ExecutionError(f"the results have no {t}, which carries state {spec.updates}")
        target = cascade.tensors[spec.updates]
        arr = np.asarray(results[t])
        extra = tuple(p for p, r in enumerate(spec.ranks) if r not in target.ranks)
        arr = arr.squeeze(axis=extra) if extra else arr
        kept = [r for r in spec.ranks if r in target.ranks]
        out[spec.updates] = np.ascontiguousarray(arr.transpose([kept.index(r) for r in target.ranks]))
    return out


def input_roles(cascade: Cascade) -> dict[str, Role]:
    return {t: cascade.tensors[t].role for t in cascade.external_tensors()}
