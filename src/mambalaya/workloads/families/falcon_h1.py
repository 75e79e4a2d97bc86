"""Falcon-H1 (transformers' ``FalconH1Config``): the parallel hybrid. Every layer is one block in
which a Mamba-2 mixer and an attention read the same normed input side by side, their outputs
are summed into the residual, and a gated MLP follows (``FalconH1DecoderLayer``):

``n = input_layernorm(x)``; ``h = x + ssm_out * mamba(ssm_in * n) + attn_out * attn(attn_in * n)``;
``y = h + mlp(pre_ff_layernorm(h))`` with ``mlp(z) = down_mult * down(up(z) * silu(gate_mult * gate(z)))``.

The whole layer is **one cascade** (:func:`falcon_h1_layer`), layer type ``parallel``: the
Mamba-2 block of :mod:`~mambalaya.workloads.blocks.mamba2` (its norm ``SS``, ``RS``, ``XN`` is the
layer's ``input_layernorm``), an attention that reads the same ``XN``, one Einsum summing both
into the residual, ``XO[b,i,d] = X + O + AOUT`` (the chunked scan's ``[b,c,q]`` layout reading
``X`` and ``AOUT`` at ``c*Q+q``), then the gated MLP block chained behind it (tensors ``FF_``).
The attention's ranks are named apart from the mixer's: ``Y`` KV heads, ``V`` query heads per KV
head, ``U`` x ``W`` the rotated halves and frequencies of a head (the rotary embedding covers the
whole head), ``E`` value channels, ``T`` keys, ``M`` cached positions; its tensors are ``AQ``,
``AK``, ``AV``, ``AQR``, ``AKR``, ``AMK`` (the causal mask), ``ASC``, the softmax, ``AAO``,
``AOUT``; the blocked softmax (``softmax="blocked"``, the attention block's form over key blocks
``TB`` x ``TQ``) names its tensors the attention block's with the prefix ``A`` and its key mask
``AKM``. Its KV cache is ``KC0A``/``VC0``, appended ``KNA``/``VN``, as the attention block's.

**The multipliers.** transformers applies ``ssm_in_multiplier`` to the mixer's input, the
``mup_vector`` (``ssm_multipliers``: one factor each for the z, x, B, C and dt channels) to
``in_proj``'s output, ``ssm_out_multiplier`` to the mixer's output, ``attention_in_multiplier``
to the attention's input, ``key_multiplier`` to the keys before the rotary embedding,
``attention_out_multiplier`` to its output and ``mlp_multipliers`` (gate, down) in the MLP. Each
scales the input or output of a linear map by a constant, so the loader
(:func:`~mambalaya.workloads.hf.weights_families.load_falcon_h1_layer`) folds each into the
weight it scales (exactly, as a deployed kernel does) and the cascade spends no operation on
them. ``embedding_multiplier`` and ``lm_head_multiplier`` act outside the layers (the evaluation
excludes embedding and LM head). The model holds them (:class:`FalconH1Multipliers`, read from
the config.json with the rest), so the loader finds them in the config as the other families'
loaders find what they need.

**The mixer's gated RMSNorm.** ``mamba_rms_norm`` (off by default) puts transformers'
``FalconH1RMSNormGated`` before ``out_proj``: an RMSNorm over each of the ``mamba_n_groups``
groups of ``mamba_d_ssm / mamba_n_groups`` channels (``hidden_states.view(..., n_groups,
dim // n_groups)``; in the cascade a group's ``R*P`` channels), with weight ``WGN``, and the gate
``silu(z)`` applied after the norm when ``mamba_norm_before_gate`` (FalconH1Config's default:
``YN = YD * RG * WGN * GZ`` with ``SG`` the squares of the ungated ``YD``; tensor ``YG`` is
dropped) or before it otherwise (the Mamba-2 block's tail: ``YG = YD * GZ``, then the norm of
``YG``). Without the norm the gated output ``YG`` goes straight to ``out_proj``.

**The Mamba width.** ``mamba_d_ssm`` is its own field (``FalconH1Mixer.intermediate_size``;
``mamba_expand * hidden_size`` only when it is null), not necessarily a multiple of the hidden
size: the mixer is the Mamba-2 block with its width as a field of its own
(:attr:`~mambalaya.workloads.blocks.mamba2.Mamba2Config.d_ssm` = ``mamba_d_ssm``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, Field, PositiveInt, model_validator

from mambalaya.einsum.cascade import Cascade, build_cascade
from mambalaya.einsum.compose import chain_cascades
from mambalaya.einsum.ir import Mask, Rank, Role, TensorSpec
from mambalaya.einsum.parse import parse_einsum
from mambalaya.errors import SpecError
from mambalaya.specio import SPEC_MODEL_CONFIG, list_as_tuple
from mambalaya.workloads.blocks.attention import (KEY_BLOCK, AttentionConfig, blocked_softmax_lines, blocked_tensors,
                                                   check_softmax, key_block_ranks, kv_cache_tensors)
from mambalaya.workloads.checks import chunk_padding_free_form
from mambalaya.workloads.families.base import SECOND_PREFIX, FamilyModel
from mambalaya.workloads.hf.config import check_known_fields, MAX_SIZE, ConfigFile, default_rope_theta, shown
from mambalaya.workloads.blocks.mamba2 import Mamba2Config, mamba2_layer
from mambalaya.workloads.blocks.masks import causal_band, key_blocks, with_masks
from mambalaya.workloads.blocks.mlp import MLPConfig, mlp_layer

_W, _X, _IN, _ST = Role.WEIGHT, Role.INTERMEDIATE, Role.INPUT, Role.STATE
ATTENTION_TENSORS: dict[str, tuple[tuple[str, ...], Role, str]] = {
    "WAQ": (("D", "Y", "V", "U", "W"), _W, "q_proj (x attention_in_multiplier)"),
    "WAK": (("D", "Y", "U", "W"), _W, "k_proj (x attention_in_multiplier x key_multiplier)"),
    "WAV": (("D", "Y", "E"), _W, "v_proj (x attention_in_multiplier)"),
    "AQ": (("B", "I", "Y", "V", "U", "W"), _X, "query"), "AK": (("B", "I", "Y", "U", "W"), _X, "key"),
    "AV": (("B", "I", "Y", "E"), _X, "value"),
    "COS": (("I", "W"), _IN, "rotary cos table at the block's positions"),
    "SIN": (("U", "I", "W"), _IN, "rotary sin table, signed per half (-sin, +sin)"),
    "AQR": (("B", "I", "Y", "V", "U", "W"), _X, "query after rotary embedding"),
    "AKR": (("B", "I", "Y", "U", "W"), _X, "key after rotary embedding"),
    "AMK": (("I", "T"), _IN, "causal mask in log space: 0 if t <= i else -inf"),
    "ASC": (("B", "I", "T", "Y", "V"), _X, "scaled, masked scores"),
    "AMX": (("B", "I", "Y", "V"), _X, "row max"), "AEX": (("B", "I", "T", "Y", "V"), _X, "exp(score - max)"),
    "ASM": (("B", "I", "Y", "V"), _X, "row sum"), "APR": (("B", "I", "T", "Y", "V"), _X, "probabilities"),
    "AMR": (("B", "I", "T", "Y", "V"), _X, "running max"), "ACF": (("B", "I", "T", "Y", "V"), _X, "rescale factor"),
    "APE": (("B", "I", "T", "Y", "V"), _X, "exp(score - running max)"),
    "ALR": (("B", "I", "T", "Y", "V"), _X, "running sum"), "AOR": (("B", "I", "T", "Y", "V", "E"), _X, "running output"),
    "AAO": (("B", "I", "Y", "V", "E"), _X, "attention output per head"),
    "WAO": (("Y", "V", "E", "D"), _W, "o_proj (x attention_out_multiplier)"),
    "AOUT": (("B", "I", "D"), _X, "attention output"),
}
ATTENTION_THREE_PASS = ("AMX[b,i,y,v] max= ASC[b,i,t,y,v]", "AEX[b,i,t,y,v] = exp(ASC[b,i,t,y,v] - AMX[b,i,y,v])",
               "ASM[b,i,y,v] = AEX[b,i,t,y,v]", "APR[b,i,t,y,v] = AEX[b,i,t,y,v]/ASM[b,i,y,v]",
               "AAO[b,i,y,v,e] = APR[b,i,t,y,v]*AV[b,{t},y,e]")
ATTENTION_ONLINE = ("AMR[b,i,t,y,v] = max(AMR[b,i,t-1,y,v], ASC[b,i,t,y,v])",
           "ACF[b,i,t,y,v] = exp(AMR[b,i,t-1,y,v] - AMR[b,i,t,y,v])",
           "APE[b,i,t,y,v] = exp(ASC[b,i,t,y,v] - AMR[b,i,t,y,v])",
           "ALR[b,i,t,y,v] = ALR[b,i,t-1,y,v]*ACF[b,i,t,y,v] + APE[b,i,t,y,v]",
           "AOR[b,i,t,y,v,e] = AOR[b,i,t-1,y,v,e]*ACF[b,i,t,y,v] + APE[b,i,t,y,v]*AV[b,{t},y,e]",
           "AAO[b,i,y,v,e] = AOR[b,i,T-1,y,v,e]/ALR[b,i,T-1,y,v]")
#: The mixer's gated RMSNorm with the gate after the norm (``mamba_norm_before_gate``,
#: transformers' ``FalconH1RMSNormGated``): the squares of the ungated scan output ``YD``, then
#: ``YD`` normalised, weighted and gated in one Einsum; they replace the Mamba-2 tail's ``SG``
#: and ``YN`` in place (its ``RG`` reads the new ``SG``; ``YG`` is dropped). ``{o}``: the
#: output's position indices.
NORM_BEFORE_GATE_TAIL = ("SG[b,{o},g] = YD[b,{o},g,r,p]*YD[b,{o},g,r,p]",
                         "YN[b,{o},g,r,p] = YD[b,{o},g,r,p]*RG[b,{o},g]*WGN[g,r,p]*GZ[b,{o},g,r,p]")
ATTENTION_REGIONS = {"three-pass": ("ASC", "AMX", "AEX", "ASM", "APR", "AAO"),
           "online": ("ASC", "AMR", "ACF", "APE", "ALR", "AOR", "AAO"),
           "blocked": ("ASC", "AKBX", "AMR", "ACF", "APE", "AKBS", "ALR", "AOR", "AAO")}
#: The blocked softmax's tensors in these layers (the attention block's, prefixed ``A``; heads
#: ``Y`` x ``V``; the key mask ``AKM``).
ATTENTION_BLOCKED_TENSORS = blocked_tensors(prefix="A", heads=("Y", "V"), mask="AKM")


def attention_softmax_lines(softmax: str, score: str, *, decode: bool) -> list[str]:
    """The attention of Falcon-H1's and Zamba2's layers from the scores on: ``ASC`` (``score``,
    the query-key product with ``{t}`` where it reads a key) and the ``softmax`` form through
    ``AAO``; the blocked form reads the keys at ``{k}`` and masks with ``AKM`` in both phases."""
    if softmax == "blocked":
        return blocked_softmax_lines([score.replace("{t}", "{k}")], prefix="A", heads="y,v", value="AV", mask="AKM",
                                     decode=decode)
    t = "t-(T-1)" if decode else "t"
    return [f"ASC[b,i,t,y,v] = {score.replace('{t}', t)}" + ("" if decode else " + AMK[i,t]"),
            *(line.replace("{t}", t) for line in (ATTENTION_ONLINE if softmax == "online" else ATTENTION_THREE_PASS))]


def attention_ranks(seq_len: int, softmax: str, key_block: int, *, decode: bool) -> list[Rank]:
    """The key rank(s) of Falcon-H1's and Zamba2's attention: ``T`` (``L``, or ``L+1`` in
    decode), or ``TB`` x ``TQ`` in the blocked form."""
    keys = seq_len + 1 if decode else seq_len
    if softmax == "blocked":
        return key_block_ranks(keys, key_block, decode=decode)
    return [Rank("T", keys, "L+1" if decode else "L")]


#: The list multipliers (finite numbers, as every number of a strict model), which a YAML or
#: JSON document spells as lists.
_Pair = Annotated[tuple[float, float], BeforeValidator(list_as_tuple)]
_Five = Annotated[tuple[float, float, float, float, float], BeforeValidator(list_as_tuple)]


class FalconH1Multipliers(BaseModel):
    """The multipliers of a Falcon-H1 config.json, under transformers' names, each
    ``FalconH1Config``'s default (1) where absent: what the weight loader folds into the weights
    (:func:`~mambalaya.workloads.hf.weights_families.load_falcon_h1_layer`). They scale weights
    by constants, so no count and no cost depends on them. ``mlp_multipliers`` is (gate, down);
    ``ssm_multipliers`` is (z, x, B, C, dt), the blocks of ``in_proj``'s rows."""

    model_config = SPEC_MODEL_CONFIG

    lm_head_multiplier: float = 1.0
    embedding_multiplier: float = 1.0
    mlp_multipliers: _Pair = (1.0, 1.0)
    key_multiplier: float = 1.0
    attention_out_multiplier: float = 1.0
    attention_in_multiplier: float = 1.0
    ssm_multipliers: _Five = (1.0, 1.0, 1.0, 1.0, 1.0)
    ssm_in_multiplier: float = 1.0
    ssm_out_multiplier: float = 1.0


