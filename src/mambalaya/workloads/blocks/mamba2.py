"""The Mamba-2 (SSD) block (RMSNorm, Mamba2Mixer, residual) as a cascade of extended Einsums.

The cascade follows transformers' ``Mamba2Block`` on its CPU torch path (and state-spaces'
``Mamba2`` with ``rmsnorm=True, norm_before_gate=False``) operation for operation.

Ranks: ``B`` batch, ``I`` position, ``D`` d_model, ``G`` groups (``ngroups``), ``R`` heads per
group (``nheads/ngroups``), ``P`` head dim, ``N`` d_state, ``K`` conv taps, ``J = K-1`` conv
history; the chunked scan adds ``C`` chunks, ``Q`` positions in a chunk and ``S`` (a second
position in a chunk, size ``Q``). Head ``h = g*R + r`` and channel ``e = h*P + p`` of d_inner, so
every head-indexed tensor carries ``[g,r]`` (affine indices only: no ``h // R``) and B/C are
shared by the ``R`` heads of their group.

Shared front (both scan forms), over ``I``:

====  ===========================================================  ========================
 #     Einsum                                                        what
====  ===========================================================  ========================
 1-3   ``SS``, ``RS``, ``XN``                                        pre-norm RMSNorm
 4-8   ``Z``, ``XI``, ``BI``, ``CI``, ``DT`` = ``XN`` x in_proj        z, x, B, C, dt (+dt_bias)
 9-11  ``XC[b,i,g,r,p] = XI[b,i+k-(K-1),g,r,p]*WCX[g,r,p,k] + BCX``  causal depthwise conv
       (and ``BC``, ``CC`` the same over B and C)                    (three weight slices)
 12-14 ``U``, ``BM``, ``CM`` = silu of the conv outputs
 15    ``DELTA[b,i,g,r] = softplus(DT[b,i,g,r])``                    dt (limit (0, inf): none)
====  ===========================================================  ========================

``scan="recurrent"`` (the SSM form; also the only decode form):

* ``AD[b,i,g,r] = exp(DELTA[b,i,g,r]*A[g,r])``
* ``BX[b,i,g,r,p,n] = DELTA[b,i,g,r]*U[b,i,g,r,p]*BM[b,i,g,n]``
* ``H[b,i,g,r,p,n] = AD[b,i,g,r]*H[b,i-1,g,r,p,n] + BX[b,i,g,r,p,n]``  (recurrence over ``I``)
* ``YS[b,i,g,r,p] = H[b,i,g,r,p,n]*CM[b,i,g,n]`` and ``YD = YS + U*DS``

``scan="chunked"`` (the SSD algorithm; position ``i = c*Q+q``, ``Q = chunk_size``):

* ``XDT[b,c,q,g,r,p] = DELTA[b,c*Q+q,g,r]*U[b,c*Q+q,g,r,p]`` (discretised x, written in the
  chunk view so that every Einsum of the SSD writes the chunk rank C and a group can tile it)
* ``ACS[b,c,q,g,r] = ACS[b,c,q-1,g,r] + DELTA[b,c*Q+q,g,r]*A[g,r]``  cumulative log decay,
  a recurrence over ``Q`` only (restarts at 0 in every chunk)
* ``LD[b,c,q,s,g,r] = exp(ACS[b,c,q,g,r] - ACS[b,c,s,g,r] + LM[q,s])``  segment decay, masked
* ``CB[b,c,q,s,g] = CM[b,c*Q+q,g,n]*BM[b,c*Q+s,g,n]``                   C.B scores per group
* ``YDG[b,c,q,g,r,p] = CB[b,c,q,s,g]*LD[b,c,q,s,g,r]*XDT[b,c,s,g,r,p]``  intra-chunk output
* ``DC[b,c,q,g,r] = exp(ACS[b,c,Q-1,g,r] - ACS[b,c,q,g,r])``          decay to the chunk's end
* ``ST[b,c,g,r,p,n] = DC[b,c,q,g,r]*XDT[b,c,q,g,r,p]*BM[b,c*Q+q,g,n]``  each chunk's state
* ``CD[b,c,g,r] = exp(ACS[b,c,Q-1,g,r])``                             a whole chunk's decay
* ``HC[b,c,g,r,p,n] = CD[b,c,g,r]*HC[b,c-1,g,r,p,n] + ST[b,c,g,r,p,n]``  recurrence over ``C``
  only: ``HC[c]`` is the SSM state at the end of chunk ``c``
* ``DO[b,c,q,g,r] = exp(ACS[b,c,q,g,r])``                             decay from the chunk start
* ``YO[b,c,q,g,r,p] = CM[b,c*Q+q,g,n]*HC[b,c-1,g,r,p,n]``             state-to-output
* ``YD[b,c,q,g,r,p] = YDG + DO*YO + U[b,c*Q+q,g,r,p]*DS[g,r]``

``LM[Q,S]`` is a constant input, the causal mask in log space: ``0`` where ``s <= q`` and
``-inf`` above the diagonal (the IR has no comparisons; ``exp(... + -inf) = 0`` with no
overflow, as transformers' ``segment_sum`` does). :func:`mamba2_constants` returns it, and
the cascade declares it (:class:`~mambalaya.einsum.ir.Mask`), so that the cost model skips the
pairs ``s > q`` of ``LD`` and ``YDG`` (:mod:`mambalaya.einsum.dead_work`), as ``mamba_ssm``'s
chunk-scan kernel stops its key loop at the diagonal.
Positions ``c*Q+q >= L`` (when ``L`` is not a multiple of ``Q``) read zeros, exactly
transformers' ``pad_tensor_by_size``: they add nothing to any state, and their output rows
are zero. ``C = ceil(L/Q)``.

Shared tail (over ``[b,i]`` in the recurrent form, ``[b,c,q]`` in the chunked form, reading
the ``I``-indexed tensors at ``c*Q+q``): ``G = silu(Z)``, ``YG = YD*G`` (gate *before* the
norm: ``norm_before_gate=False``), the gated RMSNorm over each group's ``R*P`` channels
(``SG``, ``RG``, ``YN`` with weight ``WGN``), ``O = YN x out_proj``, ``XO = X + O``. In the
chunked form the output ``XO`` is ``[B,C,Q,D]`` (reshape to ``[B,C*Q,D]`` and keep the first
``L`` rows).

State (always in decode; ``state_io=True`` in prefill, both scan forms): incoming conv states
``CSX0[b,j,g,r,p]``, ``CSB0[b,j,g,n]``, ``CSC0[b,j,g,n]`` (the last ``K-1`` conv inputs, oldest
first) are the initial values of ``XI``, ``BI``, ``CI``; the incoming SSM state ``H0[b,g,r,p,n]``
is the initial value of ``H`` (recurrent) or ``HC`` (chunked). Outgoing: ``CSXN``, ``CSBN``,
``CSCN`` and ``HN`` (or ``H`` itself when ``I = 1``).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import ClassVar, Literal

import numpy as np
from pydantic import BaseModel, Field, PositiveInt, model_validator

from mambalaya.specio import SPEC_MODEL_CONFIG

from mambalaya.errors import SpecError
from mambalaya.workloads.checks import check_layer_args, validated_config
from mambalaya.workloads.blocks.masks import causal_band, causal_mask, with_masks
from mambalaya.einsum.cascade import Cascade, build_cascade
from mambalaya.einsum.ir import Rank, Role, TensorSpec
from mambalaya.einsum.parse import parse_einsum

Phase = Literal["prefill", "decode"]
Scan = Literal["recurrent", "chunked"]


class Mamba2Config(BaseModel):
    """A Mamba-2 model's shape (the fields of state-spaces/mamba's ``Mamba2`` mixer and
    ``MambaConfig``; transformers calls them hidden_size, state_size, head_dim, n_groups, ...)."""

    model_config = SPEC_MODEL_CONFIG
    #: Fields a model file must give: the layer count has no published default.
    FILE_REQUIRED_FIELDS: ClassVar[tuple[str, ...]] = ("n_layers",)

    d_model: PositiveInt
    n_layers: PositiveInt = 1
    d_state: PositiveInt = 128
    headdim: PositiveInt = 64
    ngroups: PositiveInt = 1
    expand: PositiveInt = 2
    #: The Mamba width where a model gives it as a field of its own rather than ``expand *
    #: d_model`` (Falcon-H1's ``mamba_d_ssm``, Nemotron-H's ``mamba_num_heads *
    #: mamba_head_dim``); None: ``expand * d_model``. ``expand`` is then only a label.
    d_ssm: PositiveInt | None = None
    d_conv: PositiveInt = 4
    chunk_size: PositiveInt = 256
    #: Rows of the (tied) embedding: 50277 padded to a multiple of 16 (``pad_vocab_size_multiple``
    #: of every state-spaces mamba2 config.json).
    vocab_size: PositiveInt = 50288
    norm_eps: float = Field(1e-5, gt=0)
    #: Whether the LM head shares the embedding's weights (state-spaces checkpoints: yes).
    tie_embeddings: bool = True
    family: Literal["mamba2"] = "mamba2"

    @model_validator(mode="after")
    def _heads_fit(self) -> "Mamba2Config":
        d_inner = self.d_inner
        if d_inner % self.headdim:
            width = "d_ssm" if self.d_ssm is not None else "expand*d_model"
            raise ValueError(f"d_inner = {width} = {d_inner} is not a multiple of headdim {self.headdim}")
        if (d_inner // self.headdim) % self.ngroups:
            raise ValueError(f"nheads = {d_inner // self.headdim} is not a multiple of ngroups {self.ngroups}")
        return self

    @property
    def d_inner(self) -> int:
        return self.d_ssm if self.d_ssm is not None else self.expand * self.d_model

    @property
    def nheads(self) -> int:
        return self.d_inner // self.headdim

    @property
    def heads_per_group(self) -> int:
        return self.nheads // self.ngroups

    def layer_parameters(self) -> int:
        """Weight elements of one block, counted from the module shapes (Mamba2Block)."""
        d, e, h, gn, k = self.d_model, self.d_inner, self.nheads, self.ngroups * self.d_state, self.d_conv
        conv_dim = e + 2 * gn
        in_proj = d * (2 * e + 2 * gn + h)  # z, x, B, C, dt
        conv = conv_dim * k + conv_dim  # depthwise weight + bias
        per_head = 3 * h  # dt_bias, A_log, D
        return d + in_proj + conv + per_head + e + e * d  # block norm, ..., gated norm, out_proj

    def model_parameters(self, layer_parameters: int | None = None) -> int:
        """Embedding (and the LM head unless tied) + n_layers blocks + the final norm."""
        per_layer = self.layer_parameters() if layer_parameters is None else layer_parameters
        embed = self.vocab_size * self.d_model * (1 if self.tie_embeddings else 2)
        return embed + self.n_layers * per_layer + self.d_model


#: Published configurations of state-spaces/mamba2-{130m,370m,780m,1.3b,2.7b}: every one has
#: ssm_cfg {"layer": "Mamba2"} with mamba_ssm's defaults (d_state 128, headdim 64, ngroups 1,
#: expand 2, d_conv 4, chunk_size 256), vocab 50277 padded to a multiple of 16, tied embeddings.
#: d_model / n_layer from the config.json files: huggingface.co/state-spaces/mamba2-130m
#: (768, 24) and .../mamba2-2.7b (2560, 64); mirrors of the others: brunopio/mamba2-370m
#: (1024, 48), rwitz2/mamba2-700m-c1.1 (a mamba2-780m finetune; 1536, 48; in_proj [6448, 1536]),
#: and a copy of the mamba2-1.3b config (2048, 48) published as bluuluu/Qwen2.5-1.5B-Open-R1-Distill.
PRESETS: dict[str, Mamba2Config] = {
    "mamba2-130m": Mamba2Config(d_model=768, n_layers=24),
    "mamba2-370m": Mamba2Config(d_model=1024, n_layers=48),
    "mamba2-780m": Mamba2Config(d_model=1536, n_layers=48),
    "mamba2-1.3b": Mamba2Config(d_model=2048, n_layers=48),
    "mamba2-2.7b": Mamba2Config(d_model=2560, n_layers=64),
}

#: Whole-model parameter counts as published (millions), for the tests. Only sizes with a
#: published count are listed: the state-spaces checkpoints are pickles (no parameter count on
#: their Hugging Face pages), so these are Hugging Face's "Model size" of safetensors copies:
#: rokyang/mamba2-370m-hf "368M params"; brunopio/mamba2-780m "780M params". No count to
#: better than 2 significant digits was found for 130m, 1.3b or 2.7b (mlx-community/mamba2-2.7b
#: shows "2.7B params").
PUBLISHED_PARAMETERS_M: dict[str, float] = {
    "mamba2-370m": 368.0,
    "mamba2-780m": 780.0,
}

# --------------------------------------------------------------------------------------------
# Einsums
# --------------------------------------------------------------------------------------------

FRONT: tuple[str, ...] = (
    "SS[b,i] = X[b,i,d]*X[b,i,d]",
    "RS[b,i] = rsqrt(SS[b,i]/D + eps)",
    "XN[b,i,d] = X[b,i,d]*RS[b,i]*WN[d]",
    "Z[b,i,g,r,p] = XN[b,i,d]*WZ[d,g,r,p]",
    "XI[b,i,g,r,p] = XN[b,i,d]*WX[d,g,r,p]",
    "BI[b,i,g,n] = XN[b,i,d]*WB[d,g,n]",
    "CI[b,i,g,n] = XN[b,i,d]*WCM[d,g,n]",
    "DT[b,i,g,r] = XN[b,i,d]*WDT[d,g,r] + BDT[g,r]",
    "XC[b,i,g,r,p] = XI[b,i+k-(K-1),g,r,p]*WCX[g,r,p,k] + BCX[g,r,p]",
    "BC[b,i,g,n] = BI[b,i+k-(K-1),g,n]*WCB[g,n,k] + BCB[g,n]",
    "CC[b,i,g,n] = CI[b,i+k-(K-1),g,n]*WCC[g,n,k] + BCC[g,n]",
    "U[b,i,g,r,p] = silu(XC[b,i,g,r,p])",
    "BM[b,i,g,n] = silu(BC[b,i,g,n])",
    "CM[b,i,g,n] = silu(CC[b,i,g,n])",
    "DELTA[b,i,g,r] = softplus(DT[b,i,g,r])",
)

SCAN_RECURRENT: tuple[str, ...] = (
    "AD[b,i,g,r] = exp(DELTA[b,i,g,r]*A[g,r])",
    "BX[b,i,g,r,p,n] = DELTA[b,i,g,r]*U[b,i,g,r,p]*BM[b,i,g,n]",
    "H[b,i,g,r,p,n] = AD[b,i,g,r]*H[b,i-1,g,r,p,n] + BX[b,i,g,r,p,n]",
    "YS[b,i,g,r,p] = H[b,i,g,r,p,n]*CM[b,i,g,n]",
    "YD[b,i,g,r,p] = YS[b,i,g,r,p] + U[b,i,g,r,p]*DS[g,r]",
)

SCAN_CHUNKED: tuple[str, ...] = (
    "XDT[b,c,q,g,r,p] = DELTA[b,c*Q+q,g,r]*U[b,c*Q+q,g,r,p]",
    "ACS[b,c,q,g,r] = ACS[b,c,q-1,g,r] + DELTA[b,c*Q+q,g,r]*A[g,r]",
    "LD[b,c,q,s,g,r] = exp(ACS[b,c,q,g,r] - ACS[b,c,s,g,r] + LM[q,s])",
    "CB[b,c,q,s,g] = CM[b,c*Q+q,g,n]*BM[b,c*Q+s,g,n]",
    "YDG[b,c,q,g,r,p] = CB[b,c,q,s,g]*LD[b,c,q,s,g,r]*XDT[b,c,s,g,r,p]",
    "DC[b,c,q,g,r] = exp(ACS[b,c,Q-1,g,r] - ACS[b,c,q,g,r])",
    "ST[b,c,g,r,p,n] = DC[b,c,q,g,r]*XDT[b,c,q,g,r,p]*BM[b,c*Q+q,g,n]",
    "CD[b,c,g,r] = exp(ACS[b,c,Q-1,g,r])",
    "HC[b,c,g,r,p,n] = CD[b,c,g,r]*HC[b,c-1,g,r,p,n] + ST[b,c,g,r,p,n]",
    "DO[b,c,q,g,r] = exp(ACS[b,c,q,g,r])",
    "YO[b,c,q,g,r,p] = CM[b,c*Q+q,g,n]*HC[b,c-1,g,r,p,n]",
    "YD[b,c,q,g,r,p] = YDG[b,c,q,g,r,p] + DO[b,c,q,g,r]*YO[b,c,q,g,r,p] + U[b,c*Q+q,g,r,p]*DS[g,r]",
)

#: The tail after the scan; ``{o}`` is the output's position variables, ``{i}`` the index of an
#: ``I``-indexed tensor at that position.
_TAIL: tuple[str, ...] = (
    "GZ[b,{o},g,r,p] = silu(Z[b,{i},g,r,p])",
    "YG[b,{o},g,r,p] = YD[b,{o},g,r,p]*GZ[b,{o},g,r,p]",
    "SG[b,{o},g] = YG[b,{o},g,r,p]*YG[b,{o},g,r,p]",
    "RG[b,{o},g] = rsqrt(SG[b,{o},g]/(R*P) + eps)",
    "YN[b,{o},g,r,p] = YG[b,{o},g,r,p]*RG[b,{o},g]*WGN[g,r,p]",
    "O[b,{o},d] = YN[b,{o},g,r,p]*WO[g,r,p,d]",
    "XO[b,{o},d] = X[b,{i},d] + O[b,{o},d]",
)

TAIL_RECURRENT: tuple[str, ...] = tuple(line.format(o="i", i="i") for line in _TAIL)
TAIL_CHUNKED: tuple[str, ...] = tuple(line.format(o="c,q", i="c*Q+q") for line in _TAIL)

_W, _X, _S = Role.WEIGHT, Role.INTERMEDIATE, Role.INPUT

# name: (ranks, role, description); ``*`` in ranks stands for the position ranks of the form
_TENSORS: dict[str, tuple[tuple[str, ...], Role, str]] = {
    "X": (("B", "I", "D"), Role.INPUT, "layer input (residual stream)"),
    "WN": (("D",), _W, "block RMSNorm weight"),
    "SS": (("B", "I"), _X, "sum of squares"),
    "RS": (("B", "I"), _X, "reciprocal RMS"),
    "XN": (("B", "I", "D"), _X, "normalised input"),
    "WZ": (("D", "G", "R", "P"), _W, "in_proj, z rows"),
    "WX": (("D", "G", "R", "P"), _W, "in_proj, x rows"),
    "WB": (("D", "G", "N"), _W, "in_proj, B rows"),
    "WCM": (("D", "G", "N"), _W, "in_proj, C rows"),
    "WDT": (("D", "G", "R"), _W, "in_proj, dt rows"),
    "BDT": (("G", "R"), _W, "dt_bias"),
    "Z": (("B", "I", "G", "R", "P"), _X, "gate branch z"),
    "XI": (("B", "I", "G", "R", "P"), _X, "conv input, x part"),
    "BI": (("B", "I", "G", "N"), _X, "conv input, B part"),
    "CI": (("B", "I", "G", "N"), _X, "conv input, C part"),
    "DT": (("B", "I", "G", "R"), _X, "dt + dt_bias"),
    "WCX": (("G", "R", "P", "K"), _W, "conv1d weight, x channels"),
    "BCX": (("G", "R", "P"), _W, "conv1d bias, x channels"),
    "WCB": (("G", "N", "K"), _W, "conv1d weight, B channels"),
    "BCB": (("G", "N"), _W, "conv1d bias, B channels"),
    "WCC": (("G", "N", "K"), _W, "conv1d weight, C channels"),
    "BCC": (("G", "N"), _W, "conv1d bias, C channels"),
    "XC": (("B", "I", "G", "R", "P"), _X, "conv output, x"),
    "BC": (("B", "I", "G", "N"), _X, "conv output, B"),
    "CC": (("B", "I", "G", "N"), _X, "conv output, C"),
    "U": (("B", "I", "G", "R", "P"), _X, "SSM input x = silu(conv)"),
    "BM": (("B", "I", "G", "N"), _X, "input-dependent B"),
    "CM": (("B", "I", "G", "N"), _X, "input-dependent C"),
    "DELTA": (("B", "I", "G", "R"), _X, "step size softplus(dt + dt_bias)"),
    "A": (("G", "R"), _W, "A = -exp(A_log), one per head"),
    "DS": (("G", "R"), _W, "D skip weight, one per head"),
    # recurrent scan
    "AD": (("B", "I", "G", "R"), _X, "discretised A, exp(dt*A)"),
    "BX": (("B", "I", "G", "R", "P", "N"), _X, "discretised B times x"),
    "H": (("B", "I", "G", "R", "P", "N"), _X, "SSM state over positions"),
    "YS": (("B", "I", "G", "R", "P"), _X, "scan output (C readout)"),
    # chunked scan
    "XDT": (("B", "C", "Q", "G", "R", "P"), _X, "discretised x, dt*x, in the chunk view"),
    "ACS": (("B", "C", "Q", "G", "R"), _X, "cumulative dt*A within a chunk"),
    "LM": (("Q", "S"), _S, "constant causal mask in log space: 0 if s <= q else -inf"),
    "LD": (("B", "C", "Q", "S", "G", "R"), _X, "segment decay exp(ACS[q]-ACS[s]), masked"),
    "CB": (("B", "C", "Q", "S", "G"), _X, "C.B scores within a chunk"),
    "YDG": (("B", "C", "Q", "G", "R", "P"), _X, "intra-chunk (diagonal block) output"),
    "DC": (("B", "C", "Q", "G", "R"), _X, "decay from a position to its chunk's end"),
    "ST": (("B", "C", "G", "R", "P", "N"), _X, "state contributed by each chunk"),
    "CD": (("B", "C", "G", "R"), _X, "decay over a whole chunk"),
    "HC": (("B", "C", "G", "R", "P", "N"), _X, "SSM state at each chunk's end"),
    "DO": (("B", "C", "Q", "G", "R"), _X, "decay from a chunk's start to a position"),
    "YO": (("B", "C", "Q", "G", "R", "P"), _X, "inter-chunk (state-to-output) term"),
    # tail ('*' = the position ranks)
    "YD": (("B", "*", "G", "R", "P"), _X, "scan output plus D skip"),
    "GZ": (("B", "*", "G", "R", "P"), _X, "silu(z) gate"),
    "YG": (("B", "*", "G", "R", "P"), _X, "gated output"),
    "SG": (("B", "*", "G"), _X, "sum of squares per group"),
    "RG": (("B", "*", "G"), _X, "reciprocal RMS per group"),
    "WGN": (("G", "R", "P"), _W, "gated RMSNorm weight"),
    "YN": (("B", "*", "G", "R", "P"), _X, "normalised gated output"),
    "WO": (("G", "R", "P", "D"), _W, "out_proj weight"),
    "O": (("B", "*", "D"), _X, "mixer output"),
    "XO": (("B", "*", "D"), Role.OUTPUT, "layer output (residual stream)"),
}

_RECURRENT_ONLY = {"AD", "BX", "H", "YS"}
_CHUNKED_ONLY = {"XDT", "ACS", "LM", "LD", "CB", "YDG", "DC", "ST", "CD", "HC", "DO", "YO"}

#: The weight tensors of a layer (what :func:`~mambalaya.workloads.hf.weights_mamba2.load_mamba2_layer` returns).
WEIGHTS: tuple[str, ...] = tuple(t for t, (_, role, _) in _TENSORS.items() if role == Role.WEIGHT)

#: Constant (input-independent, weight-independent) tensors, from :func:`mamba2_constants`.
CONSTANTS: tuple[str, ...] = ("LM",)


def parse_mamba2_config(data: dict, *, source: str = "model config") -> Mamba2Config:
    config = validated_config(Mamba2Config, data, what="Mamba-2", source=source)
    if isinstance(data, dict) and "d_ssm" in data and "expand" in data and \
            config.d_ssm is not None and config.expand * config.d_model != config.d_ssm:
        # d_ssm sets the width and expand is a label: a file giving both that disagree meant one of them
        raise SpecError(f"Mamba-2: d_ssm ({config.d_ssm}) and expand * d_model ({config.expand} * {config.d_model} = "
                        f"{config.expand * config.d_model}) disagree; d_ssm sets the width (expand was once dropped "
                        "without a word): give one", source=source)
    return config


#: The SSM region a fine-grained-fusion baseline fuses: the recurrent form's discretisation,
#: scan and readout (as for Mamba-1), or the chunked form's SSD computation (discretised input,
#: in-chunk decay and attention-like product, chunk states, the recurrence over chunks and the
#: state readout).
SSM_REGION: tuple[str, ...] = ("AD", "BX", "H", "YS")
SSD_REGION: tuple[str, ...] = ("XDT", "ACS", "LD", "CB", "YDG", "DC", "ST", "CD", "HC", "DO", "YO")


def mamba2_layer(
    config: Mamba2Config,
    *,
    batch: int,
    seq_len: int,
    phase: Phase = "prefill",
    bits: int = 16,
    state_io: bool | None = None,
    scan: Scan = "recurrent",
    name: str | None = None,
) -> Cascade:
    """One Mamba-2 block as a cascade.

    ``phase="prefill"`` processes ``I = seq_len`` positions from a zero state (``state_io=True``
    reads an incoming conv/SSM state and writes the outgoing one, for chunked prefill; both
    scan forms support it); ``phase="decode"`` is one generation step: ``I = 1``, state in and
    out, recurrent form only. ``scan="chunked"`` uses the SSD chunked algorithm with chunks of
    ``config.chunk_size`` positions (``seq_len`` need not be a multiple: the last chunk reads
    zeros past ``L``, as transformers pads); its output ``XO`` is ``[B, C, Q, D]``. The chunked
    form needs the constant ``LM`` from :func:`mamba2_constants`.
    """
    if scan not in ("recurrent", "chunked"):
        raise SpecError(f"scan must be 'recurrent' or 'chunked', not {scan!r}")
    check_layer_args(phase, batch=batch, seq_len=seq_len, bits=bits)
    if phase == "decode" and scan == "chunked":
        raise SpecError("a decode step (I = 1) uses the recurrent scan; scan='chunked' is for prefill")
    positions = 1 if phase == "decode" else seq_len
    with_state = phase == "decode" if state_io is None else state_io
    if phase == "decode" and not with_state:
        raise SpecError("a decode step reads and writes the SSM and conv states; state_io cannot be False")

    c = config
    chunked = scan == "chunked"
    ranks = [
        Rank("B", batch, "batch"),
        Rank("I", positions, "L"),
        Rank("D", c.d_model, "d_model"),
        Rank("G", c.ngroups, "ngroups"),
        Rank("R", c.heads_per_group, "expand*d_model/headdim/ngroups"),
        Rank("P", c.headdim, "headdim"),
        Rank("N", c.d_state, "d_state"),
        Rank("K", c.d_conv, "d_conv"),
    ]
    params: dict[str, float] = {
        "batch": batch,
        "L": positions,
        "d_model": c.d_model,
        "expand": c.expand,
        "headdim": c.headdim,
        "ngroups": c.ngroups,
        "d_state": c.d_state,
        "d_conv": c.d_conv,
        "eps": c.norm_eps,
    }
    if chunked:
        params["chunk_size"] = c.chunk_size
        ranks += [
            Rank("C", math.ceil(positions / c.chunk_size), "ceil(L/chunk_size)"),
            Rank("Q", c.chunk_size, "chunk_size"),
            Rank("S", c.chunk_size, "chunk_size"),
        ]
    skip = _RECURRENT_ONLY if chunked else _CHUNKED_ONLY
    where = ("C", "Q") if chunked else ("I",)
    tensors: dict[str, TensorSpec] = {}
    for t, (rk, role, desc) in _TENSORS.items():
        if t in skip:
            continue
        if "*" in rk:
            at = rk.index("*")
            rk = rk[:at] + where + rk[at + 1 :]
        tensors[t] = TensorSpec(t, rk, role, bits, description=desc)
    tensors = with_masks(tensors, {"LM": causal_band("Q", "S")})
    lines = list(FRONT) + list(SCAN_CHUNKED if chunked else SCAN_RECURRENT)
    lines += TAIL_CHUNKED if chunked else TAIL_RECURRENT

    if with_state:
        if c.d_conv > 1:
            ranks.append(Rank("J", c.d_conv - 1, "d_conv-1"))
            for src, part, idx in (("XI", "X", "g,r,p"), ("BI", "B", "g,n"), ("CI", "C", "g,n")):
                rk = ("B", "J") + tensors[src].ranks[2:]
                cs0, csn = f"CS{part}0", f"CS{part}N"
                tensors[cs0] = TensorSpec(cs0, rk, Role.STATE, bits, description=f"incoming conv state, {part} channels")
                tensors[csn] = TensorSpec(
                    csn, rk, Role.STATE, bits, updates=cs0, description=f"outgoing conv state, {part} channels"
                )
                tensors[src] = replace(tensors[src], initial=cs0)
                lines.append(f"{csn}[b,j,{idx}] = {src}[b,j+I-(K-1),{idx}]")
        tensors["H0"] = TensorSpec("H0", ("B", "G", "R", "P", "N"), Role.STATE, bits, description="incoming SSM state")
        if chunked:
            tensors["HC"] = replace(tensors["HC"], initial="H0")
            tensors["HN"] = TensorSpec(
                "HN", ("B", "G", "R", "P", "N"), Role.STATE, bits, updates="H0", description="outgoing SSM state"
            )
            lines.append("HN[b,g,r,p,n] = HC[b,C-1,g,r,p,n]")
        elif positions == 1:
            tensors["H"] = replace(
                tensors["H"], role=Role.STATE, initial="H0", updates="H0", description="SSM state, outgoing (I = 1)"
            )
        else:
            tensors["H"] = replace(tensors["H"], initial="H0")
            tensors["HN"] = TensorSpec(
                "HN", ("B", "G", "R", "P", "N"), Role.STATE, bits, updates="H0", description="outgoing SSM state"
            )
            lines.append("HN[b,g,r,p,n] = H[b,I-1,g,r,p,n]")
    sizes = {r.name: r.size for r in ranks}
    einsums = [parse_einsum(line, sizes=sizes) for line in lines]
    return build_cascade(
        name=name or f"mamba2-{phase}" + ("-chunked" if chunked else ""),
        params=params,
        ranks=ranks,
        tensors=list(tensors.values()),
        einsums=einsums,
        description=(
            f"Mamba-2 block, {phase}, {scan} scan, d_model={c.d_model}, nheads={c.nheads}, "
            f"ngroups={c.ngroups}, batch={batch}, I={positions}"
            + (f", chunks {math.ceil(positions / c.chunk_size)}x{c.chunk_size}" if chunked else "")
        ),
        regions={"ssm": SSD_REGION if chunked else SSM_REGION},
    )


def mamba2_constants(cascade: Cascade) -> dict[str, np.ndarray]:
    """The constant input tensors a Mamba-2 cascade reads (float64): ``{"LM": [Q,S]}`` for the
    chunked form (0 where ``s <= q``, ``-inf`` above the diagonal), ``{}`` for the recurrent one."""
    out: dict[str, np.ndarray] = {}
    if "LM" in cascade.tensors:
        out["LM"] = causal_mask(*cascade.shape("LM"))
    return out


def chunked_output_to_positions(xo: np.ndarray, seq_len: int) -> np.ndarray:
    """``XO[B,C,Q,D]`` of the chunked form as ``[B,L,D]`` (drops the padded positions)."""
    b, c, q, d = xo.shape
    return np.ascontiguousarray(xo.reshape(b, c * q, d)[:, :seq_len])


__all__ = [
    "CONSTANTS",
    "FRONT",
    "PRESETS",
    "PUBLISHED_PARAMETERS_M",
    "SCAN_CHUNKED",
    "SCAN_RECURRENT",
    "TAIL_CHUNKED",
    "TAIL_RECURRENT",
    "WEIGHTS",
    "Mamba2Config",
    "chunked_output_to_positions",
    "mamba2_constants",
    "mamba2_layer",
    "parse_mamba2_config",
]
