"""A pre-norm attention block (RMSNorm, grouped-query attention with rotary position
embedding, residual) as a cascade of extended Einsums.

The cascade follows transformers' Llama-style attention as the hybrid models use it
(``BambaAttention``: ``q_proj``/``k_proj``/``v_proj``/``o_proj`` with no bias,
``apply_rotary_pos_emb`` on the first ``rotary_dim`` channels of each head, ``repeat_kv``
for grouped-query heads, ``eager_attention_forward``), operation for operation.

Ranks: ``B`` batch, ``I`` query position, ``T`` key position, ``D`` hidden size, ``G`` key/value
heads, ``R`` query heads per key/value head, ``E`` head dim; the head's rotated channels
are split into ``U`` (2 halves) x ``W`` (``rotary_dim/2`` frequencies) and the rest, ``P``
(``head_dim - rotary_dim``, absent when the whole head rotates). Query head ``h = g*R + r``
reads key/value head ``g`` (``repeat_kv``); channel ``u*W + w`` of a head is rotated and
channel ``rotary_dim + p`` passes through. Decode adds ``M``, the cached positions.

====  ==========================================================  ==========================
 #     Einsum                                                       what
====  ==========================================================  ==========================
 1-3   ``SS``, ``RS``, ``XN``                                       pre-norm RMSNorm
 4-8   ``QA``, ``QB``, ``KA``, ``KB``, ``V`` = ``XN`` x weights       projections (rotated part
                                                                    ``A``, pass-through ``B``)
 9-10  ``QR[b,i,g,r,u,w] = QA[..,u,w]*COS[i,w] + QA[..,1-u,w]*SIN[u,i,w]``
       (and ``KR`` over ``[b,i,g,u,w]``)                            rotary embedding
 11    ``SC[b,i,t,g,r] = QR*KR*scale + QB*KB*scale + CM[i,t]``      scores, causal mask
 12-16 three-pass softmax (``MX`` max, ``EX`` exp, ``SM`` sum,       or the one-pass online
       ``PR`` divide) and ``AO = PR x V``                           softmax (below)
 17-18 ``O = AO x WO``, ``XO = X + O``                               output projection, residual
====  ==========================================================  ==========================

``rotate_half`` is written with affine indices: ``out[u] = x[u]*cos + x[1-u]*sgn(u)*sin`` with
``sgn(0) = -1``, ``sgn(1) = +1`` folded into the constant ``SIN[u,i,w]``. ``COS``/``SIN`` are the
rotary tables at the block's absolute positions and ``CM[i,t]`` the causal mask in log space
(``0`` where ``t <= i``, ``-inf`` above): constant inputs from :func:`attention_constants`, as
the chunked Mamba-2 cascade reads its mask (the IR has no comparisons). The mask is declared
on its tensor (:class:`~mambalaya.einsum.ir.Mask`), and the cost model skips the work it makes
dead (:mod:`mambalaya.einsum.dead_work`): the score, exponent and value work of the ``(i, t)``
pairs above the diagonal, in this form and the online one, per key; the executor computes every
pair and masks, which gives the same values.

``softmax="online"`` replaces 12-16 by the one-pass form fused attention kernels use, a
recurrence along the key rank ``T`` that carries a running max ``MR`` and sum ``LR``:

* ``MR[b,i,t,g,r] = max(MR[b,i,t-1,g,r], SC[b,i,t,g,r])``
* ``CF[b,i,t,g,r] = exp(MR[b,i,t-1,g,r] - MR[b,i,t,g,r])`` (rescales what came before)
* ``PE[b,i,t,g,r] = exp(SC[b,i,t,g,r] - MR[b,i,t,g,r])``
* ``LR[b,i,t,g,r] = LR[b,i,t-1,g,r]*CF + PE`` and ``OR[b,i,t,g,r,e] = OR[b,i,t-1,g,r,e]*CF + PE*V[b,t,g,e]``
* ``AO[b,i,g,r,e] = OR[b,i,T-1,g,r,e]/LR[b,i,T-1,g,r]``

The running max starts at 0, not at ``-inf`` as kernels start it (a read below ``t = 0`` is
zero in the IR): softmax does not change when every score is shifted by one constant, so the
values are the same unless every score of a row is below about -87 (float32), where
``exp`` underflows.

``softmax="blocked"`` replaces 11-16 by FlashAttention's blocked online softmax (Dao 2023,
FlashAttention-2 Algorithm 1): the same recurrence, run over *blocks of keys*. The key rank
``T`` splits into ``TB = ceil(T / key_block)`` blocks of ``TQ = key_block`` keys, key
``tb*TQ + tq``; per block the recurrence takes the block's row max, rescales once, and the
block's value product is a matrix product (``PE x V`` over ``TQ``, on the 2D array):

* ``SC[b,i,tb,tq,g,r] = QR*KR[b,tb*TQ+tq,..]*scale + QB*KB[b,tb*TQ+tq,..]*scale + KM[i,tb,tq]``
* ``KBX[b,i,tb,g,r] max= SC[b,i,tb,tq,g,r]`` (the block's row max)
* ``MR[b,i,tb,g,r] = max(MR[b,i,tb-1,g,r], KBX[b,i,tb,g,r])``
* ``CF[b,i,tb,g,r] = exp(MR[b,i,tb-1,g,r] - MR[b,i,tb,g,r])`` (one rescale per block)
* ``PE[b,i,tb,tq,g,r] = exp(SC[b,i,tb,tq,g,r] - MR[b,i,tb,g,r])``, ``KBS[b,i,tb,g,r] = PE`` summed over ``tq``
* ``LR[b,i,tb,g,r] = LR[b,i,tb-1,g,r]*CF + KBS`` and
  ``OR[b,i,tb,g,r,e] = OR[b,i,tb-1,g,r,e]*CF[b,i,tb,g,r] + PE[b,i,tb,tq,g,r]*V[b,tb*TQ+tq,g,e]``
* ``AO[b,i,g,r,e] = OR[b,i,TB-1,g,r,e]/LR[b,i,TB-1,g,r]``

``key_block`` is a setting (default :data:`KEY_BLOCK` = 64: FlashAttention-2's forward
kernel's block of keys, ``kBlockN = 64`` for head dim 128 in ``flash_fwd_launch_template.h``).
Keys past the last one (``tb*TQ+tq >= T`` when ``key_block`` does not divide ``T``) read zeros
in the IR, as the chunked Mamba-2 form's last chunk does, so the constant ``KM[i,tb,tq]``
masks them in both phases: ``0`` for a real key the query sees (in prefill ``key <= i``, in
decode every one of the ``T = L + 1``), ``-inf`` for a masked or padded one
(:func:`attention_constants`). The running max starts at 0, as the online form's does: block 0
holds key 0, which every query sees, and ``TB = ceil(T / key_block)`` makes no block of padding
alone, so a block's max is ``-inf`` only when causality masks all of it, and then the running
max, finite from its start, stays as it was (``CF = 1``, ``PE = 0``; from ``-inf`` it would be
``-inf - -inf``). The shift argument of the online form holds unchanged. A causal blocked
prefill skips the key blocks the mask hides whole, as block-skipping kernels do (the mask's
cells are blocks of ``TQ`` keys: :mod:`mambalaya.einsum.dead_work`): its Einsums over ``I`` and
``TB`` do, and the tensors they write move, the share of (query, key block) pairs a query sees
(about one half; :func:`mambalaya.einsum.routing.computed_key_blocks`).

Decode (``I = 1``) reads the key/value cache as state: ``KR``, ``KB`` and ``V`` take the cached
``KC0A[b,m,g,u,w]``, ``KC0B[b,m,g,p]``, ``VC0[b,m,g,e]`` (``M = L`` positions, rotated keys, as
transformers caches them) as their values below position 0, and the scores read
``KR[b,t-(T-1),..]`` over ``T = L + 1`` keys: ``L`` cached, then the new one (the blocked
form reads ``KR[b,tb*TQ+tq-M,..]``, ``M = L = T - 1``: the same keys). The new position's
key and value are written as ``KNA``, ``KNB``, ``VN`` (appended to the cache: :func:`append_kv`),
so a step reads ``L`` cached positions and writes one. A prefill writes the cache of its ``L``
positions the same way (``cache_out=True``, the default), as transformers' ``cache.update`` does.
"""