class FalconH1Model(FamilyModel):
    """A Falcon-H1 model: transformers' ``FalconH1Config`` fields under mambalaya's names (every
    layer is ``parallel``; the multipliers are folded into the weights, see the module doc).
    ``mamba_norm_before_gate`` (FalconH1Config's default true) only acts with ``mamba_rms_norm``."""

    LAYER_TYPES: ClassVar[tuple[str, ...]] = ("parallel",)
    SCANNED: ClassVar[tuple[str, ...]] = ("parallel",)

    family: Literal["falcon_h1"] = "falcon_h1"
    layer_types: Annotated[tuple[Literal["parallel"], ...],
                           BeforeValidator(list_as_tuple)] = Field(min_length=1)
    d_ff: PositiveInt
    n_heads: PositiveInt
    n_kv_heads: PositiveInt
    head_dim: PositiveInt
    rope_theta: float = Field(1e11, gt=0)
    mamba_d_ssm: PositiveInt
    mamba_heads: PositiveInt
    mamba_d_state: PositiveInt
    mamba_ngroups: PositiveInt = 1
    mamba_d_conv: PositiveInt = 4
    mamba_chunk_size: PositiveInt = 256
    mamba_rms_norm: bool = False
    mamba_norm_before_gate: bool = True
    norm_eps: float = Field(1e-5, gt=0)
    multipliers: FalconH1Multipliers = FalconH1Multipliers()

    @model_validator(mode="after")
    def _blocks_fit(self) -> "FalconH1Model":
        if self.mamba_d_ssm % self.mamba_heads:
            raise ValueError(f"mamba_heads = {self.mamba_heads} does not divide mamba_d_ssm = {self.mamba_d_ssm}")
        if self.n_heads % self.n_kv_heads or self.head_dim % 2:
            raise ValueError(f"n_kv_heads = {self.n_kv_heads} must divide n_heads = {self.n_heads} and head_dim = "
                             f"{self.head_dim} be even (the rotary embedding rotates pairs of channels)")
        self.mamba2()
        return self

    @property
    def d_state(self) -> int:
        return self.mamba_d_state

    @property
    def expand(self) -> int | float:
        """The Mamba width over the hidden size, ``mamba_d_ssm / d_model`` (whole or not)."""
        ratio = self.mamba_d_ssm / self.d_model
        return int(ratio) if ratio.is_integer() else ratio

    @property
    def d_conv(self) -> int:
        return self.mamba_d_conv

    @property
    def norm_before_gate(self) -> bool:
        """Whether the mixer normalises before the gate: only with its gated norm (``mamba_rms_norm``)."""
        return self.mamba_rms_norm and self.mamba_norm_before_gate

    def mamba2(self) -> Mamba2Config:
        return Mamba2Config(d_model=self.d_model, n_layers=self.n_layers, d_state=self.mamba_d_state,
                                   headdim=self.mamba_d_ssm // self.mamba_heads, ngroups=self.mamba_ngroups,
                                   d_ssm=self.mamba_d_ssm, d_conv=self.mamba_d_conv,
                                   chunk_size=self.mamba_chunk_size, vocab_size=self.vocab_size,
                                   norm_eps=self.norm_eps)

    def attention_config(self) -> AttentionConfig:
        return AttentionConfig(d_model=self.d_model, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads,
                               head_dim=self.head_dim, rope_theta=self.rope_theta, partial_rotary_factor=1.0,
                               norm_eps=self.norm_eps)

    def layer_parameters(self, layer_type: str = "parallel") -> int:
        """input_layernorm + the Mamba-2 mixer (its gated norm only with mamba_rms_norm) + the
        attention's four projections + pre_ff_layernorm + the MLP's three projections."""
        mamba = self.mamba2().layer_parameters() - (0 if self.mamba_rms_norm else self.mamba_d_ssm)
        attention = self.attention_config().layer_parameters() - self.d_model  # its norm is the shared one
        return mamba + attention + self.d_model + 3 * self.d_model * self.d_ff

    def shape_text(self) -> str:
        return (f"{super().shape_text()} (Mamba-2 and attention side by side); attention heads={self.n_heads} "
                f"kv={self.n_kv_heads} head_dim={self.head_dim}; mamba d_ssm={self.mamba_d_ssm} heads="
                f"{self.mamba_heads}; mlp={self.d_ff}")

    def layer(self, layer_type: str, *, batch: int, seq_len: int, phase: str = "prefill", bits: int = 16,
              scan: str | None = None, softmax: str = "three-pass", name: str | None = None,
              key_block: int = KEY_BLOCK) -> Cascade:
        if layer_type != "parallel":
            raise SpecError(f"layer type {layer_type!r} is not Falcon-H1's (parallel)")
        return falcon_h1_layer(self, batch=batch, seq_len=seq_len, phase=phase, bits=bits, scan=scan,
                               softmax=softmax, name=name, key_block=key_block)


