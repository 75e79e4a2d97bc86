"""Two mixture-of-experts hybrid families, as transformers 5.25 builds them:

* **Jamba** (``JambaModel``): Mamba-1 mixers with RMSNorms on ``dt``, ``B`` and ``C``
  (``JambaMambaMixer``) and grouped-query attention without a position embedding
  (``JambaAttention``, scores scaled by ``head_dim ** -0.5``), each followed by a dense gated
  MLP or a MoE block (softmax over all experts, top-k of it, not renormalised:
  ``JambaTopKRouter``).
* **Granite 4 hybrid** (``GraniteMoeHybridModel``): Mamba-2 mixers (as Bamba's) and attention
  (rotary embedding only with ``position_embedding_type="rope"``; scores scaled by
  ``attention_multiplier``), each followed by a MoE block (top-k logits, softmax over them:
  ``GraniteMoeHybridTopKRouter``) plus an always-on shared MLP; both residual branches scaled
  by ``residual_multiplier``.

Both attentions take their head width as ``getattr(config, "head_dim", hidden_size //
num_attention_heads)`` (transformers 5.25, ``JambaAttention`` and ``GraniteMoeHybridAttention``),
and Granite's rotary embedding rotates that many channels of a head: a ``head_dim`` in the
config gives heads that are not ``hidden/heads`` wide (``q_proj`` then has ``heads*head_dim``
outputs, not ``hidden``).

A layer is one cascade (the mixer block, then the feed-forward block with its tensors prefixed
``FF_``, :func:`~mambalaya.einsum.compose.chain_cascades`). Layer types name both halves:
``mamba``, ``attention`` (a dense MLP after the mixer) and ``mamba-moe``, ``attention-moe``.
The MoE block and the routing assumption of the cost model: :mod:`mambalaya.workloads.blocks.moe`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, PositiveInt, model_validator

from mambalaya.errors import SpecError
from mambalaya.specio import SPEC_MODEL_CONFIG, list_as_tuple
from mambalaya.einsum.cascade import Cascade, build_cascade
from mambalaya.einsum.compose import chain_cascades
from mambalaya.einsum.ir import Binary, Einsum, Param, Role, TensorSpec
from mambalaya.einsum.parse import parse_einsum
from mambalaya.workloads.blocks.attention import KEY_BLOCK, AttentionConfig, Softmax, attention_layer
from mambalaya.workloads.checks import chunk_padding_free_form, validated_config
from mambalaya.workloads.blocks.mamba1 import Mamba1Config, mamba1_layer
from mambalaya.workloads.blocks.mamba2 import Mamba2Config, mamba2_layer
from mambalaya.workloads.blocks.mlp import MLPConfig, mlp_layer
from mambalaya.workloads.blocks.moe import MoEConfig, Router, Routing, moe_layer

MoELayerType = Literal["mamba", "attention", "mamba-moe", "attention-moe"]
MOE_LAYER_TYPES: tuple[str, ...] = ("mamba", "mamba-moe", "attention", "attention-moe")
MOE_FAMILIES: tuple[str, ...] = ("jamba", "granitemoehybrid")
MLP_PREFIX = "FF_"
_ROUTERS: dict[str, Router] = {"jamba": "softmax-topk", "granitemoehybrid": "topk-softmax"}


class MoEHybridConfig(BaseModel):
    """A Jamba or Granite 4 hybrid model under mambalaya's names (transformers' in brackets). A
    field with a default takes the transformers class's default; the others are required. Strict
    (:data:`~mambalaya.specio.SPEC_MODEL_CONFIG`): integers are integers, booleans booleans,
    numbers finite."""

    model_config = SPEC_MODEL_CONFIG

    family: Literal["jamba", "granitemoehybrid"]
    d_model: PositiveInt  # hidden_size
    layer_types: Annotated[tuple[MoELayerType, ...], BeforeValidator(list_as_tuple)] = Field(min_length=1)
    d_ff: PositiveInt  # intermediate_size: the dense MLP's (Jamba) and each expert's
    n_experts: int = Field(ge=0)  # num_experts / num_local_experts
    top_k: int = Field(ge=0)  # num_experts_per_tok
    shared_d_ff: PositiveInt | None = None  # Granite: shared_intermediate_size
    n_heads: PositiveInt
    n_kv_heads: PositiveInt
    #: head_dim; None: hidden_size // num_attention_heads, the default both attentions take
    #: (``getattr(config, "head_dim", config.hidden_size // config.num_attention_heads)``)
    head_dim: PositiveInt | None = None
    rope: bool = False  # Granite: position_embedding_type == "rope"; Jamba: none
    rope_theta: float = Field(10000.0, gt=0)
    attention_multiplier: float | None = Field(None, gt=0)  # None: head_dim ** -0.5
    residual_multiplier: float = Field(1.0, gt=0)
    # Jamba's Mamba-1 mixer
    mamba_d_state: PositiveInt
    mamba_d_conv: PositiveInt = 4
    mamba_expand: PositiveInt = 2
    mamba_dt_rank: PositiveInt | None = None  # None: ceil(hidden_size / 16)
    # Granite's Mamba-2 mixer
    mamba_heads: PositiveInt | None = None
    mamba_headdim: PositiveInt | None = None
    mamba_ngroups: PositiveInt = 1
    mamba_chunk_size: PositiveInt = 256
    vocab_size: PositiveInt
    tie_embeddings: bool = False
    norm_eps: float = Field(1e-6, gt=0)
    routing: Routing = "uniform"

    @model_validator(mode="after")
    def _fits(self) -> "MoEHybridConfig":
        moe = any(t.endswith("-moe") for t in self.layer_types)
        if moe and self.top_k > self.n_experts:
            raise ValueError(f"top_k = {self.top_k} exceeds n_experts = {self.n_experts}")
        if moe and (self.top_k < 1 or self.n_experts < 2):
            raise ValueError("a MoE layer needs n_experts >= 2 and top_k >= 1")
        other = self._other_mixers_fields()
        if other:  # fields of the mixer this family does not have: once accepted, read by nothing
            raise ValueError(f"{', '.join(other)} {'is a field' if len(other) == 1 else 'are fields'} of "
                             f"{'Granite 4' if self.family == 'jamba' else 'Jamba'}'s "
                             f"{'Mamba-2' if self.family == 'jamba' else 'Mamba-1'} mixer; a {self.family} model's "
                             "Mamba layers do not read it: drop it")
        if self.family == "granitemoehybrid":
            if self.mamba_heads is None or self.mamba_headdim is None:
                raise ValueError("a Granite 4 hybrid model needs mamba_heads and mamba_headdim (its Mamba-2 heads)")
            if self.mamba_heads * self.mamba_headdim != self.mamba_expand * self.d_model:
                raise ValueError(f"mamba_heads * mamba_headdim = {self.mamba_heads * self.mamba_headdim} is not "
                                 f"mamba_expand * d_model = {self.mamba_expand * self.d_model}")
            if self.shared_d_ff is None:
                raise ValueError("a Granite 4 hybrid model has a shared MLP: shared_d_ff is required")
            if any(t.endswith("-moe") for t in self.layer_types) != (self.n_experts > 0):
                raise ValueError("in a Granite 4 hybrid model every layer has the MoE block when n_experts > 0, "
                                 "none when it is 0")
        elif self.shared_d_ff is not None or self.rope or self.attention_multiplier or self.residual_multiplier != 1:
            raise ValueError("Jamba has no shared MLP, no rotary embedding and no attention or residual multipliers")
        self.attention()
        if "mamba" in {t.split("-")[0] for t in self.layer_types}:
            self.mamba1() if self.family == "jamba" else self.mamba2()
        if moe:
            self.moe()
        return self

    def _other_mixers_fields(self) -> list[str]:
        """The fields given (other than at their defaults) of the mixer this family lacks: Granite's
        Mamba-2 fields in a Jamba model, Jamba's Mamba-1 ``mamba_dt_rank`` in a Granite one."""
        if self.family == "jamba":
            given = {"mamba_heads": self.mamba_heads is not None, "mamba_headdim": self.mamba_headdim is not None,
                     "mamba_ngroups": self.mamba_ngroups != 1, "mamba_chunk_size": self.mamba_chunk_size != 256}
        else:
            given = {"mamba_dt_rank": self.mamba_dt_rank is not None}
        return [k for k, v in given.items() if v]

    @property
    def n_layers(self) -> int:
        return len(self.layer_types)

    def layer_counts(self) -> dict[str, int]:
        counts = Counter(self.layer_types)
        return {t: counts[t] for t in MOE_LAYER_TYPES if counts[t]}

    def attention(self) -> AttentionConfig:
        return AttentionConfig(d_model=self.d_model, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads,
                               head_dim=self.head_dim, rope_theta=self.rope_theta,
                               partial_rotary_factor=1.0 if self.rope else 0.0,
                               norm_eps=self.norm_eps)

    def mamba1(self) -> Mamba1Config:
        return Mamba1Config(d_model=self.d_model, d_state=self.mamba_d_state, expand=self.mamba_expand,
                            d_conv=self.mamba_d_conv, dt_rank=self.mamba_dt_rank or "auto", norm_eps=self.norm_eps)

    def mamba2(self) -> Mamba2Config:
        return Mamba2Config(d_model=self.d_model, d_state=self.mamba_d_state, headdim=self.mamba_headdim,
                            ngroups=self.mamba_ngroups, expand=self.mamba_expand, d_conv=self.mamba_d_conv,
                            chunk_size=self.mamba_chunk_size, vocab_size=self.vocab_size, norm_eps=self.norm_eps)

    def moe(self) -> MoEConfig:
        return MoEConfig(d_model=self.d_model, d_ff=self.d_ff, n_experts=self.n_experts, top_k=self.top_k,
                         router=_ROUTERS[self.family], shared_d_ff=self.shared_d_ff,
                         residual_multiplier=self.residual_multiplier, norm_eps=self.norm_eps, routing=self.routing)

    def mlp(self) -> MLPConfig:
        return MLPConfig(d_model=self.d_model, d_ff=self.shared_d_ff or self.d_ff, norm_eps=self.norm_eps)

    def layer_parameters(self, layer_type: str, *, active: bool = False) -> int:
        """Weight elements of one layer of ``layer_type`` (``active``: those one token uses)."""
        mixer, ffn = layer_type.split("-")[0], layer_type.endswith("-moe")
        if mixer == "attention":
            n = self.attention().layer_parameters()
        elif self.family == "jamba":
            n = self.mamba1().layer_parameters() + self.mamba1().dt_rank_value + 2 * self.mamba_d_state  # dt/B/C norms
        else:
            n = self.mamba2().layer_parameters()
        if ffn:
            return n + (self.moe().active_parameters() if active else self.moe().layer_parameters())
        return n + self.mlp().layer_parameters()

    def model_parameters(self, *, active: bool = False) -> int:
        """Embedding (and the LM head unless tied) + every layer + the final norm (``active``:
        :meth:`active_parameters`)."""
        embed = self.vocab_size * self.d_model * (1 if self.tie_embeddings else 2)
        layers = sum(n * self.layer_parameters(t, active=active) for t, n in self.layer_counts().items())
        return embed + layers + self.d_model

    def active_parameters(self) -> int:
        """The weight elements one token's forward pass uses: every weight of the model except
        the ``n_experts - top_k`` experts a MoE layer's router does not pick for the token. So
        the embedding, the LM head, every mixer, norm, router, dense MLP and Granite's shared MLP
        count whole, and each MoE layer ``top_k`` of its experts. The embedding counts whole
        although a token reads one row of it, as the model cards count it (jamba-v0.1: 12B
        active of 52B; granite-4.0-h-tiny: 1B of 7B)."""
        return self.model_parameters(active=True)