from __future__ import annotations

from typing import Any, Literal

import math

import numpy as np
from pydantic import BaseModel, Field, PositiveInt, model_validator

from mambalaya.specio import SPEC_MODEL_CONFIG

from mambalaya.errors import SpecError
from mambalaya.workloads.checks import check_layer_args, validated_config
from mambalaya.workloads.blocks.masks import causal_band, causal_mask, key_block_mask, key_blocks, with_masks
from mambalaya.einsum.cascade import Cascade, build_cascade
from mambalaya.einsum.ir import Rank, Role, TensorSpec
from mambalaya.einsum.parse import parse_einsum

Phase = Literal["prefill", "decode"]
Softmax = Literal["three-pass", "online", "blocked"]
#: The softmax forms every layer with attention takes.
SOFTMAX_FORMS: tuple[str, ...] = ("three-pass", "online", "blocked")
#: The default key block of ``softmax="blocked"``: FlashAttention-2's forward kernel runs
#: blocks of ``kBlockN = 64`` keys for head dim 128 (Dao-AILab/flash-attention
#: ``csrc/flash_attn/src/flash_fwd_launch_template.h``, ``run_mha_fwd_hdim128``:
#: ``Flash_fwd_kernel_traits<128, 128, 64, 4, ...>``, 128 queries x 64 keys, on sm80 and sm90;
#: sm86/sm89 run 32 keys when not causal). A setting (``key_block=``), not a property of the model.
KEY_BLOCK = 64


