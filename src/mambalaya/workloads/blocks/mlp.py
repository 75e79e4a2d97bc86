"""A pre-norm gated MLP block (RMSNorm, SwiGLU feed-forward, residual) as a cascade of extended
Einsums: transformers' ``LlamaMLP``-style ``down_proj(silu(gate_proj(x)) * up_proj(x))`` with
no bias, as the hybrid models' feed-forward layers run it (``BambaMLP``, Nemotron-H's and
Granite's dense MLPs), behind the ``pre_ff_layernorm`` and inside the residual.

Ranks: ``B`` batch, ``I`` position, ``D`` hidden size, ``F`` intermediate size.

* ``SS``, ``RS``, ``XN``: RMSNorm over ``D``
* ``GT[b,i,f] = XN[b,i,d]*WG[d,f]`` and ``UP[b,i,f] = XN[b,i,d]*WU[d,f]``
* ``HM[b,i,f] = silu(GT[b,i,f])*UP[b,i,f]``
* ``O[b,i,d] = HM[b,i,f]*WDN[f,d]`` and ``XO[b,i,d] = X[b,i,d] + O[b,i,d]``

Decode is the same cascade with ``I = 1``: an MLP keeps no state. ``chunk_size`` lays the
positions out as ``C`` chunks of ``Q`` (``[b,c,q]`` for ``[b,i]``), as the chunked Mamba-2
cascade writes its output, so the MLP can follow that mixer in one cascade.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field, PositiveInt

from mambalaya.specio import SPEC_MODEL_CONFIG

from mambalaya.errors import SpecError
from mambalaya.workloads.checks import check_layer_args, validated_config
from mambalaya.einsum.cascade import Cascade, build_cascade
from mambalaya.einsum.ir import Rank, Role, TensorSpec
from mambalaya.einsum.parse import parse_einsum

Phase = Literal["prefill", "decode"]


class MLPConfig(BaseModel):
    """``d_model`` [hidden_size], ``d_ff`` [intermediate_size], ``norm_eps`` [rms_norm_eps]."""

    model_config = SPEC_MODEL_CONFIG

    d_model: PositiveInt
    d_ff: PositiveInt
    norm_eps: float = Field(1e-5, gt=0)

    def layer_parameters(self) -> int:
        """Weight elements: the pre-norm and the three projections (no bias)."""
        return self.d_model + 3 * self.d_model * self.d_ff


def parse_mlp_config(data: dict, *, source: str = "MLP config") -> MLPConfig:
    return validated_config(MLPConfig, data, what="MLP", source=source)


_EINSUMS: tuple[str, ...] = (
    "SS[b,{o}] = X[b,{o},d]*X[b,{o},d]",
    "RS[b,{o}] = rsqrt(SS[b,{o}]/D + eps)",
    "XN[b,{o},d] = X[b,{o},d]*RS[b,{o}]*WN[d]",
    "GT[b,{o},f] = XN[b,{o},d]*WG[d,f]",
    "UP[b,{o},f] = XN[b,{o},d]*WU[d,f]",
    "HM[b,{o},f] = silu(GT[b,{o},f])*UP[b,{o},f]",
    "O[b,{o},d] = HM[b,{o},f]*WDN[f,d]",
    "XO[b,{o},d] = X[b,{o},d] + O[b,{o},d]",
)
EINSUMS: tuple[str, ...] = tuple(line.format(o="i") for line in _EINSUMS)

_W, _X = Role.WEIGHT, Role.INTERMEDIATE
_TENSORS: dict[str, tuple[tuple[str, ...], Role, str]] = {
    "X": (("B", "*", "D"), Role.INPUT, "block input (residual stream)"),
    "WN": (("D",), _W, "pre-feed-forward RMSNorm weight"),
    "SS": (("B", "*"), _X, "sum of squares"),
    "RS": (("B", "*"), _X, "reciprocal RMS"),
    "XN": (("B", "*", "D"), _X, "normalised input"),
    "WG": (("D", "F"), _W, "gate_proj"),
    "WU": (("D", "F"), _W, "up_proj"),
    "GT": (("B", "*", "F"), _X, "gate pre-activation"),
    "UP": (("B", "*", "F"), _X, "up projection"),
    "HM": (("B", "*", "F"), _X, "silu(gate) x up"),
    "WDN": (("F", "D"), _W, "down_proj"),
    "O": (("B", "*", "D"), _X, "feed-forward output"),
    "XO": (("B", "*", "D"), Role.OUTPUT, "block output (residual stream)"),
}

#: The weight tensors of a block (what the loader returns).
WEIGHTS: tuple[str, ...] = ("WN", "WG", "WU", "WDN")


def mlp_layer(
    config: MLPConfig, *, batch: int, seq_len: int, phase: Phase = "prefill", bits: int = 16,
    chunk_size: int | None = None, name: str | None = None,
) -> Cascade:
    """One gated MLP block over ``seq_len`` positions (prefill) or one (decode); with
    ``chunk_size``, over ``C = ceil(seq_len/chunk_size)`` chunks of ``Q = chunk_size``."""
    check_layer_args(phase, batch=batch, seq_len=seq_len, bits=bits)
    positions = 1 if phase == "decode" else seq_len
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1):
        raise SpecError(f"chunk_size must be a positive integer, not {chunk_size!r}")
    if chunk_size is None:
        where, index = [Rank("I", positions, "L" if phase == "prefill" else "1")], "i"
    else:
        where = [Rank("C", math.ceil(positions / chunk_size), "ceil(L/chunk_size)"), Rank("Q", chunk_size, "chunk_size")]
        index = "c,q"
    ranks = [Rank("B", batch, "batch"), *where, Rank("D", config.d_model, "hidden_size"),
             Rank("F", config.d_ff, "intermediate_size")]
    sizes = {r.name: r.size for r in ranks}
    at = tuple(r.name for r in where)
    params = {"batch": batch, "L": positions, "hidden_size": config.d_model, "intermediate_size": config.d_ff,
              "eps": config.norm_eps}
    if chunk_size is not None:
        params["chunk_size"] = chunk_size
    return build_cascade(
        name=name or f"mlp-{phase}",
        params=params,
        ranks=ranks,
        tensors=[TensorSpec(t, _at(rk, at), role, bits, description=d) for t, (rk, role, d) in _TENSORS.items()],
        einsums=[parse_einsum(line.format(o=index), sizes=sizes) for line in _EINSUMS],
        description=f"gated MLP block, {phase}, hidden {config.d_model}, intermediate {config.d_ff}, "
        f"batch={batch}, I={positions}",
    )


def _at(ranks: tuple[str, ...], positions: tuple[str, ...]) -> tuple[str, ...]:
    """``ranks`` with ``*`` replaced by the position ranks."""
    out: list[str] = []
    for r in ranks:
        out.extend(positions if r == "*" else (r,))
    return tuple(out)


__all__ = ["EINSUMS", "MLPConfig", "WEIGHTS", "mlp_layer", "parse_mlp_config"]