def attention_masks(seq_len: int, *, decode: bool) -> dict[str, Mask]:
    """The masks of the attention inside one cascade (this block's, Zamba2's shared block's):
    the causal ``AMK[I,T]`` and the blocked softmax's ``AKM[I,TB,TQ]`` (a decode step's query
    at the cache length)."""
    return {"AMK": causal_band("I", "T"), "AKM": key_blocks(first=seq_len if decode else 0)}


def falcon_h1_layer(config: FalconH1Model, *, batch: int, seq_len: int, phase: str = "prefill", bits: int = 16,
                    scan: str | None = None, softmax: str = "three-pass", name: str | None = None,
                    key_block: int = KEY_BLOCK) -> Cascade:
    """One Falcon-H1 layer as one cascade (see the module docstring); ``softmax="blocked"`` runs
    over blocks of ``key_block`` keys (:func:`~mambalaya.workloads.blocks.attention.attention_layer`)."""
    check_softmax(softmax)
    c, decode = config, phase == "decode"
    form = chunk_padding_free_form(scan, phase, seq_len, c.mamba_chunk_size,
                                   "the attention and MLP of the layer would then count the padded rows too")
    mixer = mamba2_layer(c.mamba2(), batch=batch, seq_len=seq_len, phase=phase, bits=bits,  # type: ignore[arg-type]
                         state_io=True, scan=form)  # type: ignore[arg-type]
    chunked = "Q" in mixer.ranks
    o, at = ("c,q", "c*Q+q") if chunked else ("i", "i")
    drop = {"XO"} | (set() if c.mamba_rms_norm else {"SG", "RG", "YN", "WGN"})
    drop |= {"YG"} if c.norm_before_gate else set()
    ranks = list(mixer.ranks.values()) + attention_ranks(seq_len, softmax, key_block, decode=decode) + [
        Rank("Y", c.n_kv_heads, "n_kv_heads"), Rank("V", c.n_heads // c.n_kv_heads, "n_heads/n_kv_heads"),
        Rank("U", 2, "2"), Rank("W", c.head_dim // 2, "head_dim/2"), Rank("E", c.head_dim, "head_dim")]
    if decode:
        ranks.append(Rank("M", seq_len, "L"))
    lines = ["AQ[b,i,y,v,u,w] = XN[b,i,d]*WAQ[d,y,v,u,w]", "AK[b,i,y,u,w] = XN[b,i,d]*WAK[d,y,u,w]",
             "AV[b,i,y,e] = XN[b,i,d]*WAV[d,y,e]",
             "AQR[b,i,y,v,u,w] = AQ[b,i,y,v,u,w]*COS[i,w] + AQ[b,i,y,v,1-u,w]*SIN[u,i,w]",
             "AKR[b,i,y,u,w] = AK[b,i,y,u,w]*COS[i,w] + AK[b,i,y,1-u,w]*SIN[u,i,w]",
             *attention_softmax_lines(softmax, "AQR[b,i,y,v,u,w]*AKR[b,{t},y,u,w]*ascale", decode=decode),
             "AOUT[b,i,d] = AAO[b,i,y,v,e]*WAO[y,v,e,d]",
             f"O[b,{o},d] = {'YN' if c.mamba_rms_norm else 'YG'}[b,{o},g,r,p]*WO[g,r,p,d]",
             f"XO[b,{o},d] = X[b,{at},d] + O[b,{o},d] + AOUT[b,{at},d]",
             "KNA[b,i,y,u,w] = AKR[b,i,y,u,w]", "VN[b,i,y,e] = AV[b,i,y,e]"]
    sizes = {r.name: r.size for r in ranks}
    parsed = [parse_einsum(line, sizes=sizes) for line in lines]
    in_place = {e.name: e for e in (parse_einsum(line.replace("{o}", o), sizes=sizes)
                                    for line in (NORM_BEFORE_GATE_TAIL if c.norm_before_gate else ()))}
    replaced = {e.name for e in parsed}
    einsums = [in_place.get(e.name, e) for e in mixer.einsums if e.name not in drop and e.name not in replaced] + parsed
    used = {e.name for e in parsed} | {x for e in parsed for x in e.input_tensors}
    tensors = {n: s for n, s in mixer.tensors.items() if n not in drop}
    if in_place:
        tensors["YN"] = replace(tensors["YN"], description="normalised output times the gate (norm before the gate)")
    specs = {**ATTENTION_TENSORS, **ATTENTION_BLOCKED_TENSORS} if softmax == "blocked" else ATTENTION_TENSORS
    tensors.update({n: TensorSpec(n, rk, role, bits, description=d) for n, (rk, role, d) in specs.items()
                    if n in used})
    tensors = with_masks(tensors, attention_masks(seq_len, decode=decode))
    tensors["XO"] = mixer.tensors["XO"]
    for src, cache, new in (("AKR", "KC0A", "KNA"), ("AV", "VC0", "VN")):
        tensors.update(kv_cache_tensors(tensors[src], cache, new, decode=decode))
    block = build_cascade(
        name=f"falcon-h1-block-{phase}",
        params={**{k: v for k, v in mixer.params.items() if k != "expand"}, "d_ssm": c.mamba_d_ssm,
                "ascale": c.head_dim ** -0.5, "n_heads": c.n_heads, "n_kv_heads": c.n_kv_heads,
                "head_dim": c.head_dim, **({"key_block": key_block} if softmax == "blocked" else {})},
        ranks=ranks, tensors=list(tensors.values()), einsums=einsums,
        description=(f"Falcon-H1 parallel block, {phase}, {form} scan beside {softmax} attention; "
                     f"{mixer.description}; attention {c.n_heads} heads ({c.n_kv_heads} kv), head_dim {c.head_dim}"),
        regions={**mixer.regions, "attention": ATTENTION_REGIONS[softmax]})
    chunk = block.size("Q") if chunked else None
    mlp = mlp_layer(MLPConfig(d_model=c.d_model, d_ff=c.d_ff, norm_eps=c.norm_eps), batch=batch, seq_len=seq_len,
                    phase=phase, bits=bits, chunk_size=chunk)  # type: ignore[arg-type]
    return chain_cascades(block, mlp, prefix=SECOND_PREFIX, name=name or f"falcon_h1-parallel-{phase}")


# --------------------------------------------------------------------------------------------
# config.json
# --------------------------------------------------------------------------------------------

DEFAULTS: dict[str, Any] = {
    "vocab_size": 128000, "tie_word_embeddings": False, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-5,
    "mamba_d_ssm": 1024, "mamba_n_heads": 128, "mamba_d_head": "auto", "mamba_n_groups": 1, "mamba_d_state": 256,
    "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 256, "mamba_rms_norm": False,
}
#: The multipliers (folded into the weights by the loader): read, any value.
MULTIPLIERS = ("lm_head_multiplier", "embedding_multiplier", "mlp_multipliers", "key_multiplier",
               "attention_out_multiplier", "attention_in_multiplier", "ssm_multipliers", "ssm_in_multiplier",
               "ssm_out_multiplier")
MODELLED = {"mamba_conv_bias": (True, "the Mamba-2 conv has a bias"),
            "mamba_proj_bias": (False, "in_proj has no bias"), "projectors_bias": (False, "out_proj has no bias"),
            "attention_bias": (False, "the attention projections have no bias"),
            "mlp_bias": (False, "the MLP projections have no bias"), "hidden_act": ("silu", "SiLU activations")}
INERT = {"model_type", "architectures", "transformers_version", "torch_dtype", "dtype", "use_cache",
         "num_logits_to_keep", "pad_token_id", "bos_token_id", "eos_token_id", "max_position_embeddings",
         "attention_dropout", "initializer_range", "_name_or_path", "id2label", "label2id", "return_dict",
         "output_hidden_states", "output_attentions", "chunk_size_feed_forward", "is_encoder_decoder",
         "problem_type", "tokenizer_class"}
READ = set(DEFAULTS) | set(MULTIPLIERS) | {"head_dim", "rope_parameters", "rope_theta", "mamba_norm_before_gate",
                                          "time_step_limit"}


#: The lengths of the list multipliers: mlp (gate, down); ssm (z, x, B, C, dt).
LIST_MULTIPLIERS = {"mlp_multipliers": 2, "ssm_multipliers": 5}


def falcon_h1_config_from_hf(data: dict, *, source: str = "config.json") -> FalconH1Model:
    """A :class:`FalconH1Model` from a transformers ``falcon_h1`` config.json (as a dict), read as
    ``FalconH1Config`` reads it, every field by type
    (:class:`~mambalaya.workloads.hf.config.ConfigFile`); every problem is one SpecError naming
    the field."""
    cfg = ConfigFile.of(data, source, defaults=DEFAULTS, what="Falcon-H1")
    if cfg.value("model_type") != "falcon_h1":
        raise cfg.error(f"field model_type is {shown(cfg.value('model_type'))}; this reader takes 'falcon_h1'")
    for key in ("layers_block_type", "layer_types"):  # (once read and ignored: transformers fails on any value)
        if cfg.has(key):
            raise cfg.error(f"field {key} is given; transformers 5.25 cannot load a Falcon-H1 config.json that gives "
                            "it (a read-only property of FalconH1Config: every layer is 'hybrid'), so it is refused")
    check_known_fields(cfg, "FalconH1Config", READ, INERT, MODELLED)
    rms = cfg.boolean("mamba_rms_norm")
    # FalconH1Config's default is true; a null acts as false (FalconH1RMSNormGated tests its truth)
    before_gate = cfg.boolean("mamba_norm_before_gate") if cfg.given("mamba_norm_before_gate") else \
        not cfg.has("mamba_norm_before_gate")
    cfg.require_no_clamp("time_step_limit")
    multipliers = multipliers_from_hf(cfg)
    hidden, heads = cfg.integer("hidden_size"), cfg.integer("num_attention_heads")
    d_ssm = mamba_width_from_hf(cfg, hidden)
    m_heads = cfg.integer("mamba_n_heads")
    if d_ssm % m_heads:
        raise cfg.error(f"field mamba_n_heads = {m_heads} does not divide the Mamba width {d_ssm} (mamba_d_ssm; "
                        "FalconH1Config refuses it too)")
    d_head = cfg.integer_or_auto("mamba_d_head")
    if d_head is not None and d_head * m_heads != d_ssm:
        raise cfg.error(f"fields mamba_d_head * mamba_n_heads = {d_head * m_heads} is not the Mamba width "
                        f"{d_ssm} (mamba_d_ssm)")
    groups = cfg.integer("mamba_n_groups")
    if m_heads % groups:
        raise cfg.error(f"field mamba_n_groups = {groups} does not divide mamba_n_heads = {m_heads} (each group's B "
                        "and C serve a whole number of heads)")
    theta = default_rope_theta(cfg)
    kv = cfg.integer_or("num_key_value_heads", heads)
    fields = {
        "d_model": hidden, "layer_types": ("parallel",) * cfg.layer_count("num_hidden_layers"),
        "d_ff": cfg.integer("intermediate_size"), "n_heads": heads, "n_kv_heads": kv,
        "head_dim": cfg.integer_or("head_dim", hidden // heads),
        "rope_theta": theta, "mamba_d_ssm": d_ssm, "mamba_heads": m_heads,
        "mamba_d_state": cfg.integer("mamba_d_state"), "mamba_ngroups": groups,
        "mamba_d_conv": cfg.integer("mamba_d_conv"), "mamba_chunk_size": cfg.integer("mamba_chunk_size"),
        "mamba_rms_norm": rms, "mamba_norm_before_gate": before_gate, "norm_eps": cfg.positive_number("rms_norm_eps"),
        "vocab_size": cfg.integer("vocab_size"), "tie_embeddings": cfg.boolean("tie_word_embeddings"),
        "multipliers": FalconH1Multipliers(**multipliers),
    }
    from mambalaya.workloads.checks import validated_config

    return validated_config(FalconH1Model, fields, what="Falcon-H1", source=source)


def mamba_width_from_hf(cfg: ConfigFile, hidden: int) -> int:
    """The Mamba width as transformers reads it (``FalconH1Mixer.intermediate_size``):
    ``mamba_d_ssm`` (default 1024), or ``mamba_expand * hidden_size`` when it is null (only then
    does ``mamba_expand`` count; otherwise only its type is checked)."""
    if cfg.value("mamba_d_ssm") is not None:
        if cfg.value("mamba_expand") is not None:
            cfg.integer("mamba_expand")  # unread, but a config transformers runs types it (int | None)
        return cfg.integer("mamba_d_ssm")
    width = cfg.integer("mamba_expand") * hidden
    if width > MAX_SIZE:
        raise cfg.error(f"fields mamba_expand * hidden_size = {width:,} (the Mamba width, mamba_d_ssm being null) is "
                        f"more than any size mambalaya reads (at most {MAX_SIZE:,})")
    return width


def multipliers_from_hf(data: dict | ConfigFile) -> dict[str, Any]:
    """The multipliers a Falcon-H1 config.json sets, each a finite number (FalconH1Config's
    defaults, 1, where absent or null): a float each, and the lists ``mlp_multipliers`` (2) and
    ``ssm_multipliers`` (5)."""
    cfg = data if isinstance(data, ConfigFile) else ConfigFile.of(data, "config.json", what="Falcon-H1")
    out: dict[str, Any] = {}
    for key in MULTIPLIERS:
        length = LIST_MULTIPLIERS.get(key)
        if not cfg.given(key):
            out[key] = 1.0 if length is None else [1.0] * length
        else:
            out[key] = cfg.number(key) if length is None else list(cfg.numbers(key, length))
    return out


#: Falcon-H1-7B (tiiuae/Falcon-H1-7B-Base), as its config.json gives it (a copy published in a
#: third-party test suite; the release was not reachable from here): hidden 3072, 44 layers,
#: 12 attention heads, 2 KV heads, head_dim 128, MLP 12288, vocab 130048, untied, Mamba-2 width
#: mamba_d_ssm 3072 in 24 heads of 128, state 256, 1 group, conv 4, chunk 128. rope_theta
#: 1e11 (Falcon-H1's; it changes no count), mamba_rms_norm false (FalconH1Config's default) and
#: the multipliers at FalconH1Config's defaults (1: they scale weights and change no count or
#: cost) are assumptions. Parameters counted from the module shapes (checked against transformers'
#: modules on the meta device in tests/test_dense_families.py): 7,585,513,568 ("7B").
PRESETS: dict[str, FalconH1Model] = {
    "falcon-h1-7b": FalconH1Model(d_model=3072, layer_types=("parallel",) * 44, d_ff=12288, n_heads=12, n_kv_heads=2,
                                  head_dim=128, rope_theta=1e11, mamba_d_ssm=3072, mamba_heads=24, mamba_d_state=256,
                                  mamba_ngroups=1, mamba_d_conv=4, mamba_chunk_size=128, vocab_size=130048),
}
PUBLISHED_PARAMETERS_B: dict[str, float] = {"falcon-h1-7b": 7.0}

__all__ = ["ATTENTION_BLOCKED_TENSORS", "ATTENTION_THREE_PASS", "ATTENTION_REGIONS", "ATTENTION_ONLINE",
           "ATTENTION_TENSORS", "attention_masks", "attention_ranks", "attention_softmax_lines", "MULTIPLIERS",
           "NORM_BEFORE_GATE_TAIL", "PRESETS", "PUBLISHED_PARAMETERS_B", "FalconH1Model",
           "FalconH1Multipliers", "falcon_h1_config_from_hf", "falcon_h1_layer", "mamba_width_from_hf",
           "multipliers_from_hf"]
