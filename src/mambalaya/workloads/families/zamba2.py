"""Zamba2 (transformers' ``Zamba2Config``): a Mamba-2 backbone with shared transformer blocks.

Every layer of Zamba2 is a Mamba-2 decoder layer; the layers ``layers_block_type`` marks
``hybrid`` (``hybrid_layer_ids``) first run a **shared transformer block** (``Zamba2HybridLayer``):

``t = mlp(pre_ff_norm(attn(input_norm([x, e]))))``, ``s = linear(t)``,
``y = x + mamba(norm(x + s))``

with ``e`` the **original embeddings** (the model's ``inputs_embeds``, the same at every depth)
concatenated to the hidden state ``x`` (so the block's attention reads ``2*hidden_size``
channels and ``input_norm`` normalises all of them), **no residual** inside the shared block,
its output projected by the layer's own ``linear`` (hidden x hidden, no bias) and added to the
Mamba layer's *normed input* only: the residual ``x`` skips it. A ``mamba`` layer is
``y = x + mamba(norm(x))``.

**Shared blocks and LoRA.** There are ``num_mem_blocks`` shared blocks; the ``j``-th hybrid
layer (in depth order) uses block ``j mod num_mem_blocks``, one weight set read at several
depths. Each use has its own adapters (LoRA without scaling, ``x A_j B_j``, rank
``adapter_rank``): on the MLP's ``gate_up_proj`` always, on ``q_proj``, ``k_proj``, ``v_proj``
when ``use_shared_attention_adapter``. So a hybrid layer's cascade reads the shared weights,
the use's adapters and the layer's own ``linear`` and Mamba weights: the shared weights'
traffic is counted once per use (each use is its own layer evaluation), and the model's
parameter count holds each shared block once (:meth:`Zamba2Model.extra_parameters`).

**Attention.** ``num_attention_heads`` heads of ``head_dim = 2*hidden_size/heads`` (the
concatenated width over the heads), ``num_key_value_heads`` KV heads, scaled by
``(head_dim/2)^-1/2`` (not ``head_dim^-1/2``); the rotary embedding over the whole head only with
``use_mem_rope``. The MLP is ``down(gelu(gate) * up)`` with the exact (erf) GELU.

**Mamba-2.** The mixer of :mod:`~mambalaya.workloads.blocks.mamba2` (conv with bias, the gated RMSNorm
after the gate, over each group's channels, with its own eps 1e-5 whatever ``rms_norm_eps``
is). transformers clamps the step ``softplus(dt + dt_bias)`` from below at ``time_step_min``
in the chunked scan, the path every prefill takes, but not in its single-step update, the
path of every decode step; the cascades do the same (``DELTA = max(softplus(DT), dtmin)`` in
prefill, both scan forms, and no clamp in decode).

Cascade names: the shared block's tensors are ``A*`` (attention, as Falcon-H1's: ranks ``Y``
KV heads, ``V`` query heads per KV head, ``U`` x ``W`` the rotated halves of a head, ``E`` its
value channels, ``T`` keys, ``M`` cached positions), ``F*`` (its MLP), the adapter rank ``Z``,
the embeddings ``EMB``, ``TL`` the projected block output and ``XT = X + TL``. The KV cache is
``KC0A``/``VC0`` (appended ``KNA``/``VN``), the conv and SSM states the Mamba-2 block's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, Field, PositiveInt, model_validator

from mambalaya.einsum.cascade import Cascade, build_cascade
from mambalaya.einsum.ir import Rank, Role, TensorSpec
from mambalaya.einsum.parse import parse_einsum
from mambalaya.errors import SpecError
from mambalaya.specio import list_as_tuple
from mambalaya.workloads.blocks.attention import KEY_BLOCK, AttentionConfig, check_softmax, kv_cache_tensors
from mambalaya.workloads.families.falcon_h1 import (ATTENTION_BLOCKED_TENSORS, attention_masks, ATTENTION_REGIONS, ATTENTION_TENSORS,
                                                    attention_ranks, attention_softmax_lines)
from mambalaya.workloads.families.base import FamilyModel
from mambalaya.workloads.blocks.masks import with_masks
from mambalaya.workloads.hf.config import check_known_fields, ConfigFile, default_rope_theta, shown
from mambalaya.workloads.blocks.mamba2 import Mamba2Config, mamba2_layer
from mambalaya.workloads.checks import chunk_padding_free_form

_W, _X, _IN, _ST = Role.WEIGHT, Role.INTERMEDIATE, Role.INPUT, Role.STATE
#: The eps of the Mamba-2 mixer's gated RMSNorm (Zamba2MambaMixer builds it with 1e-5).
GATED_NORM_EPS = 1e-5

_SHARED_TENSORS: dict[str, tuple[tuple[str, ...], Role, str]] = {
    "EMB": (("B", "I", "D"), _IN, "original embeddings (the model's inputs_embeds)"),
    "ASS": (("B", "I"), _X, "sum of squares of [x, e]"), "ARS": (("B", "I"), _X, "reciprocal RMS of [x, e]"),
    "WAN": (("D",), _W, "shared input_layernorm weight, x half"), "WAE": (("D",), _W, "shared input_layernorm, e half"),
    "AXN": (("B", "I", "D"), _X, "normed x half"), "AEN": (("B", "I", "D"), _X, "normed e half"),
    "WAQE": (("D", "Y", "V", "U", "W"), _W, "shared q_proj, e half"),
    "WAKE": (("D", "Y", "U", "W"), _W, "shared k_proj, e half"), "WAVE": (("D", "Y", "E"), _W, "shared v_proj, e half"),
    "ALQ": (("B", "I", "Z"), _X, "q adapter down"), "ALK": (("B", "I", "Z"), _X, "k adapter down"),
    "ALV": (("B", "I", "Z"), _X, "v adapter down"),
    "WLQX": (("D", "Z"), _W, "q adapter down (this use), x half"), "WLQE": (("D", "Z"), _W, "q adapter down, e half"),
    "WLKX": (("D", "Z"), _W, "k adapter down (this use), x half"), "WLKE": (("D", "Z"), _W, "k adapter down, e half"),
    "WLVX": (("D", "Z"), _W, "v adapter down (this use), x half"), "WLVE": (("D", "Z"), _W, "v adapter down, e half"),
    "WLQU": (("Z", "Y", "V", "U", "W"), _W, "q adapter up (this use)"),
    "WLKU": (("Z", "Y", "U", "W"), _W, "k adapter up (this use)"), "WLVU": (("Z", "Y", "E"), _W, "v adapter up"),
    "FSS": (("B", "I"), _X, "sum of squares of the attention output"), "FRS": (("B", "I"), _X, "reciprocal RMS"),
    "WFN": (("D",), _W, "shared pre_ff_layernorm weight"), "FXN": (("B", "I", "D"), _X, "normed attention output"),
    "FLA": (("B", "I", "Z"), _X, "gate_up adapter down"), "WLM": (("D", "Z"), _W, "gate_up adapter down (this use)"),
    "WLG": (("Z", "F"), _W, "gate_up adapter up, gate half (this use)"),
    "WLU": (("Z", "F"), _W, "gate_up adapter up, up half (this use)"),
    "WFG": (("D", "F"), _W, "shared gate_up_proj, gate half"), "WFU": (("D", "F"), _W, "shared gate_up_proj, up half"),
    "FG": (("B", "I", "F"), _X, "gate"), "FU": (("B", "I", "F"), _X, "up"), "FA": (("B", "I", "F"), _X, "gelu(gate)"),
    "FH": (("B", "I", "F"), _X, "gelu(gate) * up"), "WFD": (("F", "H"), _W, "shared down_proj"),
    "FO": (("B", "I", "H"), _X, "shared block output"), "WTL": (("H", "D"), _W, "the layer's linear"),
    "TL": (("B", "I", "D"), _X, "projected shared block output"), "XT": (("B", "I", "D"), _X, "x + linear(block)"),
}


class Zamba2Model(FamilyModel):
    """A Zamba2 model: transformers' ``Zamba2Config`` fields under mambalaya's names; layer types
    ``mamba`` and ``hybrid`` (a shared transformer block, then the Mamba-2 layer)."""

    LAYER_TYPES: ClassVar[tuple[str, ...]] = ("mamba", "hybrid")
    SCANNED: ClassVar[tuple[str, ...]] = ("mamba", "hybrid")

    family: Literal["zamba2"] = "zamba2"
    layer_types: Annotated[tuple[Literal["mamba", "hybrid"], ...],
                           BeforeValidator(list_as_tuple)] = Field(min_length=1)
    tie_embeddings: bool = True
    d_ff: PositiveInt
    n_heads: PositiveInt
    n_kv_heads: PositiveInt
    #: The attention's head width when config.json gives it (``attention_head_dim``, alias
    #: ``head_dim``: transformers 5.25 sets the file's value after computing its own, and the
    #: attention reads it); None: ``2*d_model/n_heads``, as Zamba2Config computes it.
    attention_head_dim: PositiveInt | None = None
    num_mem_blocks: PositiveInt = 1
    attention_adapter: bool = False
    adapter_rank: PositiveInt = 128
    mem_rope: bool = False
    rope_theta: float = Field(10000.0, gt=0)
    mamba_heads: PositiveInt
    mamba_expand: PositiveInt = 2
    mamba_d_state: PositiveInt = 64
    mamba_ngroups: PositiveInt = 1
    mamba_d_conv: PositiveInt = 4
    mamba_chunk_size: PositiveInt = 256
    time_step_min: float = Field(0.001, ge=0)
    norm_eps: float = Field(1e-5, gt=0)

    @model_validator(mode="after")
    def _blocks_fit(self) -> "Zamba2Model":
        if self.attention_head_dim is None and (2 * self.d_model) % self.n_heads:
            raise ValueError(f"n_heads = {self.n_heads} does not divide 2*d_model = {2 * self.d_model} (the shared "
                             "attention reads the concatenation of the hidden state and the embeddings)")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads = {self.n_kv_heads} does not divide n_heads = {self.n_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim = 2*d_model/n_heads = {self.head_dim} is odd; the cascade splits a head into "
                             "two halves (the rotary embedding's)")
        if self.attention_adapter and (self.n_kv_heads != self.n_heads or self.n_heads * self.head_dim != 2 * self.d_model):
            raise ValueError("with the attention adapters, n_kv_heads must equal n_heads and n_heads*head_dim "
                             f"2*d_model ({self.n_kv_heads}, {self.n_heads} and {self.n_heads}*{self.head_dim} vs "
                             f"{2 * self.d_model}): transformers' q, k and v adapters write 2*d_model channels")
        if (self.mamba_expand * self.d_model) % self.mamba_heads:
            raise ValueError(f"mamba_heads = {self.mamba_heads} does not divide mamba_expand*d_model = "
                             f"{self.mamba_expand * self.d_model}")
        self.mamba2()
        return self

    @property
    def head_dim(self) -> int:
        return self.attention_head_dim if self.attention_head_dim is not None else 2 * self.d_model // self.n_heads

    @property
    def d_state(self) -> int:
        return self.mamba_d_state

    @property
    def expand(self) -> int:
        return self.mamba_expand

    @property
    def d_conv(self) -> int:
        return self.mamba_d_conv

    @property
    def hybrid_layer_ids(self) -> tuple[int, ...]:
        return tuple(k for k, t in enumerate(self.layer_types) if t == "hybrid")

    @property
    def shared_block_count(self) -> int:
        """The shared blocks' weight sets: transformers builds ``min(num_mem_blocks, hybrid
        layers)`` blocks and ties each block's uses together (``Zamba2Model._tied_weights_keys``),
        but ties nothing when ``tie_word_embeddings`` is false (5.25's
        ``PreTrainedModel.get_expanded_tied_weights_keys`` returns no ties then), so each hybrid
        layer then holds its own copy (once counted as shared: 20,872 parameters for 31,976)."""
        hybrids = len(self.hybrid_layer_ids)
        return min(self.num_mem_blocks, hybrids) if self.tie_embeddings else hybrids

    def shared_block_of(self, layer: int) -> tuple[int, int]:
        """(shared block, use) of hybrid layer ``layer``: its use ``j`` is its rank among the hybrid
        layers, its block ``j mod num_mem_blocks`` (``j``: its own copy, untied,
        :attr:`shared_block_count`)."""
        j = self.hybrid_layer_ids.index(layer)
        return (j % self.num_mem_blocks if self.tie_embeddings else j), j

    def mamba2(self) -> Mamba2Config:
        return Mamba2Config(d_model=self.d_model, n_layers=self.n_layers, d_state=self.mamba_d_state,
                            headdim=self.mamba_expand * self.d_model // self.mamba_heads, ngroups=self.mamba_ngroups,
                            expand=self.mamba_expand, d_conv=self.mamba_d_conv, chunk_size=self.mamba_chunk_size,
                            vocab_size=self.vocab_size, norm_eps=self.norm_eps, tie_embeddings=self.tie_embeddings)

    def attention_config(self) -> AttentionConfig:
        """The shared attention over the ``2*d_model`` concatenated channels: its rotary tables
        (read only with ``mem_rope``) and its KV cache's layout (a head as two halves ``U x W``,
        rotated or not)."""
        return AttentionConfig(d_model=2 * self.d_model, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads,
                               head_dim=self.head_dim, rope_theta=self.rope_theta, partial_rotary_factor=1.0,
                               norm_eps=self.norm_eps)

    def shared_block_parameters(self) -> int:
        """One shared block without its adapters: input_layernorm (2d), q/k/v/o, pre_ff_layernorm,
        gate_up_proj and down_proj."""
        d, f, hd = self.d_model, self.d_ff, self.head_dim
        qkv = 2 * d * hd * (self.n_heads + 2 * self.n_kv_heads)
        return 2 * d + qkv + self.n_heads * hd * d + d + 2 * d * f + f * d

    def adapter_parameters(self) -> int:
        """The adapters of one use: gate_up (d x r, r x 2f) and, with attention adapters, q/k/v
        (2d x r, r x 2d each)."""
        d, f, r = self.d_model, self.d_ff, self.adapter_rank
        return r * (d + 2 * f) + (3 * r * (2 * d + 2 * d) if self.attention_adapter else 0)

    def layer_parameters(self, layer_type: str) -> int:
        """A layer's own weights: the Mamba-2 layer, and for a hybrid layer its linear and its
        use's adapters (the shared blocks are :meth:`extra_parameters`)."""
        mamba = self.mamba2().layer_parameters()
        if layer_type == "mamba":
            return mamba
        return mamba + self.d_model * self.d_model + self.adapter_parameters()

    def extra_parameters(self) -> int:
        """The shared blocks' weights beyond each hybrid layer's own use's adapters
        (:meth:`layer_parameters`). Tied, each block once (:attr:`shared_block_count`). Untied,
        each hybrid layer's copy of its block (``j mod num_mem_blocks``) whole: the block and the
        adapter slots of every use of that block (transformers gives a block the slots ``i`` with
        ``i mod num_mem_blocks`` its id), of which the layer reads one."""
        if self.tie_embeddings:
            return self.shared_block_count * self.shared_block_parameters()
        hybrids, blocks = len(self.hybrid_layer_ids), self.num_mem_blocks
        uses = [len(range(b, hybrids, blocks)) for b in range(blocks)]
        return sum(self.shared_block_parameters() + (uses[j % blocks] - 1) * self.adapter_parameters()
                   for j in range(hybrids))

    def shared_parameters(self, layer_types: set[str]) -> int:
        """A device running hybrid layers holds the shared blocks (all of them: an assumption, a
        device whose hybrid layers use one block would need only that one)."""
        return self.extra_parameters() if "hybrid" in layer_types else 0

    def shape_text(self) -> str:
        blocks = f"{self.shared_block_count} shared blocks" if self.tie_embeddings else \
            f"{self.shared_block_count} untied copies of the shared blocks"
        return (f"{super().shape_text()}; {blocks} "
                f"(attention heads={self.n_heads} kv={self.n_kv_heads} head_dim={self.head_dim}"
                f"{', rotary' if self.mem_rope else ''}; gelu mlp={self.d_ff}; LoRA rank {self.adapter_rank} on "
                f"{'q/k/v and ' if self.attention_adapter else ''}gate_up); mamba heads={self.mamba_heads} "
                f"groups={self.mamba_ngroups} d_state={self.mamba_d_state}")

    def layer(self, layer_type: str, *, batch: int, seq_len: int, phase: str = "prefill", bits: int = 16,
              scan: str | None = None, softmax: str = "three-pass", name: str | None = None,
              key_block: int = KEY_BLOCK) -> Cascade:
        if layer_type not in self.LAYER_TYPES:
            raise SpecError(f"layer type {layer_type!r} is not one of Zamba2's ({', '.join(self.LAYER_TYPES)})")
        return zamba2_layer(self, layer_type, batch=batch, seq_len=seq_len, phase=phase, bits=bits, scan=scan,
                            softmax=softmax, name=name, key_block=key_block)