class AttentionConfig(BaseModel):
    """The shape of one grouped-query attention block (transformers' names in brackets):
    ``d_model`` [hidden_size], ``n_heads`` [num_attention_heads], ``n_kv_heads``
    [num_key_value_heads], ``head_dim`` [head_dim, else hidden_size / num_attention_heads],
    ``rope_theta`` [rope_parameters.rope_theta], ``partial_rotary_factor`` (Bamba: 0.5),
    ``norm_eps`` [rms_norm_eps]."""

    model_config = SPEC_MODEL_CONFIG

    d_model: PositiveInt
    n_heads: PositiveInt
    n_kv_heads: PositiveInt
    head_dim: PositiveInt | None = None
    rope_theta: float = Field(10000.0, gt=0)
    partial_rotary_factor: float = Field(1.0, ge=0, le=1)
    norm_eps: float = Field(1e-5, gt=0)

    @model_validator(mode="after")
    def _heads_fit(self) -> "AttentionConfig":
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ValueError(
                f"n_heads = {self.n_heads} does not divide d_model = {self.d_model} (and no head_dim is given)"
            )
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads = {self.n_kv_heads} does not divide n_heads = {self.n_heads}")
        if self.rotary_dim % 2:
            raise ValueError(
                f"rotary_dim = int(head_dim * partial_rotary_factor) = {self.rotary_dim} is odd: rotary "
                "embedding rotates pairs of channels"
            )
        return self

    @property
    def head_channels(self) -> int:
        return self.head_dim or self.d_model // self.n_heads

    @property
    def rotary_dim(self) -> int:
        return int(self.head_channels * self.partial_rotary_factor)

    @property
    def heads_per_kv(self) -> int:
        return self.n_heads // self.n_kv_heads

    def layer_parameters(self) -> int:
        """Weight elements of one block: the pre-norm and the four projections (no bias)."""
        d, e, h, g = self.d_model, self.head_channels, self.n_heads, self.n_kv_heads
        return d + d * h * e + 2 * d * g * e + h * e * d


def parse_attention_config(data: dict, *, source: str = "attention config") -> AttentionConfig:
    return validated_config(AttentionConfig, data, what="attention", source=source)


_W, _X, _IN, _ST = Role.WEIGHT, Role.INTERMEDIATE, Role.INPUT, Role.STATE

NORM: tuple[str, ...] = (
    "SS[b,i] = X[b,i,d]*X[b,i,d]",
    "RS[b,i] = rsqrt(SS[b,i]/D + eps)",
    "XN[b,i,d] = X[b,i,d]*RS[b,i]*WN[d]",
)

ROTARY: tuple[str, ...] = (
    "QA[b,i,g,r,u,w] = XN[b,i,d]*WQA[d,g,r,u,w]",
    "KA[b,i,g,u,w] = XN[b,i,d]*WKA[d,g,u,w]",
    "QR[b,i,g,r,u,w] = QA[b,i,g,r,u,w]*COS[i,w] + QA[b,i,g,r,1-u,w]*SIN[u,i,w]",
    "KR[b,i,g,u,w] = KA[b,i,g,u,w]*COS[i,w] + KA[b,i,g,1-u,w]*SIN[u,i,w]",
)
PASS: tuple[str, ...] = (
    "QB[b,i,g,r,p] = XN[b,i,d]*WQB[d,g,r,p]",
    "KB[b,i,g,p] = XN[b,i,d]*WKB[d,g,p]",
)
VALUE = "V[b,i,g,e] = XN[b,i,d]*WV[d,g,e]"

THREE_PASS: tuple[str, ...] = (
    "MX[b,i,g,r] max= SC[b,i,t,g,r]",
    "EX[b,i,t,g,r] = exp(SC[b,i,t,g,r] - MX[b,i,g,r])",
    "SM[b,i,g,r] = EX[b,i,t,g,r]",
    "PR[b,i,t,g,r] = EX[b,i,t,g,r]/SM[b,i,g,r]",
    "AO[b,i,g,r,e] = PR[b,i,t,g,r]*V[b,{t},g,e]",
)
ONLINE: tuple[str, ...] = (
    "MR[b,i,t,g,r] = max(MR[b,i,t-1,g,r], SC[b,i,t,g,r])",
    "CF[b,i,t,g,r] = exp(MR[b,i,t-1,g,r] - MR[b,i,t,g,r])",
    "PE[b,i,t,g,r] = exp(SC[b,i,t,g,r] - MR[b,i,t,g,r])",
    "LR[b,i,t,g,r] = LR[b,i,t-1,g,r]*CF[b,i,t,g,r] + PE[b,i,t,g,r]",
    "OR[b,i,t,g,r,e] = OR[b,i,t-1,g,r,e]*CF[b,i,t,g,r] + PE[b,i,t,g,r]*V[b,{t},g,e]",
    "AO[b,i,g,r,e] = OR[b,i,T-1,g,r,e]/LR[b,i,T-1,g,r]",
)


