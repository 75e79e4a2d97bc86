"""The Gated DeltaNet block of OLMo-Hybrid (and Qwen3-Next) as a cascade of extended Einsums.

The cascade follows transformers' ``OlmoHybridLinearAttentionDecoderLayer`` up to its residual
(``x + linear_attn(input_layernorm(x))``; the MLP after it is not part of the block, as for
Mamba-2) and ``OlmoHybridGatedDeltaNet`` operation for operation, on its torch path
(``torch_recurrent_gated_delta_rule`` / ``torch_chunk_gated_delta_rule``, transformers 5.25).

Ranks: ``B`` batch, ``I`` position, ``D`` d_model, ``G`` key heads (``linear_num_key_heads``),
``R`` value heads per key head, ``N`` key head dim, ``P`` value head dim, ``M`` (size ``N``: the
key dim contracted out of the state), ``K`` conv taps, ``J = K-1``; the chunked form adds ``C``
chunks, ``Q`` and ``S`` positions in a chunk and ``T`` (size ``Q``: the row the forward
substitution reads). Value head ``h = g*R + r`` uses key head ``g`` (transformers'
``repeat_interleave`` of q and k), so q and k carry ``[g,n]`` and every value-head tensor
``[g,r]``. The state of a head is ``H[..,g,r,p,n]`` (transformers' ``[k, v]`` transposed).

Front (both forms), over ``I``: RMSNorm (``SS``, ``RS``, ``XN``, eps ``rms_norm_eps``); the
projections ``QI``, ``KI``, ``VI`` (q/k/v_proj), ``AI`` (a_proj plus dt_bias), ``BI``
(b_proj), ``ZG`` (g_proj, the output gate); one depthwise causal conv over the concatenated
q, k, v channels, without bias, written as three Einsums over the weight's slices (``QC``,
``KC``, ``VC``), then SiLU (``QS``, ``KS``, ``V``); L2 norms of q and k per key head
(``rsqrt(sum x^2 + 1e-6)``, the query also scaled by ``1/sqrt(N)``: ``QN``, ``KN``);
``BETA = beta_scale*sigmoid(BI)`` (2 with ``linear_allow_neg_eigval``, else 1); the log decay
``GL = A*softplus(AI)`` with ``A = -exp(A_log)``.

``scan="recurrent"`` (also the only decode form), the gated delta rule per position:

* ``AD[b,i,g,r] = exp(GL[b,i,g,r])``, ``KB[b,i,g,r,n] = BETA[b,i,g,r]*KN[b,i,g,n]``
* ``H[b,i,g,r,p,n] = AD*H[b,i-1,g,r,p,n] + KB*V[b,i,g,r,p] - KB*AD*H[b,i-1,g,r,p,m]*KN[b,i,g,m]``:
  decay, ``kv_mem`` = the decayed state read by k, ``S += k (x) beta (v - kv_mem)``; a
  recurrence over ``I`` whose last term contracts the previous state over its key dim
* ``YS[b,i,g,r,p] = H[b,i,g,r,p,n]*QN[b,i,g,n]``

``scan="chunked"`` (the WY/UT form; position ``i = c*Q+q``, ``Q = chunk_size``):

* ``ACS`` cumulative log decay in the chunk (recurrence over ``Q``), ``LD`` masked pair decay
  ``exp(ACS[q]-ACS[s]+LM[q,s])``, ``DO = exp(ACS)``, ``DC = exp(ACS[Q-1]-ACS)``,
  ``CD = exp(ACS[Q-1])``
* ``KK``, ``QK``: key-key and query-key products per key head
* ``AS = BETA[q]*KK*LD*SL`` the strictly lower UT system (``SL``: 1 where ``s < q``)
* ``TI[b,c,q,s,g,r] = EYE[q,s] - AS[b,c,q,t,g,r]*TI[b,c,t,s,g,r]``: ``(I + AS)^-1`` by forward
  substitution, a recurrence over ``Q`` reading every earlier row (a history read)
* ``U = TI x (BETA*V)`` (new values), ``W = TI x (BETA*KN*DO)`` (decayed keys)
* ``ST = (DC*KN)^T x U`` and ``KW = (DC*KN)^T x W``: the chunk's input and its correction
* ``HC[b,c,g,r,p,n] = CD*HC[b,c-1,g,r,p,n] + ST - KW[b,c,g,r,n,m]*HC[b,c-1,g,r,p,m]``: the
  state at each chunk's end, a recurrence over ``C`` only. transformers forms
  ``v_new = U - W x S`` and then ``S*CD + (DC*KN)^T x v_new``; a cascade cannot hold ``v_new``
  (it and the state would read each other), so the chunk's transition ``CD - KW`` is applied to
  the state instead: the same sum, reassociated
* ``QE = QN*DO - (QK*LD) x W`` (the query against the old state), ``YI = (QK*LD) x U``,
  ``YO = QE x HC[c-1]``, ``YD = YI + YO``

Positions ``c*Q+q >= L`` read zeros (transformers pads q, k, v, beta and g with zeros): they
change no state and their output rows are zero. The chunked output ``XO`` is ``[B,C,Q,D]``.
``LM``, ``SL`` and ``EYE`` are constants (:func:`gdn_constants`).

Tail (over ``[b,i]`` or ``[b,c,q]``): the gated RMSNorm per value head, norm *before* the gate
(``SG``, ``RG``, ``YN = YD*RG*WGN[p]*silu(ZG)``, eps ``gate_norm_eps``: 1e-5 in OLMo-Hybrid,
``rms_norm_eps`` in Qwen3-Next), ``O = YN x o_proj``, ``XO = X + O``.

State (decode; ``state_io=True`` in prefill): conv states ``CSQ0[b,j,g,n]``, ``CSK0``,
``CSV0[b,j,g,r,p]`` (the last ``K-1`` conv inputs; transformers keeps ``K``, of which the
oldest is never read again) and the recurrent state ``H0[b,g,r,p,n]``; outgoing ``CSQN``,
``CSKN``, ``CSVN`` and ``HN`` (or ``H`` itself when ``I = 1``).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, BeforeValidator, Field, PositiveInt, model_validator

from mambalaya.specio import SPEC_MODEL_CONFIG, list_as_tuple

from mambalaya.einsum.cascade import Cascade, build_cascade
from mambalaya.einsum.ir import Rank, Role, TensorSpec
from mambalaya.einsum.parse import parse_einsum
from mambalaya.errors import SpecError
from mambalaya.workloads.checks import check_layer_args, validated_config
from mambalaya.workloads.blocks.masks import DIAGONAL, STRICTLY_LOWER, causal_band, causal_mask, with_masks

LINEAR, FULL = "linear_attention", "full_attention"
#: transformers 5.25's ``torch_chunk_gated_delta_rule(..., chunk_size=64)`` (see
#: :attr:`GatedDeltaNetConfig.chunk_size`).
DEFAULT_CHUNK_SIZE = 64


class GatedDeltaNetConfig(BaseModel):
    """A model whose recurrent layers are Gated DeltaNet (transformers' ``OlmoHybridConfig``
    fields under mambalaya's names). ``layer_types`` lists every layer; mambalaya builds the
    ``linear_attention`` ones (:attr:`n_layers` counts them); the attention and MLP fields are
    only for the whole model's parameter count."""

    model_config = SPEC_MODEL_CONFIG

    family: Literal["gated_deltanet"] = "gated_deltanet"
    d_model: PositiveInt
    layer_types: Annotated[tuple[Literal["linear_attention", "full_attention"], ...], BeforeValidator(list_as_tuple)] = Field(
        min_length=1)
    num_k_heads: PositiveInt
    num_v_heads: PositiveInt
    k_head_dim: PositiveInt
    v_head_dim: PositiveInt
    d_conv: PositiveInt = 4
    #: The chunked (WY/UT) form's chunk length: transformers 5.25's ``torch_chunk_gated_delta_rule``
    #: default (``chunk_size: int = 64``, models/olmo_hybrid/modeling_olmo_hybrid.py), which
    #: ``OlmoHybridGatedDeltaNet.forward`` calls without another; OlmoHybridConfig has no field
    #: for it. A setting here (:meth:`with_chunk_size`; ``chunk_size=`` of :func:`gdn_layer` and
    #: :func:`~mambalaya.workloads.build_layer`): the outputs and states do not depend on it.
    chunk_size: PositiveInt = DEFAULT_CHUNK_SIZE
    #: 2 when linear_allow_neg_eigval (OLMo-Hybrid's default), 1 otherwise (Qwen3-Next).
    beta_scale: float = Field(2.0, gt=0)
    norm_eps: float = Field(1e-6, gt=0)
    #: OlmoHybridRMSNormGated is built with eps=1e-5 whatever rms_norm_eps says.
    gate_norm_eps: float = Field(1e-5, gt=0)
    #: transformers' l2norm eps (fixed in the kernel call).
    l2_eps: float = Field(1e-6, gt=0)
    d_ff: PositiveInt
    n_heads: PositiveInt
    n_kv_heads: PositiveInt
    head_dim: PositiveInt | None = None
    vocab_size: PositiveInt
    tie_embeddings: bool = False

    @model_validator(mode="after")
    def _heads_fit(self) -> "GatedDeltaNetConfig":
        if self.num_v_heads % self.num_k_heads:
            raise ValueError(f"num_v_heads = {self.num_v_heads} is not a multiple of num_k_heads = {self.num_k_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads = {self.n_kv_heads} does not divide n_heads = {self.n_heads}")
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ValueError(f"n_heads = {self.n_heads} does not divide d_model = {self.d_model}")
        if LINEAR not in self.layer_types:
            raise ValueError("layer_types has no 'linear_attention' layer, the layer this family models")
        return self

    def with_chunk_size(self, chunk_size: int) -> "GatedDeltaNetConfig":
        """This config with the chunked form's chunk length ``chunk_size``; a SpecError naming
        ``chunk_size`` unless it is a positive integer."""
        return self.model_copy(update={"chunk_size": checked_chunk_size(chunk_size)})

    @property
    def n_layers(self) -> int:
        """The Gated DeltaNet layers (the ones mambalaya builds)."""
        return self.layer_types.count(LINEAR)

    def layer_counts(self) -> dict[str, int]:
        return {t: self.layer_types.count(t) for t in (LINEAR, FULL) if t in self.layer_types}

    def not_built(self) -> str:
        """What of the model its built layers (the linear-attention mixers) leave out, for every
        figure called the model's: its full-attention layers and every layer's MLP (the
        ``olmo_hybrid`` family builds them all)."""
        full = self.layer_types.count(FULL)
        return (f"its {full} {FULL} layers and " if full else "") + "every layer's MLP"

    @property
    def heads_per_group(self) -> int:
        return self.num_v_heads // self.num_k_heads

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.k_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.v_head_dim

    @property
    def d_inner(self) -> int:
        return self.value_dim

    @property
    def expand(self) -> float:
        """The value width over d_model (``mambalaya models`` lists it beside Mamba's expand)."""
        return self.value_dim / self.d_model

    @property
    def d_state(self) -> int:
        """Key head dim: the state of a head is ``k_head_dim x v_head_dim``."""
        return self.k_head_dim

    def state_elements(self) -> int:
        """Recurrent-state elements of one layer and sequence: heads x key dim x value dim."""
        return self.num_v_heads * self.k_head_dim * self.v_head_dim

    def layer_parameters(self) -> int:
        """Weight elements of one block (input norm + OlmoHybridGatedDeltaNet)."""
        d, kd, vd, h = self.d_model, self.key_dim, self.value_dim, self.num_v_heads
        projections = d * (2 * kd + 2 * vd + 2 * h) + vd * d  # q, k, v, g, a, b; o
        conv = (2 * kd + vd) * self.d_conv  # no bias
        return d + projections + conv + 2 * h + self.v_head_dim  # norm, ..., A_log, dt_bias, o_norm

    def attention_parameters(self) -> int:
        """Weight elements of one attention layer's mixer and its two post-norms (OLMo style)."""
        hd = self.head_dim or self.d_model // self.n_heads
        q, kv = self.n_heads * hd, self.n_kv_heads * hd
        return self.d_model * (q + 2 * kv) + q * self.d_model + q + kv + self.d_model

    def mlp_parameters(self) -> int:
        return 3 * self.d_model * self.d_ff + self.d_model  # gate, up, down; its norm

    def model_parameters(self) -> int:
        """Embedding (and the LM head unless tied) + every layer + the final norm."""
        embed = self.vocab_size * self.d_model * (1 if self.tie_embeddings else 2)
        counts = self.layer_counts()
        layers = counts.get(LINEAR, 0) * self.layer_parameters() + counts.get(FULL, 0) * self.attention_parameters()
        return embed + layers + len(self.layer_types) * self.mlp_parameters() + self.d_model


def checked_chunk_size(chunk_size: object) -> int:
    """``chunk_size`` as an int if it is a positive integer, else one SpecError naming it."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise SpecError(f"chunk_size, the Gated DeltaNet chunked form's chunk length, must be a positive integer, not "
                        f"{chunk_size!r} (the default is transformers' {DEFAULT_CHUNK_SIZE})")
    return int(chunk_size)


def check_chunk_size_form(chunk_size: object, *, scan: str, phase: str) -> int:
    """A ``chunk_size`` build argument checked against the form it would set: a positive
    integer (:func:`checked_chunk_size`), for the chunked form of a prefill; one SpecError
    naming ``chunk_size`` otherwise, as the recurrent form and a decode step have no chunks."""
    size = checked_chunk_size(chunk_size)
    if phase == "decode":
        raise SpecError(f"chunk_size = {size} sets the chunk length of the chunked form, but a decode step (I = 1) "
                        "runs the recurrent form, which has no chunks; leave chunk_size out")
    if scan != "chunked":
        raise SpecError(f"chunk_size = {size} sets the chunk length of the chunked form (scan='chunked'), but this "
                        f"prefill runs the {scan} form, which has no chunks; leave chunk_size out or use "
                        "scan='chunked'")
    return size


def parse_gdn_config(data: dict, *, source: str = "model config") -> GatedDeltaNetConfig:
    return validated_config(GatedDeltaNetConfig, data, what="Gated DeltaNet", source=source)


#: OLMo-Hybrid 7B. Source: transformers 5.25's ``OlmoHybridConfig``, whose defaults are
#: documented as "a similar configuration to that of allenai/Olmo-Hybrid-7B" (hidden 3840,
#: 32 layers with every fourth full attention, 30 heads, linear key/value heads default to 30,
#: key head dim int(0.75*3840/30) = 96, value head dim 2*96 = 192, conv 4, neg. eigenvalues
#: allowed, MLP 11008, vocab 100352, untied, rms_norm_eps 1e-6); the same sizes appear in
#: allenai's olmo3_5_hybrid speed test's HYBRID_CONFIG_KWARGS. The released config.json itself
#: was not available to check. Its GatedDeltaNet layer (with its input norm) has 88,754,172 weights (the module's,
#: checked in tests/test_gated_deltanet.py); the whole model 7,430,870,688 ("7B").
PRESETS: dict[str, GatedDeltaNetConfig] = {
    "olmo-hybrid": GatedDeltaNetConfig(
        d_model=3840, layer_types=tuple(FULL if i % 4 == 3 else LINEAR for i in range(32)),
        num_k_heads=30, num_v_heads=30, k_head_dim=96, v_head_dim=192, d_ff=11008, n_heads=30, n_kv_heads=30,
        vocab_size=100352,
    ),
}

# --------------------------------------------------------------------------------------------
# Einsums
# --------------------------------------------------------------------------------------------

FRONT: tuple[str, ...] = (
    "SS[b,i] = X[b,i,d]*X[b,i,d]",
    "RS[b,i] = rsqrt(SS[b,i]/D + eps)",
    "XN[b,i,d] = X[b,i,d]*RS[b,i]*WN[d]",
    "QI[b,i,g,n] = XN[b,i,d]*WQ[d,g,n]",
    "KI[b,i,g,n] = XN[b,i,d]*WK[d,g,n]",
    "VI[b,i,g,r,p] = XN[b,i,d]*WV[d,g,r,p]",
    "AI[b,i,g,r] = XN[b,i,d]*WA[d,g,r] + BDT[g,r]",
    "BI[b,i,g,r] = XN[b,i,d]*WBT[d,g,r]",
    "ZG[b,i,g,r,p] = XN[b,i,d]*WG[d,g,r,p]",
    "QC[b,i,g,n] = QI[b,i+k-(K-1),g,n]*WCQ[g,n,k]",
    "KC[b,i,g,n] = KI[b,i+k-(K-1),g,n]*WCK[g,n,k]",
    "VC[b,i,g,r,p] = VI[b,i+k-(K-1),g,r,p]*WCV[g,r,p,k]",
    "QS[b,i,g,n] = silu(QC[b,i,g,n])",
    "KS[b,i,g,n] = silu(KC[b,i,g,n])",
    "V[b,i,g,r,p] = silu(VC[b,i,g,r,p])",
    "SQ[b,i,g] = QS[b,i,g,n]*QS[b,i,g,n]",
    "RQ[b,i,g] = rsqrt(SQ[b,i,g] + l2eps)*rsqrt(N)",
    "QN[b,i,g,n] = QS[b,i,g,n]*RQ[b,i,g]",
    "SK[b,i,g] = KS[b,i,g,n]*KS[b,i,g,n]",
    "RK[b,i,g] = rsqrt(SK[b,i,g] + l2eps)",
    "KN[b,i,g,n] = KS[b,i,g,n]*RK[b,i,g]",
    "BETA[b,i,g,r] = bscale*sigmoid(BI[b,i,g,r])",
    "GL[b,i,g,r] = A[g,r]*softplus(AI[b,i,g,r])",
)

SCAN_RECURRENT: tuple[str, ...] = (
    "AD[b,i,g,r] = exp(GL[b,i,g,r])",
    "KB[b,i,g,r,n] = BETA[b,i,g,r]*KN[b,i,g,n]",
    "H[b,i,g,r,p,n] = AD[b,i,g,r]*H[b,i-1,g,r,p,n] + KB[b,i,g,r,n]*V[b,i,g,r,p]"
    " - KB[b,i,g,r,n]*AD[b,i,g,r]*H[b,i-1,g,r,p,m]*KN[b,i,g,m]",
    "YD[b,i,g,r,p] = H[b,i,g,r,p,n]*QN[b,i,g,n]",
)

SCAN_CHUNKED: tuple[str, ...] = (
    "ACS[b,c,q,g,r] = ACS[b,c,q-1,g,r] + GL[b,c*Q+q,g,r]",
    "LD[b,c,q,s,g,r] = exp(ACS[b,c,q,g,r] - ACS[b,c,s,g,r] + LM[q,s])",
    "DO[b,c,q,g,r] = exp(ACS[b,c,q,g,r])",
    "DC[b,c,q,g,r] = exp(ACS[b,c,Q-1,g,r] - ACS[b,c,q,g,r])",
    "CD[b,c,g,r] = exp(ACS[b,c,Q-1,g,r])",
    "KK[b,c,q,s,g] = KN[b,c*Q+q,g,n]*KN[b,c*Q+s,g,n]",
    "QK[b,c,q,s,g] = QN[b,c*Q+q,g,n]*KN[b,c*Q+s,g,n]",
    "AS[b,c,q,s,g,r] = BETA[b,c*Q+q,g,r]*KK[b,c,q,s,g]*LD[b,c,q,s,g,r]*SL[q,s]",
    "TI[b,c,q,s,g,r] = EYE[q,s] - AS[b,c,q,t,g,r]*TI[b,c,t,s,g,r]",
    "U[b,c,q,g,r,p] = TI[b,c,q,s,g,r]*BETA[b,c*Q+s,g,r]*V[b,c*Q+s,g,r,p]",
    "W[b,c,q,g,r,n] = TI[b,c,q,s,g,r]*BETA[b,c*Q+s,g,r]*KN[b,c*Q+s,g,n]*DO[b,c,s,g,r]",
    "ST[b,c,g,r,p,n] = DC[b,c,q,g,r]*KN[b,c*Q+q,g,n]*U[b,c,q,g,r,p]",
    "KW[b,c,g,r,n,m] = DC[b,c,q,g,r]*KN[b,c*Q+q,g,n]*W[b,c,q,g,r,m]",
    "HC[b,c,g,r,p,n] = CD[b,c,g,r]*HC[b,c-1,g,r,p,n] + ST[b,c,g,r,p,n] - KW[b,c,g,r,n,m]*HC[b,c-1,g,r,p,m]",
    "QE[b,c,q,g,r,n] = QN[b,c*Q+q,g,n]*DO[b,c,q,g,r] - QK[b,c,q,s,g]*LD[b,c,q,s,g,r]*W[b,c,s,g,r,n]",
    "YI[b,c,q,g,r,p] = QK[b,c,q,s,g]*LD[b,c,q,s,g,r]*U[b,c,s,g,r,p]",
    "YO[b,c,q,g,r,p] = QE[b,c,q,g,r,n]*HC[b,c-1,g,r,p,n]",
    "YD[b,c,q,g,r,p] = YI[b,c,q,g,r,p] + YO[b,c,q,g,r,p]",
)

_TAIL: tuple[str, ...] = (
    "SG[b,{o},g,r] = YD[b,{o},g,r,p]*YD[b,{o},g,r,p]",
    "RG[b,{o},g,r] = rsqrt(SG[b,{o},g,r]/P + geps)",
    "GZ[b,{o},g,r,p] = silu(ZG[b,{i},g,r,p])",
    "YN[b,{o},g,r,p] = YD[b,{o},g,r,p]*RG[b,{o},g,r]*WGN[p]*GZ[b,{o},g,r,p]",
    "O[b,{o},d] = YN[b,{o},g,r,p]*WO[g,r,p,d]",
    "XO[b,{o},d] = X[b,{i},d] + O[b,{o},d]",
)
TAIL_RECURRENT: tuple[str, ...] = tuple(line.format(o="i", i="i") for line in _TAIL)
TAIL_CHUNKED: tuple[str, ...] = tuple(line.format(o="c,q", i="c*Q+q") for line in _TAIL)

_W, _X, _S = Role.WEIGHT, Role.INTERMEDIATE, Role.INPUT
_TENSORS: dict[str, tuple[tuple[str, ...], Role, str]] = {
    "X": (("B", "I", "D"), Role.INPUT, "layer input (residual stream)"),
    "WN": (("D",), _W, "input_layernorm weight"),
    "SS": (("B", "I"), _X, "sum of squares"),
    "RS": (("B", "I"), _X, "reciprocal RMS"),
    "XN": (("B", "I", "D"), _X, "normalised input"),
    "WQ": (("D", "G", "N"), _W, "q_proj"),
    "WK": (("D", "G", "N"), _W, "k_proj"),
    "WV": (("D", "G", "R", "P"), _W, "v_proj"),
    "WA": (("D", "G", "R"), _W, "a_proj"),
    "BDT": (("G", "R"), _W, "dt_bias"),
    "WBT": (("D", "G", "R"), _W, "b_proj"),
    "WG": (("D", "G", "R", "P"), _W, "g_proj (output gate)"),
    "QI": (("B", "I", "G", "N"), _X, "q before the conv"),
    "KI": (("B", "I", "G", "N"), _X, "k before the conv"),
    "VI": (("B", "I", "G", "R", "P"), _X, "v before the conv"),
    "AI": (("B", "I", "G", "R"), _X, "a + dt_bias"),
    "BI": (("B", "I", "G", "R"), _X, "b (beta logits)"),
    "ZG": (("B", "I", "G", "R", "P"), _X, "output gate logits"),
    "WCQ": (("G", "N", "K"), _W, "conv1d weight, q channels"),
    "WCK": (("G", "N", "K"), _W, "conv1d weight, k channels"),
    "WCV": (("G", "R", "P", "K"), _W, "conv1d weight, v channels"),
    "QC": (("B", "I", "G", "N"), _X, "conv output, q"),
    "KC": (("B", "I", "G", "N"), _X, "conv output, k"),
    "VC": (("B", "I", "G", "R", "P"), _X, "conv output, v"),
    "QS": (("B", "I", "G", "N"), _X, "silu(conv q)"),
    "KS": (("B", "I", "G", "N"), _X, "silu(conv k)"),
    "V": (("B", "I", "G", "R", "P"), _X, "values, silu(conv v)"),
    "SQ": (("B", "I", "G"), _X, "q sum of squares"),
    "RQ": (("B", "I", "G"), _X, "q inverse L2 norm times 1/sqrt(N)"),
    "QN": (("B", "I", "G", "N"), _X, "queries, L2-normalised and scaled"),
    "SK": (("B", "I", "G"), _X, "k sum of squares"),
    "RK": (("B", "I", "G"), _X, "k inverse L2 norm"),
    "KN": (("B", "I", "G", "N"), _X, "keys, L2-normalised"),
    "BETA": (("B", "I", "G", "R"), _X, "write strength beta"),
    "A": (("G", "R"), _W, "A = -exp(A_log), one per value head"),
    "GL": (("B", "I", "G", "R"), _X, "log decay g = A*softplus(a + dt_bias)"),
    # recurrent
    "AD": (("B", "I", "G", "R"), _X, "decay exp(g)"),
    "KB": (("B", "I", "G", "R", "N"), _X, "beta*k"),
    "H": (("B", "I", "G", "R", "P", "N"), _X, "state over positions"),
    # chunked
    "ACS": (("B", "C", "Q", "G", "R"), _X, "cumulative log decay within a chunk"),
    "LM": (("Q", "S"), _S, "constant causal mask in log space: 0 if s <= q else -inf"),
    "SL": (("Q", "S"), _S, "constant strictly lower mask: 1 if s < q else 0"),
    "EYE": (("Q", "S"), _S, "constant identity"),
    "LD": (("B", "C", "Q", "S", "G", "R"), _X, "pair decay exp(ACS[q]-ACS[s]), masked"),
    "DO": (("B", "C", "Q", "G", "R"), _X, "decay from the chunk start"),
    "DC": (("B", "C", "Q", "G", "R"), _X, "decay to the chunk end"),
    "CD": (("B", "C", "G", "R"), _X, "decay over a whole chunk"),
    "KK": (("B", "C", "Q", "S", "G"), _X, "key-key products in a chunk"),
    "QK": (("B", "C", "Q", "S", "G"), _X, "query-key products in a chunk"),
    "AS": (("B", "C", "Q", "S", "G", "R"), _X, "UT system, strictly lower"),
    "TI": (("B", "C", "Q", "S", "G", "R"), _X, "(I + AS)^-1 by forward substitution"),
    "U": (("B", "C", "Q", "G", "R", "P"), _X, "new values TI x (beta v)"),
    "W": (("B", "C", "Q", "G", "R", "N"), _X, "decayed keys TI x (beta k exp(ACS))"),
    "ST": (("B", "C", "G", "R", "P", "N"), _X, "state a chunk adds"),
    "KW": (("B", "C", "G", "R", "N", "M"), _X, "a chunk's state correction (key x key)"),
    "HC": (("B", "C", "G", "R", "P", "N"), _X, "state at each chunk's end"),
    "QE": (("B", "C", "Q", "G", "R", "N"), _X, "query against the previous chunks' state"),
    "YI": (("B", "C", "Q", "G", "R", "P"), _X, "intra-chunk output"),
    "YO": (("B", "C", "Q", "G", "R", "P"), _X, "inter-chunk output"),
    # tail ('*' = the position ranks)
    "YD": (("B", "*", "G", "R", "P"), _X, "attention output o = S^T q"),
    "SG": (("B", "*", "G", "R"), _X, "sum of squares per value head"),
    "RG": (("B", "*", "G", "R"), _X, "reciprocal RMS per value head"),
    "GZ": (("B", "*", "G", "R", "P"), _X, "silu(gate)"),
    "WGN": (("P",), _W, "o_norm weight (shared by the heads)"),
    "YN": (("B", "*", "G", "R", "P"), _X, "gated, normalised output"),
    "WO": (("G", "R", "P", "D"), _W, "o_proj"),
    "O": (("B", "*", "D"), _X, "mixer output"),
    "XO": (("B", "*", "D"), Role.OUTPUT, "layer output (residual stream)"),
}
_RECURRENT_ONLY = {"AD", "KB", "H"}
_CHUNKED_ONLY = {"ACS", "LM", "SL", "EYE", "LD", "DO", "DC", "CD", "KK", "QK", "AS", "TI", "U", "W", "ST", "KW", "HC",
                 "QE", "YI", "YO"}

#: Weight tensors of a layer (:func:`~mambalaya.workloads.hf.weights_gdn.gdn_weights` returns them).
WEIGHTS: tuple[str, ...] = tuple(t for t, (_, role, _) in _TENSORS.items() if role == Role.WEIGHT)
CONSTANTS: tuple[str, ...] = ("LM", "SL", "EYE")
#: The recurrent region a fine-grained-fusion baseline fuses (as Mamba's SSM region).
DELTA_REGION: tuple[str, ...] = ("AD", "KB", "H", "YD")
CHUNK_REGION: tuple[str, ...] = ("ACS", "LD", "DO", "DC", "CD", "KK", "QK", "AS", "TI", "U", "W", "ST", "KW", "HC",
                                 "QE", "YI", "YO", "YD")


def gdn_layer(config: GatedDeltaNetConfig, *, batch: int, seq_len: int, phase: str = "prefill", bits: int = 16,
              state_io: bool | None = None, scan: str = "recurrent", name: str | None = None,
              chunk_size: int | None = None) -> Cascade:
    """One Gated DeltaNet block as a cascade (arguments as
    :func:`~mambalaya.workloads.blocks.mamba2.mamba2_layer`): ``scan="chunked"`` is the WY/UT chunked
    form with chunks of ``chunk_size`` (default ``config.chunk_size``; prefill only; its ``XO`` is
    ``[B,C,Q,D]``), ``scan="recurrent"`` the per-position delta rule (the decode form), which
    takes no ``chunk_size``. Without ``state_io`` a prefill writes no final states (``HN``,
    ``CS*N``): build it with ``state_io=True`` to continue from it."""
    if scan not in ("recurrent", "chunked"):
        raise SpecError(f"scan must be 'recurrent' or 'chunked', not {scan!r}")
    check_layer_args(phase, batch=batch, seq_len=seq_len, bits=bits)
    if phase == "decode" and scan == "chunked":
        raise SpecError("a decode step (I = 1) uses the recurrent scan; scan='chunked' is for prefill")
    if chunk_size is not None:
        config = config.with_chunk_size(check_chunk_size_form(chunk_size, scan=scan, phase=phase))
    positions = 1 if phase == "decode" else seq_len
    with_state = phase == "decode" if state_io is None else state_io
    if phase == "decode" and not with_state:
        raise SpecError("a decode step reads and writes the recurrent and conv states; state_io cannot be False")
    c, chunked = config, scan == "chunked"
    ranks = [Rank("B", batch, "batch"), Rank("I", positions, "L"), Rank("D", c.d_model, "d_model"),
             Rank("G", c.num_k_heads, "num_k_heads"), Rank("R", c.heads_per_group, "num_v_heads/num_k_heads"),
             Rank("N", c.k_head_dim, "k_head_dim"), Rank("P", c.v_head_dim, "v_head_dim"),
             Rank("M", c.k_head_dim, "k_head_dim"), Rank("K", c.d_conv, "d_conv")]
    params: dict[str, float] = {"batch": batch, "L": positions, "d_model": c.d_model, "eps": c.norm_eps,
                                "l2eps": c.l2_eps, "geps": c.gate_norm_eps, "bscale": c.beta_scale,
                                "num_k_heads": c.num_k_heads, "num_v_heads": c.num_v_heads, "k_head_dim": c.k_head_dim,
                                "v_head_dim": c.v_head_dim, "d_conv": c.d_conv}
    if chunked:
        q = c.chunk_size
        params["chunk_size"] = q
        ranks += [Rank("C", math.ceil(positions / q), "ceil(L/chunk_size)"), Rank("Q", q, "chunk_size"),
                  Rank("S", q, "chunk_size"), Rank("T", q, "chunk_size")]
    skip = _RECURRENT_ONLY if chunked else _CHUNKED_ONLY
    where = ("C", "Q") if chunked else ("I",)
    tensors: dict[str, TensorSpec] = {}
    for t, (rk, role, desc) in _TENSORS.items():
        if t in skip:
            continue
        if "*" in rk:
            at = rk.index("*")
            rk = rk[:at] + where + rk[at + 1:]
        tensors[t] = TensorSpec(t, rk, role, bits, description=desc)
    tensors = with_masks(tensors, {"LM": causal_band("Q", "S"), "SL": STRICTLY_LOWER, "EYE": DIAGONAL})
    lines = list(FRONT) + list(SCAN_CHUNKED if chunked else SCAN_RECURRENT)
    lines += TAIL_CHUNKED if chunked else TAIL_RECURRENT
    if with_state:
        _add_state(tensors, ranks, lines, c, positions, chunked, bits)
    sizes = {r.name: r.size for r in ranks}
    return build_cascade(
        name=name or f"gdn-{phase}" + ("-chunked" if chunked else ""),
        params=params, ranks=ranks, tensors=list(tensors.values()),
        einsums=[parse_einsum(line, sizes=sizes) for line in lines],
        description=(f"Gated DeltaNet block, {phase}, {scan} scan, d_model={c.d_model}, k heads={c.num_k_heads}, "
                     f"v heads={c.num_v_heads}, head dims {c.k_head_dim}x{c.v_head_dim}, batch={batch}, I={positions}"
                     + (f", chunks {math.ceil(positions / c.chunk_size)}x{c.chunk_size}" if chunked else "")),
        regions={"ssm": CHUNK_REGION if chunked else DELTA_REGION},
    )


def _add_state(tensors: dict[str, TensorSpec], ranks: list[Rank], lines: list[str], c: GatedDeltaNetConfig,
               positions: int, chunked: bool, bits: int) -> None:
    """The incoming and outgoing conv and recurrent states (see the module docstring)."""
    if c.d_conv > 1:
        ranks.append(Rank("J", c.d_conv - 1, "d_conv-1"))
        for src, part, idx in (("QI", "Q", "g,n"), ("KI", "K", "g,n"), ("VI", "V", "g,r,p")):
            rk = ("B", "J") + tensors[src].ranks[2:]
            cs0, csn = f"CS{part}0", f"CS{part}N"
            tensors[cs0] = TensorSpec(cs0, rk, Role.STATE, bits, description=f"incoming conv state, {part} channels")
            tensors[csn] = TensorSpec(csn, rk, Role.STATE, bits, updates=cs0,
                                      description=f"outgoing conv state, {part} channels")
            tensors[src] = replace(tensors[src], initial=cs0)
            lines.append(f"{csn}[b,j,{idx}] = {src}[b,j+I-(K-1),{idx}]")
    state = ("B", "G", "R", "P", "N")
    tensors["H0"] = TensorSpec("H0", state, Role.STATE, bits, description="incoming recurrent state")
    if chunked:
        tensors["HC"] = replace(tensors["HC"], initial="H0")
        tensors["HN"] = TensorSpec("HN", state, Role.STATE, bits, updates="H0", description="outgoing recurrent state")
        lines.append("HN[b,g,r,p,n] = HC[b,C-1,g,r,p,n]")
    elif positions == 1:
        tensors["H"] = replace(tensors["H"], role=Role.STATE, initial="H0", updates="H0",
                               description="recurrent state, outgoing (I = 1)")
    else:
        tensors["H"] = replace(tensors["H"], initial="H0")
        tensors["HN"] = TensorSpec("HN", state, Role.STATE, bits, updates="H0", description="outgoing recurrent state")
        lines.append("HN[b,g,r,p,n] = H[b,I-1,g,r,p,n]")


def gdn_constants(cascade: Cascade) -> dict[str, np.ndarray]:
    """The constants of the chunked form (float64): ``LM`` (0 where ``s <= q``, ``-inf`` above),
    ``SL`` (1 where ``s < q``, else 0) and ``EYE``; ``{}`` for the recurrent form."""
    if "LM" not in cascade.tensors:
        return {}
    q, s = cascade.shape("LM")
    return {"LM": causal_mask(q, s), "SL": np.tril(np.ones((q, s)), k=-1), "EYE": np.eye(q, s)}


__all__ = ["CONSTANTS", "DEFAULT_CHUNK_SIZE", "FRONT", "PRESETS", "SCAN_CHUNKED", "SCAN_RECURRENT", "WEIGHTS",
           "GatedDeltaNetConfig", "check_chunk_size_form", "checked_chunk_size", "gdn_constants", "gdn_layer",
           "parse_gdn_config"]