def _mixer_lines(hybrid: bool, decode: bool, chunked: bool) -> dict[str, str]:
    """The Mamba-2 Einsums Zamba2 writes differently, by output tensor: the norm reads ``XT`` in
    a hybrid layer, the step is clamped in prefill, the gated norm has its own eps."""
    src, o = "XT" if hybrid else "X", "c,q" if chunked else "i"
    lines = {"SS": f"SS[b,i] = {src}[b,i,d]*{src}[b,i,d]", "XN": f"XN[b,i,d] = {src}[b,i,d]*RS[b,i]*WN[d]",
             "RG": f"RG[b,{o},g] = rsqrt(SG[b,{o},g]/(R*P) + geps)"}
    if not decode:
        lines["DELTA"] = "DELTA[b,i,g,r] = max(softplus(DT[b,i,g,r]), dtmin)"
    return lines


def _shared_block_lines(c: Zamba2Model, decode: bool, softmax: str) -> list[str]:
    lines = ["ASS[b,i] = X[b,i,d]*X[b,i,d] + EMB[b,i,d]*EMB[b,i,d]", "ARS[b,i] = rsqrt(ASS[b,i]/(2*D) + eps)",
             "AXN[b,i,d] = X[b,i,d]*ARS[b,i]*WAN[d]", "AEN[b,i,d] = EMB[b,i,d]*ARS[b,i]*WAE[d]"]
    out = {"Q": "AQ[b,i,y,v,u,w]", "K": "AK[b,i,y,u,w]", "V": "AV[b,i,y,e]"}
    idx = {"Q": "y,v,u,w", "K": "y,u,w", "V": "y,e"}
    for p in "QKV":
        rhs = f"AXN[b,i,d]*WA{p}[d,{idx[p]}] + AEN[b,i,d]*WA{p}E[d,{idx[p]}]"
        if c.attention_adapter:
            lines.append(f"AL{p}[b,i,z] = AXN[b,i,d]*WL{p}X[d,z] + AEN[b,i,d]*WL{p}E[d,z]")
            rhs += f" + AL{p}[b,i,z]*WL{p}U[z,{idx[p]}]"
        lines.append(f"{out[p]} = {rhs}")
    q, k = ("AQR", "AKR") if c.mem_rope else ("AQ", "AK")
    if c.mem_rope:
        lines += ["AQR[b,i,y,v,u,w] = AQ[b,i,y,v,u,w]*COS[i,w] + AQ[b,i,y,v,1-u,w]*SIN[u,i,w]",
                  "AKR[b,i,y,u,w] = AK[b,i,y,u,w]*COS[i,w] + AK[b,i,y,1-u,w]*SIN[u,i,w]"]
    lines += attention_softmax_lines(softmax, f"{q}[b,i,y,v,u,w]*{k}[b,{{t}},y,u,w]*ascale", decode=decode)
    lines += ["AOUT[b,i,d] = AAO[b,i,y,v,e]*WAO[y,v,e,d]",
              "FSS[b,i] = AOUT[b,i,d]*AOUT[b,i,d]", "FRS[b,i] = rsqrt(FSS[b,i]/D + eps)",
              "FXN[b,i,d] = AOUT[b,i,d]*FRS[b,i]*WFN[d]", "FLA[b,i,z] = FXN[b,i,d]*WLM[d,z]",
              "FG[b,i,f] = FXN[b,i,d]*WFG[d,f] + FLA[b,i,z]*WLG[z,f]",
              "FU[b,i,f] = FXN[b,i,d]*WFU[d,f] + FLA[b,i,z]*WLU[z,f]",
              "FA[b,i,f] = gelu(FG[b,i,f])", "FH[b,i,f] = FA[b,i,f]*FU[b,i,f]", "FO[b,i,h] = FH[b,i,f]*WFD[f,h]",
              "TL[b,i,d] = FO[b,i,h]*WTL[h,d]", "XT[b,i,d] = X[b,i,d] + TL[b,i,d]",
              f"KNA[b,i,y,u,w] = {k}[b,i,y,u,w]", "VN[b,i,y,e] = AV[b,i,y,e]"]
    return lines


