"""The Mamba-1 block (RMSNorm, mixer, residual) as a cascade of extended Einsums.

The cascade follows DESIGN.md §3 and the reference implementation (state-spaces/mamba,
transformers' ``MambaBlock`` on its CPU path) operation for operation:

====  ==========================================================  =====================
 #     Einsum                                                       what
====  ==========================================================  =====================
 1     ``SS[b,i] = X[b,i,d]*X[b,i,d]``                              RMSNorm: sum of squares
 2     ``RS[b,i] = rsqrt(SS[b,i]/D + eps)``                         RMSNorm: scale
 3     ``XN[b,i,d] = X[b,i,d]*RS[b,i]*WN[d]``                       RMSNorm: apply
 4-5   ``XI``, ``Z`` = ``XN`` times the halves of in_proj           GEMMs
 6     ``XC[b,i,e] = XI[b,i+k-(K-1),e]*WC[e,k] + BC[e]``            causal depthwise conv
 7     ``U = silu(XC)``
 8-10  ``DL``, ``BM``, ``CM`` = ``U`` times the parts of x_proj     GEMMs
 11    ``DT[b,i,e] = DL[b,i,r]*WDT[r,e] + BDT[e]``                  dt_proj with bias
 12    ``DELTA = softplus(DT)``
 13    ``AD[b,i,e,n] = exp(DELTA[b,i,e]*A[e,n])``                   discretised A
 14    ``BX[b,i,e,n] = DELTA[b,i,e]*U[b,i,e]*BM[b,i,n]``            discretised B times x
 15    ``H[b,i,e,n] = AD[b,i,e,n]*H[b,i-1,e,n] + BX[b,i,e,n]``      the scan (recurrent in I)
 16    ``YS[b,i,e] = H[b,i,e,n]*CM[b,i,n]``                         C readout
 17    ``YD = YS + U*DS``                                           D skip
 18-19 ``G = silu(Z)``, ``YG = YD*G``                               gate
 20    ``O[b,i,d] = YG[b,i,e]*WO[e,d]``                             out_proj
 21    ``XO = X + O``                                               residual
====  ==========================================================  =====================

``A`` is the weight ``-exp(A_log)`` (the loader computes it; it is input independent).
With state in/out (always in decode) the SSM state ``H0[b,e,n]`` is the initial value of
``H`` and the conv state ``CS0[b,j,e]`` (the last ``K-1`` conv inputs) that of ``XI``; the
outgoing states are ``H`` itself when ``I=1`` (else ``HN``, its last position) and ``CSN``.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import ClassVar, Literal

from pydantic import BaseModel, Field, PositiveInt

from mambalaya.specio import SPEC_MODEL_CONFIG

from mambalaya.errors import SpecError
from mambalaya.workloads.checks import check_layer_args, validated_config
from mambalaya.einsum.cascade import Cascade, build_cascade
from mambalaya.einsum.ir import Rank, Role, TensorSpec
from mambalaya.einsum.parse import parse_einsum

Phase = Literal["prefill", "decode"]


class Mamba1Config(BaseModel):
    """A Mamba-1 model's shape (the fields of state-spaces/mamba's ``MambaConfig``)."""

    model_config = SPEC_MODEL_CONFIG
    #: Fields a model file must give: the layer count has no published default.
    FILE_REQUIRED_FIELDS: ClassVar[tuple[str, ...]] = ("n_layers",)

    d_model: PositiveInt
    n_layers: PositiveInt = 1
    d_state: PositiveInt = 16
    expand: PositiveInt = 2
    d_conv: PositiveInt = 4
    dt_rank: PositiveInt | Literal["auto"] = "auto"
    vocab_size: PositiveInt = 50280
    norm_eps: float = Field(1e-5, gt=0)
    #: Whether the LM head shares the embedding's weights (state-spaces checkpoints: yes).
    tie_embeddings: bool = True
    family: Literal["mamba1"] = "mamba1"

    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model

    @property
    def dt_rank_value(self) -> int:
        return math.ceil(self.d_model / 16) if self.dt_rank == "auto" else int(self.dt_rank)

    def layer_parameters(self) -> int:
        """Weight elements of one block, counted from the published module shapes."""
        d, e, n, r, k = self.d_model, self.d_inner, self.d_state, self.dt_rank_value, self.d_conv
        return d + 2 * d * e + e * k + e + e * (r + 2 * n) + r * e + e + e * n + e + e * d

    def model_parameters(self, layer_parameters: int | None = None) -> int:
        """Embedding (and the LM head unless tied) + n_layers blocks + the final norm."""
        per_layer = self.layer_parameters() if layer_parameters is None else layer_parameters
        embed = self.vocab_size * self.d_model * (1 if self.tie_embeddings else 2)
        return embed + self.n_layers * per_layer + self.d_model


#: Published configurations of state-spaces/mamba-{130m,370m,790m,1.4b,2.8b}.
PRESETS: dict[str, Mamba1Config] = {
    "mamba-130m": Mamba1Config(d_model=768, n_layers=24),
    "mamba-370m": Mamba1Config(d_model=1024, n_layers=48),
    "mamba-790m": Mamba1Config(d_model=1536, n_layers=48),
    "mamba-1.4b": Mamba1Config(d_model=2048, n_layers=48),
    "mamba-2.8b": Mamba1Config(d_model=2560, n_layers=64),
}

#: Whole-model parameter counts as published (millions), for the tests.
PUBLISHED_PARAMETERS_M: dict[str, float] = {
    "mamba-130m": 129.1,
    "mamba-370m": 371.5,
    "mamba-790m": 793.2,
    "mamba-1.4b": 1372.2,
    "mamba-2.8b": 2768.3,
}

EINSUMS: tuple[str, ...] = (
    "SS[b,i] = X[b,i,d]*X[b,i,d]",
    "RS[b,i] = rsqrt(SS[b,i]/D + eps)",
    "XN[b,i,d] = X[b,i,d]*RS[b,i]*WN[d]",
    "XI[b,i,e] = XN[b,i,d]*WX[d,e]",
    "Z[b,i,e] = XN[b,i,d]*WZ[d,e]",
    "XC[b,i,e] = XI[b,i+k-(K-1),e]*WC[e,k] + BC[e]",
    "U[b,i,e] = silu(XC[b,i,e])",
    "DL[b,i,r] = U[b,i,e]*WDL[e,r]",
    "BM[b,i,n] = U[b,i,e]*WB[e,n]",
    "CM[b,i,n] = U[b,i,e]*WCM[e,n]",
    "DT[b,i,e] = DL[b,i,r]*WDT[r,e] + BDT[e]",
    "DELTA[b,i,e] = softplus(DT[b,i,e])",
    "AD[b,i,e,n] = exp(DELTA[b,i,e]*A[e,n])",
    "BX[b,i,e,n] = DELTA[b,i,e]*U[b,i,e]*BM[b,i,n]",
    "H[b,i,e,n] = AD[b,i,e,n]*H[b,i-1,e,n] + BX[b,i,e,n]",
    "YS[b,i,e] = H[b,i,e,n]*CM[b,i,n]",
    "YD[b,i,e] = YS[b,i,e] + U[b,i,e]*DS[e]",
    "G[b,i,e] = silu(Z[b,i,e])",
    "YG[b,i,e] = YD[b,i,e]*G[b,i,e]",
    "O[b,i,d] = YG[b,i,e]*WO[e,d]",
    "XO[b,i,d] = X[b,i,d] + O[b,i,d]",
)

_TENSORS: dict[str, tuple[tuple[str, ...], Role, str]] = {
    "X": (("B", "I", "D"), Role.INPUT, "layer input (residual stream)"),
    "WN": (("D",), Role.WEIGHT, "RMSNorm weight"),
    "SS": (("B", "I"), Role.INTERMEDIATE, "sum of squares"),
    "RS": (("B", "I"), Role.INTERMEDIATE, "reciprocal RMS"),
    "XN": (("B", "I", "D"), Role.INTERMEDIATE, "normalised input"),
    "WX": (("D", "E"), Role.WEIGHT, "in_proj, x half"),
    "WZ": (("D", "E"), Role.WEIGHT, "in_proj, z half"),
    "XI": (("B", "I", "E"), Role.INTERMEDIATE, "conv input"),
    "Z": (("B", "I", "E"), Role.INTERMEDIATE, "gate branch"),
    "WC": (("E", "K"), Role.WEIGHT, "conv1d weight"),
    "BC": (("E",), Role.WEIGHT, "conv1d bias"),
    "XC": (("B", "I", "E"), Role.INTERMEDIATE, "conv output"),
    "U": (("B", "I", "E"), Role.INTERMEDIATE, "SSM input u = silu(conv)"),
    "WDL": (("E", "R"), Role.WEIGHT, "x_proj, dt part"),
    "WB": (("E", "N"), Role.WEIGHT, "x_proj, B part"),
    "WCM": (("E", "N"), Role.WEIGHT, "x_proj, C part"),
    "DL": (("B", "I", "R"), Role.INTERMEDIATE, "low-rank dt"),
    "BM": (("B", "I", "N"), Role.INTERMEDIATE, "input-dependent B"),
    "CM": (("B", "I", "N"), Role.INTERMEDIATE, "input-dependent C"),
    "WDT": (("R", "E"), Role.WEIGHT, "dt_proj weight"),
    "BDT": (("E",), Role.WEIGHT, "dt_proj bias"),
    "DT": (("B", "I", "E"), Role.INTERMEDIATE, "dt before softplus"),
    "DELTA": (("B", "I", "E"), Role.INTERMEDIATE, "step size"),
    "A": (("E", "N"), Role.WEIGHT, "A = -exp(A_log)"),
    "AD": (("B", "I", "E", "N"), Role.INTERMEDIATE, "discretised A"),
    "BX": (("B", "I", "E", "N"), Role.INTERMEDIATE, "discretised B times u"),
    "H": (("B", "I", "E", "N"), Role.INTERMEDIATE, "SSM state over positions"),
    "YS": (("B", "I", "E"), Role.INTERMEDIATE, "scan output"),
    "DS": (("E",), Role.WEIGHT, "D skip weight"),
    "YD": (("B", "I", "E"), Role.INTERMEDIATE, "scan output plus skip"),
    "G": (("B", "I", "E"), Role.INTERMEDIATE, "silu(z) gate"),
    "YG": (("B", "I", "E"), Role.INTERMEDIATE, "gated output"),
    "WO": (("E", "D"), Role.WEIGHT, "out_proj weight"),
    "O": (("B", "I", "D"), Role.INTERMEDIATE, "mixer output"),
    "XO": (("B", "I", "D"), Role.OUTPUT, "layer output (residual stream)"),
}

#: The selective-scan region Geens et al. fuse ("Fuse-All"): discretisation, scan, readout.
SSM_REGION: tuple[str, ...] = ("AD", "BX", "H", "YS")

WEIGHTS: tuple[str, ...] = tuple(t for t, (_, role, _) in _TENSORS.items() if role == Role.WEIGHT)


def parse_config(data: dict, *, source: str = "model config") -> Mamba1Config:
    return validated_config(Mamba1Config, data, what="Mamba-1", source=source)


def mamba1_layer(
    config: Mamba1Config,
    *,
    batch: int,
    seq_len: int,
    phase: Phase = "prefill",
    bits: int = 16,
    state_io: bool | None = None,
    name: str | None = None,
) -> Cascade:
    """One Mamba-1 block as a cascade.

    ``phase="prefill"`` iterates ``I = seq_len`` positions from a zero state (``state_io=True``
    reads an incoming state and writes the outgoing one, for chunked prefill);
    ``phase="decode"`` is one generation step: ``I = 1``, state in and out.
    """
    check_layer_args(phase, batch=batch, seq_len=seq_len, bits=bits)
    positions = 1 if phase == "decode" else seq_len
    with_state = phase == "decode" if state_io is None else state_io
    if phase == "decode" and not with_state:
        raise SpecError("a decode step reads and writes the SSM and conv states; state_io cannot be False")

    c = config
    ranks = [
        Rank("B", batch, "batch"),
        Rank("I", positions, "L"),
        Rank("D", c.d_model, "d_model"),
        Rank("E", c.d_inner, "expand*d_model"),
        Rank("N", c.d_state, "d_state"),
        Rank("R", c.dt_rank_value, "ceil(d_model/16)" if c.dt_rank == "auto" else "dt_rank"),
        Rank("K", c.d_conv, "d_conv"),
    ]
    params: dict[str, float] = {
        "batch": batch,
        "L": positions,
        "d_model": c.d_model,
        "expand": c.expand,
        "d_state": c.d_state,
        "d_conv": c.d_conv,
        "eps": c.norm_eps,
    }
    if c.dt_rank != "auto":
        params["dt_rank"] = c.dt_rank
    tensors = {n: TensorSpec(n, r, role, bits, description=d) for n, (r, role, d) in _TENSORS.items()}
    lines = list(EINSUMS)
    if with_state:
        if c.d_conv > 1:
            ranks.append(Rank("J", c.d_conv - 1, "d_conv-1"))
            tensors["CS0"] = TensorSpec("CS0", ("B", "J", "E"), Role.STATE, bits, description="incoming conv state")
            tensors["CSN"] = TensorSpec(
                "CSN", ("B", "J", "E"), Role.STATE, bits, updates="CS0", description="outgoing conv state"
            )
            tensors["XI"] = replace(tensors["XI"], initial="CS0")
            lines.append("CSN[b,j,e] = XI[b,j+I-(K-1),e]")
        tensors["H0"] = TensorSpec("H0", ("B", "E", "N"), Role.STATE, bits, description="incoming SSM state")
        if positions == 1:
            tensors["H"] = replace(
                tensors["H"], role=Role.STATE, initial="H0", updates="H0", description="SSM state, outgoing (I = 1)"
            )
        else:
            tensors["H"] = replace(tensors["H"], initial="H0")
            tensors["HN"] = TensorSpec(
                "HN", ("B", "E", "N"), Role.STATE, bits, updates="H0", description="outgoing SSM state"
            )
            lines.append("HN[b,e,n] = H[b,I-1,e,n]")
    sizes = {r.name: r.size for r in ranks}
    einsums = [parse_einsum(line, sizes=sizes) for line in lines]
    return build_cascade(
        name=name or f"mamba1-{phase}",
        params=params,
        ranks=ranks,
        tensors=list(tensors.values()),
        einsums=einsums,
        description=f"Mamba-1 block, {phase}, d_model={c.d_model}, batch={batch}, I={positions}",
        regions={"ssm": SSM_REGION},
    )