def parse_moe_hybrid_config(data: dict, *, source: str = "model config") -> MoEHybridConfig:
    return validated_config(MoEHybridConfig, data, what="MoE hybrid (Jamba / Granite 4)", source=source)


# --------------------------------------------------------------------------------------------
# the Jamba Mamba mixer: Mamba-1 with RMSNorms on dt, B and C

_JAMBA_NORMS = (
    ("DL", "R", "r", "WDLN", "dt_layernorm"),
    ("BM", "N", "n", "WBN", "b_layernorm"),
    ("CM", "N", "n", "WCMN", "c_layernorm"),
)


def jamba_mamba_layer(config: Mamba1Config, *, batch: int, seq_len: int, phase: str, bits: int = 16,
                      name: str | None = None) -> Cascade:
    """Jamba's Mamba block (``JambaMambaMixer`` behind its input norm, residual): the Mamba-1
    cascade with ``dt``, ``B`` and ``C`` each RMS-normalised after ``x_proj`` (``DL -> DLN``,
    ``BM -> BMN``, ``CM -> CMN``, weights ``WDLN``, ``WBN``, ``WCMN``); state in and out."""
    base = mamba1_layer(config, batch=batch, seq_len=seq_len, phase=phase, bits=bits,  # type: ignore[arg-type]
                        state_io=True, name=name or f"jamba-mamba-{phase}")
    sizes = {r: base.size(r) for r in base.ranks}
    tensors = dict(base.tensors)
    einsums: list[Einsum] = []
    normed = {}
    for e in base.einsums:
        if e.name in ("DT", "BX", "YS"):
            text = str(e)
            for raw, *_ in _JAMBA_NORMS:
                text = text.replace(f"{raw}[", f"{raw}N[")
            e = parse_einsum(text, sizes=sizes)
        einsums.append(e)
        for raw, rank, v, weight, _ in _JAMBA_NORMS:
            if e.name == raw:
                lines = [f"{raw}Q[b,i] = {raw}[b,i,{v}]*{raw}[b,i,{v}]",
                         f"{raw}S[b,i] = rsqrt({raw}Q[b,i]/{rank} + eps)",
                         f"{raw}N[b,i,{v}] = {raw}[b,i,{v}]*{raw}S[b,i]*{weight}[{v}]"]
                einsums += [parse_einsum(line, sizes=sizes) for line in lines]
                tensors[weight] = TensorSpec(weight, (rank,), Role.WEIGHT, bits, description=f"{raw} RMSNorm weight")
                for t, rk, what in ((f"{raw}Q", ("B", "I"), "sum of squares"), (f"{raw}S", ("B", "I"), "reciprocal RMS"),
                                    (f"{raw}N", ("B", "I", rank), "normalised")):
                    tensors[t] = TensorSpec(t, rk, Role.INTERMEDIATE, bits, description=f"{raw} {what}")
                normed[raw] = True
    return build_cascade(name=base.name, params=base.params, ranks=list(base.ranks.values()),
                         tensors=list(tensors.values()), einsums=einsums,
                         description=base.description.replace("Mamba-1 block", "Jamba Mamba block (Mamba-1, "
                                                              "dt/B/C RMSNorms)"), regions=base.regions)