def zamba2_layer(config: Zamba2Model, layer_type: str, *, batch: int, seq_len: int, phase: str = "prefill",
                 bits: int = 16, scan: str | None = None, softmax: str = "three-pass",
                 name: str | None = None, key_block: int = KEY_BLOCK) -> Cascade:
    """One Zamba2 layer (``mamba`` or ``hybrid``) as one cascade (see the module docstring); a
    hybrid layer's attention takes ``softmax`` (``blocked``: over blocks of ``key_block`` keys)."""
    check_softmax(softmax)
    c, decode, hybrid = config, phase == "decode", layer_type == "hybrid"
    form = chunk_padding_free_form(scan, phase, seq_len, c.mamba_chunk_size, "the gate, norm, output projection "
                                   "and residual (and a hybrid layer's shared block) would then count the padded "
                                   "rows too")
    mixer = mamba2_layer(c.mamba2(), batch=batch, seq_len=seq_len, phase=phase, bits=bits,  # type: ignore[arg-type]
                         state_io=True, scan=form)  # type: ignore[arg-type]
    ranks = list(mixer.ranks.values())
    params = {**mixer.params, "geps": GATED_NORM_EPS, "dtmin": c.time_step_min}
    if hybrid:
        ranks += attention_ranks(seq_len, softmax, key_block, decode=decode) + [
                  Rank("Y", c.n_kv_heads, "n_kv_heads"), Rank("V", c.n_heads // c.n_kv_heads, "n_heads/n_kv_heads"),
                  Rank("U", 2, "2"), Rank("W", c.head_dim // 2, "head_dim/2"), Rank("E", c.head_dim, "head_dim"),
                  Rank("F", c.d_ff, "intermediate_size"), Rank("H", c.d_model, "hidden_size"),
                  Rank("Z", c.adapter_rank, "adapter_rank")]
        if decode:
            ranks.append(Rank("M", seq_len, "L"))
        params.update({"ascale": (c.head_dim / 2) ** -0.5, "n_heads": c.n_heads, "n_kv_heads": c.n_kv_heads,
                       "head_dim": c.head_dim, "adapter_rank": c.adapter_rank, "intermediate_size": c.d_ff})
    sizes = {r.name: r.size for r in ranks}
    replaced = {k: parse_einsum(v, sizes=sizes) for k, v in _mixer_lines(hybrid, decode, "Q" in sizes).items()}
    mixer_einsums = [replaced.get(e.name, e) for e in mixer.einsums]
    tensors = dict(mixer.tensors)
    einsums = mixer_einsums
    if hybrid:
        shared = [parse_einsum(line, sizes=sizes) for line in _shared_block_lines(c, decode, softmax)]
        einsums = shared + mixer_einsums
        used = {e.name for e in shared} | {x for e in shared for x in e.input_tensors}
        specs = {**ATTENTION_TENSORS, **(ATTENTION_BLOCKED_TENSORS if softmax == "blocked" else {}), **_SHARED_TENSORS}
        new = {n: TensorSpec(n, rk, role, bits, description=d) for n, (rk, role, d) in specs.items() if n in used}
        new = with_masks(new, attention_masks(seq_len, decode=decode))
        new["WAQ"] = replace(new["WAQ"], description="shared q_proj, x half")
        new["WAK"] = replace(new["WAK"], description="shared k_proj, x half")
        new["WAV"] = replace(new["WAV"], description="shared v_proj, x half")
        new["WAO"] = replace(new["WAO"], description="shared o_proj")
        key = "AKR" if c.mem_rope else "AK"
        for src, cache, out in ((key, "KC0A", "KNA"), ("AV", "VC0", "VN")):
            new.update(kv_cache_tensors(new[src], cache, out, decode=decode))
        tensors = {**new, **tensors}
    what = ("shared transformer block (attention over [x, embeddings], gelu MLP, LoRA) then Mamba-2 layer" if hybrid
            else "Mamba-2 layer")
    return build_cascade(
        name=name or f"zamba2-{layer_type}-{phase}", params=params, ranks=ranks, tensors=list(tensors.values()),
        einsums=einsums,
        description=(f"Zamba2 {layer_type} layer, {phase}, {form} scan{f' after {softmax} attention' if hybrid else ''}"
                     f"; {what}; {mixer.description}"),
        regions={**mixer.regions, **({"attention": ATTENTION_REGIONS[softmax]} if hybrid else {})})


# --------------------------------------------------------------------------------------------
# config.json
# --------------------------------------------------------------------------------------------

#: Zamba2Config's defaults (transformers 5.25) for the fields read.
DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000, "hidden_size": 2560, "num_hidden_layers": 54, "mamba_d_state": 64, "mamba_d_conv": 4,
    "mamba_expand": 2, "mamba_ngroups": 1, "time_step_min": 0.001, "n_mamba_heads": 8, "chunk_size": 256,
    "intermediate_size": None, "num_attention_heads": 32, "num_key_value_heads": None, "num_mem_blocks": 1,
    "use_shared_attention_adapter": False, "adapter_rank": 128, "use_mem_rope": False, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
}
MODELLED = {"use_conv_bias": (True, "the Mamba-2 conv has a bias"),
            "add_bias_linear": (False, "the projections have no bias"),
            "hidden_act": ("gelu", "the shared MLP's exact GELU")}
INERT = {"model_type", "architectures", "transformers_version", "torch_dtype", "dtype", "use_cache",
         "num_logits_to_keep", "pad_token_id", "bos_token_id", "eos_token_id", "max_position_embeddings",
         "attention_dropout", "initializer_range", "time_step_max", "time_step_floor", "use_mamba_kernels",
         "use_mem_eff_path", "use_long_context", "_name_or_path", "id2label", "label2id", "return_dict",
         "output_hidden_states", "output_attentions", "chunk_size_feed_forward", "is_encoder_decoder", "problem_type",
         "tokenizer_class",
         # set by Zamba2Config.__post_init__, and read nowhere by the model (a file's value changes nothing)
         "kv_channels", "num_query_groups"}
#: Zamba2Config's ``attribute_map`` (alias -> field), transformers 5.25.
ATTRIBUTE_MAP = {"layer_types": "layers_block_type", "head_dim": "attention_head_dim"}
READ = set(DEFAULTS) | {"layers_block_type", "layer_types", "rope_parameters", "rope_theta", "attention_head_dim",
                        "head_dim", "attention_hidden_size", "mamba_headdim", "hybrid_layer_ids"}
#: transformers' layer type names (and the legacy 'mamba') -> mambalaya's.
HF_LAYER_TYPES = {"linear_attention": "mamba", "mamba": "mamba", "hybrid": "hybrid"}


def zamba2_layer_types(data: dict | ConfigFile, source: str = "config.json") -> tuple[str, ...]:
    """The layer pattern as Zamba2Config builds it: ``layers_block_type`` (alias ``layer_types``),
    else its default (54 layers, hybrid at 6, 12, ..., 42, 47, 51)."""
    cfg = data if isinstance(data, ConfigFile) else ConfigFile.of(data, source, what="Zamba2")
    listed = cfg.with_aliases(ATTRIBUTE_MAP, "Zamba2Config").layer_types("layers_block_type", HF_LAYER_TYPES, "Zamba2")
    if listed is None:
        listed = tuple(HF_LAYER_TYPES[name] for name in (
            ["linear_attention"] + (["linear_attention"] * 5 + ["hybrid"]) * 7 + ["linear_attention"] * 4
            + ["hybrid"] + ["linear_attention"] * 3 + ["hybrid"] + ["linear_attention"] * 2))
    return listed


def zamba2_config_from_hf(data: dict, *, source: str = "config.json") -> Zamba2Model:
    """A :class:`Zamba2Model` from a transformers ``zamba2`` config.json (as a dict), read as
    ``Zamba2Config`` reads it, every field by type
    (:class:`~mambalaya.workloads.hf.config.ConfigFile`); every problem is one SpecError naming
    the field."""
    cfg = ConfigFile.of(data, source, defaults=DEFAULTS, what="Zamba2")
    if cfg.value("model_type") != "zamba2":
        raise cfg.error(f"field model_type is {shown(cfg.value('model_type'))}; this reader takes 'zamba2'")
    cfg = cfg.with_aliases(ATTRIBUTE_MAP, "Zamba2Config")
    check_known_fields(cfg, "Zamba2Config", READ, INERT, MODELLED)
    types = zamba2_layer_types(cfg)
    if cfg.has("num_hidden_layers") and cfg.layer_count("num_hidden_layers") != len(types):
        raise cfg.error(f"field num_hidden_layers is {cfg.value('num_hidden_layers')}, but the layer pattern lists "
                        f"{len(types)} layers")
    theta = default_rope_theta(cfg)
    hidden, heads = cfg.integer("hidden_size"), cfg.integer("num_attention_heads")
    d_ff, kv = cfg.integer_or("intermediate_size", hidden * 4), cfg.integer_or("num_key_value_heads", heads)
    fields = {
        "d_model": hidden, "layer_types": types, "d_ff": d_ff, "n_heads": heads, "n_kv_heads": kv,
        "attention_head_dim": _attention_head_dim(cfg),
        "num_mem_blocks": cfg.integer("num_mem_blocks"),
        "attention_adapter": cfg.boolean("use_shared_attention_adapter"),
        "adapter_rank": cfg.integer("adapter_rank"), "mem_rope": cfg.boolean("use_mem_rope"),
        "rope_theta": theta,
        "mamba_heads": cfg.integer("n_mamba_heads"), "mamba_expand": cfg.integer("mamba_expand"),
        "mamba_d_state": cfg.integer("mamba_d_state"), "mamba_ngroups": cfg.integer("mamba_ngroups"),
        "mamba_d_conv": cfg.integer("mamba_d_conv"), "mamba_chunk_size": cfg.integer("chunk_size"),
        "time_step_min": cfg.number("time_step_min", minimum=0),
        "norm_eps": cfg.positive_number("rms_norm_eps"),
        "vocab_size": cfg.integer("vocab_size"), "tie_embeddings": cfg.boolean("tie_word_embeddings"),
    }
    _check_derived(cfg, hidden, types)
    from mambalaya.workloads.checks import validated_config

    return validated_config(Zamba2Model, fields, what="Zamba2", source=source)


def _attention_head_dim(cfg: ConfigFile) -> int | None:
    """The head width a config.json gives (``attention_head_dim``, or its alias ``head_dim``, read
    as it): transformers 5.25's ``Zamba2Config`` computes ``2*hidden/heads`` and then sets the
    file's value over it, and ``Zamba2Attention`` reads it (projections of ``heads*head_dim``, the
    ``(head_dim/2)^-1/2`` scale, the rotary width). Once ignored: the attention was built at the
    computed width without a word."""
    if not cfg.has("attention_head_dim"):
        return None
    value, hidden, heads = cfg.integer("attention_head_dim"), cfg.integer("hidden_size"), cfg.integer("num_attention_heads")
    return None if value * heads == 2 * hidden else value  # save_pretrained writes the computed width: the default


def _check_derived(cfg: ConfigFile, hidden: int, types: tuple[str, ...]) -> None:
    """Fields Zamba2Config computes and then sets from the file, which transformers' model cannot
    run with another value (checked with transformers 5.25: a different ``attention_hidden_size``
    or ``mamba_headdim`` fails its forward, a different ``hybrid_layer_ids`` its layer lookup):
    each must equal what the fields read give."""
    due = {"attention_hidden_size": 2 * hidden,
           "mamba_headdim": int(cfg.integer("mamba_expand") * hidden) // cfg.integer("n_mamba_heads")}
    for key, value in due.items():
        if cfg.has(key) and cfg.integer(key) != value:
            raise cfg.error(f"field {key} is {cfg.integer(key)}, but the fields it follows from give {value}; "
                            "transformers' Zamba2 model fails with another value")
    if cfg.has("hybrid_layer_ids"):
        listed = cfg.value("hybrid_layer_ids")
        due_ids = [k for k, t in enumerate(types) if t == "hybrid"]
        if not isinstance(listed, list) or listed != due_ids:
            raise cfg.error(f"field hybrid_layer_ids is {shown(listed)}, but the layer pattern's hybrid layers are "
                            f"{due_ids}; transformers' Zamba2 model fails with another list")


#: Zamba2-2.7B-class, from transformers' ``Zamba2Config()`` defaults (whose docstring calls them
#: "a Zamba2-2.7B style configuration"): hidden 2560, 54 layers in its default pattern (45
#: Mamba-2, 9 hybrid: a shared block at layers 6, 12, ..., 42, 47, 51), 32 attention heads of
#: head_dim 160 over the 5120 concatenated channels, no GQA, MLP 4 x 2560 = 10240, vocab 32000,
#: tied embeddings, Mamba-2 expand 2, d_state 64, 1 group, conv 4, chunk 256, adapter rank 128.
#: Taken from Zyphra's Zamba2-small (2.7B) announcement (zyphra.com/post/zamba2-small): two shared
#: blocks used alternately ("ABAB") and LoRA on each shared MLP, so num_mem_blocks 2, attention
#: adapters off. Assumption: 80 Mamba heads of 64 channels (Zamba2Config's default n_mamba_heads
#: 8 would give heads of 640 channels; 64 is the Mamba-2 head size and the mamba_headdim a
#: published Zamba2-7B config lists); rotary off (Zamba2Config's default). Parameters counted
#: from the module shapes (tests/test_zamba2.py checks it against transformers' modules on the
#: meta device, shared blocks once): see PUBLISHED_PARAMETERS_B.
_DEFAULT_PATTERN = zamba2_layer_types({}, "Zamba2Config")
PRESETS: dict[str, Zamba2Model] = {
    "zamba2-2.7b": Zamba2Model(d_model=2560, layer_types=_DEFAULT_PATTERN, d_ff=10240, n_heads=32,  # type: ignore[arg-type]
                               n_kv_heads=32, num_mem_blocks=2, adapter_rank=128, mamba_heads=80, mamba_expand=2,
                               mamba_d_state=64, mamba_ngroups=1, mamba_d_conv=4, mamba_chunk_size=256,
                               vocab_size=32000, tie_embeddings=True),
}
#: The model card's size, billions ("Zamba2-small, a 2.7B ... model").
PUBLISHED_PARAMETERS_B: dict[str, float] = {"zamba2-2.7b": 2.7}

__all__ = ["DEFAULTS", "GATED_NORM_EPS", "PRESETS", "PUBLISHED_PARAMETERS_B", "Zamba2Model", "zamba2_config_from_hf",
           "zamba2_layer", "zamba2_layer_types"]