def check_softmax(softmax: str) -> None:
    """Refuse a softmax form no attention layer has."""
    if softmax not in SOFTMAX_FORMS:
        raise SpecError(f"softmax must be one of {', '.join(repr(f) for f in SOFTMAX_FORMS)}, not {softmax!r}")


def key_block_ranks(keys: int, key_block: int, *, decode: bool) -> list[Rank]:
    """The blocked form's key ranks: ``TB = ceil(keys / key_block)`` blocks of ``TQ = key_block``
    keys (``keys`` = ``L`` in prefill, ``L + 1`` in decode)."""
    if isinstance(key_block, bool) or not isinstance(key_block, int) or key_block < 1:
        raise SpecError(f"key_block must be a positive whole number of keys, not {key_block!r}")
    return [Rank("TB", math.ceil(keys / key_block), "ceil((L+1)/key_block)" if decode else "ceil(L/key_block)"),
            Rank("TQ", key_block, "key_block")]


def key_index(decode: bool) -> str:
    """The key a blocked Einsum reads at ``[tb, tq]``: ``tb*TQ+tq``, in decode shifted by the
    ``M`` cached positions (the cache is the state below position 0, as ``t-(T-1)`` reads it)."""
    return "tb*TQ+tq-M" if decode else "tb*TQ+tq"


def blocked_softmax_lines(score_products: list[str] | tuple[str, ...], *, prefix: str = "", heads: str = "g,r",
                          value: str = "V", mask: str | None = "KM", decode: bool = False) -> list[str]:
    """The blocked form's Einsums, scores to ``AO`` (see the module docstring), for a layer
    whose attention tensors are named ``prefix`` + the attention block's names (Falcon-H1's and
    Zamba2's ``A``), with query heads ``heads`` (the key/value head first) and values ``value``.
    ``score_products`` are the score's products, ``{k}`` where they read a key."""
    p, h, k = prefix, heads, key_index(decode)
    kv = h.split(",")[0]
    scores = [term.replace("{k}", k) for term in score_products] + ([f"{mask}[i,tb,tq]"] if mask else [])
    return [
        f"{p}SC[b,i,tb,tq,{h}] = " + " + ".join(scores),
        f"{p}KBX[b,i,tb,{h}] max= {p}SC[b,i,tb,tq,{h}]",
        f"{p}MR[b,i,tb,{h}] = max({p}MR[b,i,tb-1,{h}], {p}KBX[b,i,tb,{h}])",
        f"{p}CF[b,i,tb,{h}] = exp({p}MR[b,i,tb-1,{h}] - {p}MR[b,i,tb,{h}])",
        f"{p}PE[b,i,tb,tq,{h}] = exp({p}SC[b,i,tb,tq,{h}] - {p}MR[b,i,tb,{h}])",
        f"{p}KBS[b,i,tb,{h}] = {p}PE[b,i,tb,tq,{h}]",
        f"{p}LR[b,i,tb,{h}] = {p}LR[b,i,tb-1,{h}]*{p}CF[b,i,tb,{h}] + {p}KBS[b,i,tb,{h}]",
        f"{p}OR[b,i,tb,{h},e] = {p}OR[b,i,tb-1,{h},e]*{p}CF[b,i,tb,{h}] + {p}PE[b,i,tb,tq,{h}]*{value}[b,{k},{kv},e]",
        f"{p}AO[b,i,{h},e] = {p}OR[b,i,TB-1,{h},e]/{p}LR[b,i,TB-1,{h}]",
    ]


def blocked_tensors(*, prefix: str = "", heads: tuple[str, str] = ("G", "R"),
                    mask: str = "KM") -> dict[str, tuple[tuple[str, ...], Role, str]]:
    """The blocked form's tensors (name: ranks, role, description), named as
    :func:`blocked_softmax_lines` names them."""
    p, h = prefix, heads
    row, key = ("B", "I", "TB", *h), ("B", "I", "TB", "TQ", *h)
    return {
        mask: (("I", "TB", "TQ"), _IN,
               "key mask in log space: 0 for a key the query sees, -inf for a later or padded one"),
        f"{p}SC": (key, _X, "scaled, masked scores, by key block"),
        f"{p}KBX": (row, _X, "each key block's row max"),
        f"{p}MR": (row, _X, "running max over key blocks (blocked softmax)"),
        f"{p}CF": (row, _X, "rescale factor exp(old max - new max), once per key block"),
        f"{p}PE": (key, _X, "exp(score - running max)"),
        f"{p}KBS": (row, _X, "each key block's row sum"),
        f"{p}LR": (row, _X, "running sum over key blocks (blocked softmax)"),
        f"{p}OR": ((*row, "E"), _X, "running weighted values over key blocks (blocked softmax)"),
    }