# --------------------------------------------------------------------------------------------
# layers

def _scaled_residual(cascade: Cascade, multiplier: float) -> Cascade:
    """``cascade`` with its residual ``XO = X + O`` written ``XO = X + O*rm`` (Granite's
    ``residual_multiplier``); unchanged when the multiplier is 1."""
    if multiplier == 1:
        return cascade
    einsums = []
    for e in cascade.einsums:
        if e.name == "XO":
            assert isinstance(e.expr, Binary) and e.expr.op == "+"
            e = Einsum(e.output, Binary("+", e.expr.lhs, Binary("*", e.expr.rhs, Param("rm"))), e.reduce_op)
        einsums.append(e)
    return build_cascade(name=cascade.name, params={**cascade.params, "rm": multiplier},
                         ranks=list(cascade.ranks.values()), tensors=list(cascade.tensors.values()), einsums=einsums,
                         description=cascade.description, regions=cascade.regions)


def moe_family_layer(
    config: MoEHybridConfig, layer_type: str, *, batch: int, seq_len: int | None = None, phase: str = "prefill",
    bits: int = 16, scan: str | None = None, softmax: Softmax = "three-pass", name: str | None = None,
    state: Mapping[str, Any] | None = None, key_block: int = KEY_BLOCK,
) -> Cascade:
    """One layer of ``layer_type`` as one cascade: the mixer block, then the dense MLP or the
    MoE block (tensors prefixed ``FF_``). Arguments as :func:`~mambalaya.workloads.families.bamba.hybrid_layer`."""
    from mambalaya.workloads.families.bamba import layer_length

    if layer_type not in config.layer_counts():
        raise SpecError(f"layer type {layer_type!r} is not one of this {config.family} model's "
                        f"({', '.join(config.layer_counts())})")
    mixer_type = layer_type.split("-")[0]
    seq_len = layer_length(mixer_type, phase, seq_len, state)
    if mixer_type == "attention":
        mixer = attention_layer(config.attention(), batch=batch, seq_len=seq_len, phase=phase,  # type: ignore[arg-type]
                                bits=bits, softmax=softmax, key_block=key_block)
        if config.attention_multiplier is not None:
            mixer = replace(mixer, params={**mixer.params, "scale": config.attention_multiplier})
    elif config.family == "jamba":
        if scan not in (None, "recurrent"):
            raise SpecError(f"Jamba's Mamba layers are Mamba-1, which has only the recurrent scan, not scan={scan!r}")
        mixer = jamba_mamba_layer(config.mamba1(), batch=batch, seq_len=seq_len, phase=phase, bits=bits)
    else:
        form = chunk_padding_free_form(scan, phase, seq_len, config.mamba_chunk_size,
                                       "the feed-forward block would then count the padded rows too")
        mixer = mamba2_layer(config.mamba2(), batch=batch, seq_len=seq_len, phase=phase, bits=bits,  # type: ignore[arg-type]
                             state_io=True, scan=form)  # type: ignore[arg-type]
    mixer = _scaled_residual(mixer, config.residual_multiplier)
    chunk = mixer.size("Q") if "Q" in mixer.ranks else None
    if layer_type.endswith("-moe"):
        ffn = moe_layer(config.moe(), batch=batch, seq_len=seq_len, phase=phase, bits=bits, chunk_size=chunk)
    else:
        ffn = _scaled_residual(mlp_layer(config.mlp(), batch=batch, seq_len=seq_len, phase=phase,  # type: ignore[arg-type]
                                         bits=bits, chunk_size=chunk), config.residual_multiplier)
    return chain_cascades(mixer, ffn, prefix=MLP_PREFIX, name=name or f"{config.family}-{layer_type}-{phase}")