OUTPUT: tuple[str, ...] = (
    "O[b,i,d] = AO[b,i,g,r,e]*WO[g,r,e,d]",
    "XO[b,i,d] = X[b,i,d] + O[b,i,d]",
)

# name: (ranks, role, description)
_TENSORS: dict[str, tuple[tuple[str, ...], Role, str]] = {
    "X": (("B", "I", "D"), _IN, "block input (residual stream)"),
    "WN": (("D",), _W, "input RMSNorm weight"),
    "SS": (("B", "I"), _X, "sum of squares"),
    "RS": (("B", "I"), _X, "reciprocal RMS"),
    "XN": (("B", "I", "D"), _X, "normalised input"),
    "WQA": (("D", "G", "R", "U", "W"), _W, "q_proj, rotated channels"),
    "WQB": (("D", "G", "R", "P"), _W, "q_proj, pass-through channels"),
    "WKA": (("D", "G", "U", "W"), _W, "k_proj, rotated channels"),
    "WKB": (("D", "G", "P"), _W, "k_proj, pass-through channels"),
    "WV": (("D", "G", "E"), _W, "v_proj"),
    "QA": (("B", "I", "G", "R", "U", "W"), _X, "query, rotated channels before rotation"),
    "QB": (("B", "I", "G", "R", "P"), _X, "query, pass-through channels"),
    "KA": (("B", "I", "G", "U", "W"), _X, "key, rotated channels before rotation"),
    "KB": (("B", "I", "G", "P"), _X, "key, pass-through channels"),
    "V": (("B", "I", "G", "E"), _X, "value"),
    "COS": (("I", "W"), _IN, "rotary cos table at the block's positions"),
    "SIN": (("U", "I", "W"), _IN, "rotary sin table, signed per half (-sin, +sin)"),
    "QR": (("B", "I", "G", "R", "U", "W"), _X, "query after rotary embedding"),
    "KR": (("B", "I", "G", "U", "W"), _X, "key after rotary embedding"),
    "CM": (("I", "T"), _IN, "causal mask in log space: 0 if t <= i else -inf"),
    "SC": (("B", "I", "T", "G", "R"), _X, "scaled, masked scores"),
    "MX": (("B", "I", "G", "R"), _X, "row max of the scores"),
    "EX": (("B", "I", "T", "G", "R"), _X, "exp(score - row max)"),
    "SM": (("B", "I", "G", "R"), _X, "row sum"),
    "PR": (("B", "I", "T", "G", "R"), _X, "attention probabilities"),
    "MR": (("B", "I", "T", "G", "R"), _X, "running max (online softmax)"),
    "CF": (("B", "I", "T", "G", "R"), _X, "rescale factor exp(old max - new max)"),
    "PE": (("B", "I", "T", "G", "R"), _X, "exp(score - running max)"),
    "LR": (("B", "I", "T", "G", "R"), _X, "running sum (online softmax)"),
    "OR": (("B", "I", "T", "G", "R", "E"), _X, "running weighted values (online softmax)"),
    "AO": (("B", "I", "G", "R", "E"), _X, "attention output per head"),
    "WO": (("G", "R", "E", "D"), _W, "o_proj"),
    "O": (("B", "I", "D"), _X, "attention output"),
    "XO": (("B", "I", "D"), Role.OUTPUT, "block output (residual stream)"),
}

#: The weight tensors of a block (what the loader returns).
WEIGHTS: tuple[str, ...] = ("WN", "WQA", "WQB", "WKA", "WKB", "WV", "WO")
#: Cache tensors: incoming (decode) and appended (both phases).
CACHE_IN: tuple[str, ...] = ("KC0A", "KC0B", "VC0")
CACHE_OUT: tuple[str, ...] = ("KNA", "KNB", "VN")
_CACHED = {"KR": ("KC0A", "KNA"), "KB": ("KC0B", "KNB"), "V": ("VC0", "VN")}

#: The attention core a fusing baseline would run as one kernel (scores through the value
#: product), per softmax form.
ATTENTION_REGION: dict[str, tuple[str, ...]] = {
    "three-pass": ("SC", "MX", "EX", "SM", "PR", "AO"),
    "online": ("SC", "MR", "CF", "PE", "LR", "OR", "AO"),
    "blocked": ("SC", "KBX", "MR", "CF", "PE", "KBS", "LR", "OR", "AO"),
}