__all__ = ["MOE_FAMILIES", "MOE_LAYER_TYPES", "MOE_PRESETS", "MOE_PUBLISHED_PARAMETERS_B", "MoEHybridConfig", "jamba_mamba_layer", "moe_family_layer",
           "parse_moe_hybrid_config"]


#: Presets. ``jamba-v0.1`` (ai21labs/Jamba-v0.1): transformers 5.25's ``JambaConfig`` defaults,
#: which its docstring says give that model (32 layers, hidden 4096, attention every 8th layer
#: from 4, MoE every 2nd from 1 with 16 experts, top-2, of 14336; 32 heads, 8 KV heads; Mamba
#: d_state 16, expand 2, dt_rank 256; vocabulary 65536, untied). Its model card: 52B total
#: parameters, 12B active. ``granite-4.0-h-tiny`` (ibm-granite/granite-4.0-h-tiny): hidden 1536,
#: 40 layers with attention at 5, 15, 25, 35, 12 heads, 4 KV heads, 64 experts of 512, top-6,
#: shared MLP 1024, Mamba-2 48 heads of 64, d_state 128, 1 group, chunk 256, vocabulary 100352,
#: tied embeddings -- as its config.json is quoted (verbatim, the quoting file says) in a public
#: test file found by the code search; no rotary embedding (NoPE, stated on the model's
#: description pages); the model card publishes 7B parameters, 1B active. Its multipliers are
#: left at 1: they change values, not the work, apart from one multiply per residual element.
MOE_PRESETS: dict[str, MoEHybridConfig] = {
    "jamba-v0.1": MoEHybridConfig(
        family="jamba", d_model=4096,
        layer_types=tuple(("attention" if i % 8 == 4 else "mamba") + ("-moe" if i % 2 == 1 else "")
                          for i in range(32)),  # type: ignore[misc]
        d_ff=14336, n_experts=16, top_k=2, n_heads=32, n_kv_heads=8, mamba_d_state=16, vocab_size=65536,
        tie_embeddings=False, norm_eps=1e-6),
    "granite-4.0-h-tiny": MoEHybridConfig(
        family="granitemoehybrid", d_model=1536,
        layer_types=tuple(("attention" if i in (5, 15, 25, 35) else "mamba") + "-moe" for i in range(40)),  # type: ignore[misc]
        d_ff=512, n_experts=64, top_k=6, shared_d_ff=1024, n_heads=12, n_kv_heads=4, mamba_d_state=128,
        mamba_heads=48, mamba_headdim=64, vocab_size=100352, tie_embeddings=True, norm_eps=1e-5),
}
#: Published totals (billions) and active parameters, from the model cards quoted above.
MOE_PUBLISHED_PARAMETERS_B: dict[str, tuple[float, float]] = {"jamba-v0.1": (52.0, 12.0),
                                                              "granite-4.0-h-tiny": (7.0, 1.0)}