def attention_layer(
    config: AttentionConfig,
    *,
    batch: int,
    seq_len: int,
    phase: Phase = "prefill",
    bits: int = 16,
    softmax: Softmax = "three-pass",
    cache_out: bool = True,
    name: str | None = None,
    key_block: int = KEY_BLOCK,
    causal: bool = True,
) -> Cascade:
    """One attention block as a cascade.

    ``phase="prefill"``: ``I = T = seq_len`` positions from an empty cache (causal mask).
    ``phase="decode"``: one new position after ``seq_len`` cached ones (``I = 1``,
    ``T = seq_len + 1``, ``M = seq_len``), reading the cache as state. ``cache_out`` writes the
    new positions' keys and values (``KNA``, ``KNB``, ``VN``); a decode step always writes them.
    ``softmax`` is ``three-pass``, ``online`` or ``blocked``, the last over blocks of
    ``key_block`` keys (default :data:`KEY_BLOCK`, FlashAttention-2's 64; see the module
    docstring); the other forms ignore ``key_block``. ``causal=False`` (a prefill whose every
    query sees every key, as a non-causal attention kernel runs) drops the causal mask: the
    scores take no mask term, but for the blocked form's padded keys (``KM`` then masks only
    those, and is left out when ``key_block`` divides ``T``). A decode step sees every key
    either way.
    """
    check_softmax(softmax)
    check_layer_args(phase, batch=batch, seq_len=seq_len, bits=bits)
    if not isinstance(causal, bool):
        raise SpecError(f"causal must be True or False, not {causal!r}")
    c = config
    decode = phase == "decode"
    if decode and not cache_out:
        raise SpecError("a decode step appends its key and value to the cache; cache_out cannot be False")
    positions = 1 if decode else seq_len
    keys = seq_len + 1 if decode else seq_len
    n_pass = c.head_channels - c.rotary_dim
    ranks = [
        Rank("B", batch, "batch"),
        Rank("I", positions, "L" if not decode else "1"),
        Rank("T", keys, "L" if not decode else "L+1"),
        Rank("D", c.d_model, "hidden_size"),
        Rank("G", c.n_kv_heads, "n_kv_heads"),
        Rank("R", c.heads_per_kv, "n_heads/n_kv_heads"),
        Rank("E", c.head_channels, "head_dim"),
    ]
    if c.rotary_dim:
        ranks += [Rank("U", 2, "2"), Rank("W", c.rotary_dim // 2, "rotary_dim/2")]
    if n_pass:
        ranks.append(Rank("P", n_pass, "head_dim-rotary_dim"))
    if decode:
        ranks.append(Rank("M", seq_len, "L"))
    blocked = softmax == "blocked"
    if blocked:
        ranks = [r for r in ranks if r.name != "T"] + key_block_ranks(keys, key_block, decode=decode)
    params: dict[str, float] = {
        "batch": batch,
        "L": seq_len,
        "hidden_size": c.d_model,
        "n_heads": c.n_heads,
        "n_kv_heads": c.n_kv_heads,
        "head_dim": c.head_channels,
        "rotary_dim": c.rotary_dim,
        "eps": c.norm_eps,
        "scale": c.head_channels ** -0.5,
    }
    t_index = "t-(T-1)" if decode else "t"
    lines = list(NORM)
    score_terms = []
    if c.rotary_dim:
        lines += ROTARY
        score_terms.append("QR[b,i,g,r,u,w]*KR[b,{k},g,u,w]*scale")
    if n_pass:
        lines += PASS
        score_terms.append("QB[b,i,g,r,p]*KB[b,{k},g,p]*scale")
    lines.append(VALUE)
    masked = causal and not decode
    if not causal:
        params["causal"] = 0
    if blocked:
        params["key_block"] = key_block
        mask = "KM" if masked or keys % key_block else None
        lines += blocked_softmax_lines(score_terms, decode=decode, mask=mask)
    else:
        score_terms = [term.replace("{k}", t_index) for term in score_terms] + (["CM[i,t]"] if masked else [])
        lines.append("SC[b,i,t,g,r] = " + " + ".join(score_terms))
        lines += [line.replace("{t}", t_index) for line in (ONLINE if softmax == "online" else THREE_PASS)]
    lines += OUTPUT

    sizes = {r.name: r.size for r in ranks}
    einsums = [parse_einsum(line, sizes=sizes) for line in lines]
    used = {e.name for e in einsums} | {t for e in einsums for t in e.input_tensors}
    specs = {**_TENSORS, **blocked_tensors()} if blocked else _TENSORS
    tensors: dict[str, TensorSpec] = {
        t: TensorSpec(t, rk, role, bits, description=desc) for t, (rk, role, desc) in specs.items() if t in used
    }
    tensors = with_masks(tensors, {"CM": causal_band("I", "T"), "KM": key_blocks(
        first=seq_len if decode else 0, keys=None if causal or decode else keys)})
    for src, (cache, new) in _CACHED.items():
        if src not in tensors:
            continue
        out_ranks = tensors[src].ranks
        tensors.update(kv_cache_tensors(tensors[src], cache, new if cache_out else None, decode=decode))
        if cache_out:
            idx = ",".join(r.lower() for r in out_ranks)
            einsums.append(parse_einsum(f"{new}[{idx}] = {src}[{idx}]", sizes=sizes))
    return build_cascade(
        name=name or f"attention-{phase}" + ("" if softmax == "three-pass" else f"-{softmax}"),
        params=params,
        ranks=ranks,
        tensors=list(tensors.values()),
        einsums=einsums,
        description=(
            f"attention block, {phase}, {softmax} softmax" + ("" if masked or decode else " (non-causal)")
            + (f" ({key_block}-key blocks)" if blocked else "") + f", hidden {c.d_model}, {c.n_heads} heads "
            f"({c.n_kv_heads} kv), head_dim {c.head_channels} (rotary {c.rotary_dim}), batch={batch}, "
            + (f"1 position after {seq_len} cached" if decode else f"{seq_len} positions")
        ),
        regions={"attention": ATTENTION_REGION[softmax]},
    )


def rotary_tables(config: AttentionConfig, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``COS[i,w]`` and the signed ``SIN[u,i,w]`` at absolute ``positions`` (float64), with
    transformers' default rotary frequencies ``theta^(-2w/rotary_dim)``."""
    half = config.rotary_dim // 2
    inv_freq = 1.0 / config.rope_theta ** (np.arange(half, dtype=np.float64) * 2 / config.rotary_dim)
    angles = np.outer(np.asarray(positions, dtype=np.float64), inv_freq)
    sin = np.sin(angles)
    return np.cos(angles), np.stack([-sin, sin])


def kv_cache_tensors(spec: TensorSpec, cache: str, new: str | None, *, decode: bool) -> dict[str, TensorSpec]:
    """The tensors a key or value ``spec`` (written at the layer's positions ``I``) needs with a
    KV cache: in decode, the cache read ``cache`` (over the cached positions ``M``) and ``spec``
    again with that cache as its initial value; with ``new``, the rows appended to the cache.
    Every layer that runs attention (here, and Falcon-H1's, OLMo-Hybrid's and Zamba2's blocks)
    declares its cache this way."""
    out: dict[str, TensorSpec] = {}
    if decode:
        out[cache] = TensorSpec(cache, tuple("M" if r == "I" else r for r in spec.ranks), _ST, spec.bits,
                                description=f"cached {spec.description}s")
        out[spec.name] = TensorSpec(spec.name, spec.ranks, _X, spec.bits, initial=cache, description=spec.description)
    if new is not None:
        out[new] = TensorSpec(new, spec.ranks, _ST, spec.bits, description=f"{spec.description}, appended to the cache")
    return out


def attention_constants(cascade: Cascade, config: "AttentionConfig | Any", *, start: int | None = None) -> dict[str, np.ndarray]:
    """The constant inputs of an attention cascade: the rotary tables at the block's absolute
    positions and, in prefill, the causal mask ``CM[i,t]`` (0 where ``t <= i``, ``-inf`` above);
    the blocked softmax's key mask ``KM[i,tb,tq]`` in both phases (:func:`key_block_mask`).

    ``config`` is the block's :class:`AttentionConfig` or a model config that has one (a
    :class:`~mambalaya.workloads.families.bamba.HybridConfig`: its ``attention()``). The positions are
    the cascade's own: a prefill runs from an empty cache, at positions ``0 .. L-1``; a decode
    step's one position is the cache length ``M``. ``start``, if given, must say the same: a
    rotary table at other positions would rotate the queries and the new key by the wrong
    angles, and every score with them."""
    if not isinstance(config, AttentionConfig):
        make = getattr(config, "attention", None)
        if not callable(make):
            raise SpecError(f"attention_constants takes an AttentionConfig or a model config with attention layers, "
                            f"not a {type(config).__name__}")
        config = make()
    if "T" not in cascade.ranks and "TB" not in cascade.ranks:
        raise SpecError(f"cascade {cascade.name} has no key rank T (or TB): it is not an attention block")
    decode = "M" in cascade.ranks
    first = cascade.size("M") if decode else 0
    if start is not None and start != first:
        where = (f"a decode step after {first} cached positions is at position {first}" if decode else
                 "a prefill runs from an empty cache, at positions 0 .. L-1")
        raise SpecError(f"start={start} does not fit cascade {cascade.name}: {where}; leave start out")
    out: dict[str, np.ndarray] = {}
    positions = np.arange(cascade.size("I")) + first
    if "COS" in cascade.tensors:
        out["COS"], out["SIN"] = rotary_tables(config, positions)
    if "CM" in cascade.tensors and cascade.tensors["CM"].ranks == ("I", "T"):
        out["CM"] = causal_mask(*cascade.shape("CM"))
    if "KM" in cascade.tensors and cascade.tensors["KM"].ranks == ("I", "TB", "TQ"):
        keys = cascade.size("M") + 1 if decode else cascade.size("I")
        out["KM"] = key_block_mask(*cascade.shape("KM"), first=first,
                                   keys=None if cascade.params.get("causal", 1) else keys)
    return out


def weights_from_projections(config: AttentionConfig, *, norm: np.ndarray, q_proj: np.ndarray, k_proj: np.ndarray,
                             v_proj: np.ndarray, o_proj: np.ndarray) -> dict[str, np.ndarray]:
    """The block's weights in mambalaya's layouts from transformers' (``nn.Linear`` weights are
    ``[out, in]``): query head ``h = g*R + r`` of ``q_proj`` rows ``h*E ... h*E+E-1``, channel
    ``u*W + w`` rotated, ``rotary_dim + p`` passed through."""
    c = config
    g, r, e, d, rd = c.n_kv_heads, c.heads_per_kv, c.head_channels, c.d_model, c.rotary_dim
    expected = {"norm": (d,), "q_proj": (c.n_heads * e, d), "k_proj": (g * e, d), "v_proj": (g * e, d),
                "o_proj": (d, c.n_heads * e)}
    given = {"norm": norm, "q_proj": q_proj, "k_proj": k_proj, "v_proj": v_proj, "o_proj": o_proj}
    for key, shape in expected.items():
        if tuple(np.shape(given[key])) != shape:
            raise SpecError(f"attention weight {key} has shape {tuple(np.shape(given[key]))}, expected {shape}")
    q = np.asarray(q_proj).reshape(g, r, e, d)
    k = np.asarray(k_proj).reshape(g, e, d)
    out = {
        "WN": np.asarray(norm),
        "WV": np.asarray(v_proj).reshape(g, e, d).transpose(2, 0, 1),
        "WO": np.asarray(o_proj).reshape(d, g, r, e).transpose(1, 2, 3, 0),
    }
    if rd:
        out["WQA"] = q[:, :, :rd].reshape(g, r, 2, rd // 2, d).transpose(4, 0, 1, 2, 3)
        out["WKA"] = k[:, :rd].reshape(g, 2, rd // 2, d).transpose(3, 0, 1, 2)
    if e > rd:
        out["WQB"] = q[:, :, rd:].transpose(3, 0, 1, 2)
        out["WKB"] = k[:, rd:].transpose(2, 0, 1)
    return {t: np.ascontiguousarray(a) for t, a in out.items()}


def cache_from_hf(config: AttentionConfig, key: np.ndarray, value: np.ndarray) -> dict[str, np.ndarray]:
    """``KC0A``, ``KC0B``, ``VC0`` from transformers' cache layout ``[B, G, L, E]`` (keys after
    the rotary embedding)."""
    rd = config.rotary_dim
    key, value = np.asarray(key), np.asarray(value)
    b, g, m, e = key.shape
    out = {"VC0": value.transpose(0, 2, 1, 3)}
    if rd:
        out["KC0A"] = key[..., :rd].reshape(b, g, m, 2, rd // 2).transpose(0, 2, 1, 3, 4)
    if e > rd:
        out["KC0B"] = key[..., rd:].transpose(0, 2, 1, 3)
    return {t: np.ascontiguousarray(a) for t, a in out.items()}


def append_kv(cascade: Cascade, cache: dict[str, np.ndarray] | None, results: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The cache after a run: ``cache`` (``KC0A``, ``KC0B``, ``VC0``; None for an empty one)
    with the run's appended positions (``KNA``, ``KNB``, ``VN``) concatenated along the
    position axis (axis 1)."""
    out: dict[str, np.ndarray] = {}
    for src, (old, new) in _CACHED.items():
        if new not in cascade.tensors:
            continue
        if new not in results:
            raise SpecError(f"the results have no {new}, the appended part of cache {old}")
        fresh = np.asarray(results[new])
        out[old] = fresh if cache is None or old not in cache else np.concatenate([cache[old], fresh], axis=1)
    return out


__all__ = [
    "ATTENTION_REGION",
    "AttentionConfig",
    "CACHE_IN",
    "CACHE_OUT",
    "KEY_BLOCK",
    "SOFTMAX_FORMS",
    "WEIGHTS",
    "append_kv",
    "attention_constants",
    "attention_layer",
    "blocked_softmax_lines",
    "blocked_tensors",
    "check_softmax",
    "key_block_ranks",
    "key_index",
    "cache_from_hf",
    "parse_attention_config",
    "rotary_tables",
    "weights_from_projections",
]
