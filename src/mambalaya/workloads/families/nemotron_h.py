"""Nemotron-H (transformers' ``NemotronHConfig``): Mamba-2, attention, MLP and mixture-of-experts
layers as separate blocks, in the order of the config's layer pattern.

Every layer of Nemotron-H is one block: ``x + mixer(norm(x))`` (``NemotronHBlock``), and the
mixer is one of

* ``mamba`` (pattern ``M``, ``linear_attention``): ``NemotronHMamba2Mixer``, the Mamba-2 mixer
  of :mod:`~mambalaya.workloads.blocks.mamba2` operation for operation (conv with bias, the gated
  RMSNorm over each group's channels, ``norm_before_gate=False``);
* ``attention`` (``*``, ``full_attention``): ``NemotronHAttention``, grouped-query attention
  with **no** position embedding (its forward applies no rotary embedding) and no bias: the
  attention block of :mod:`~mambalaya.workloads.blocks.attention` with no rotated channels;
* ``mlp`` (``-``, ``mlp``): ``NemotronHMLP``, ``down_proj(relu(up_proj(x))^2)``, no gate and
  no bias (:func:`relu2_mlp_layer`);
* ``moe`` (``E``, ``moe``; NVIDIA Nemotron 3 Nano): ``NemotronHMoE``, the MoE block of
  :mod:`~mambalaya.workloads.blocks.moe` with its ``sigmoid-topk`` router (sigmoid scores, the
  choice on the scores plus ``e_score_correction_bias`` within the ``topk_group`` best of
  ``n_group`` groups, the weights normalised with ``norm_topk_prob`` and scaled by
  ``routed_scaling_factor``), ``relu2`` experts without a gate, optionally between the latent
  projections of ``moe_latent_size``, and the always-on ``relu2`` shared MLP of
  ``moe_shared_expert_intermediate_size`` (:meth:`NemotronHModel.moe_config`).

So a layer is one cascade and the fusion engine sees the block boundary of each type.

The Mamba width is its own field: ``mamba_num_heads * mamba_head_dim``
(``NemotronHMamba2Mixer.intermediate_size``), a multiple of the hidden size or not; ``expand``
is not read (the mixer's :attr:`~mambalaya.workloads.blocks.mamba2.Mamba2Config.d_ssm`).

A config.json is read as transformers 5.25 reads it (:func:`nemotron_h_config_from_hf`): the
layer pattern from ``layers_block_type`` (its alias ``layer_types``) or, when neither is given,
from the older ``hybrid_override_pattern`` string; the older field names ``mamba_n_groups``,
``mamba_d_conv``, ``mamba_chunk_size``, ... as ``NemotronHConfig.__post_init__`` renames them,
and ``num_local_experts`` as ``n_routed_experts`` (its ``attribute_map``; given both, it wins).
The MoE fields are read when the pattern has a MoE layer; without one they act nowhere, and only
their types are checked as transformers checks them.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

import numpy as np
from pydantic import BeforeValidator, Field, PositiveInt, model_validator

from mambalaya.einsum.cascade import Cascade, build_cascade
from mambalaya.einsum.ir import Rank, Role, TensorSpec
from mambalaya.einsum.parse import parse_einsum
from mambalaya.errors import SpecError
from mambalaya.specio import list_as_tuple
from mambalaya.workloads.blocks.attention import KEY_BLOCK, AttentionConfig, attention_layer
from mambalaya.workloads.blocks.moe import MoEConfig, Routing, moe_constants, moe_layer
from mambalaya.workloads.checks import check_layer_args, chunk_padding_free_form, validated_config
from mambalaya.workloads.families.base import FamilyModel
from mambalaya.workloads.hf.config import check_known_fields, MAX_LAYERS, ConfigFile, shown
from mambalaya.workloads.blocks.mamba2 import Mamba2Config, mamba2_layer

#: transformers' layer type names -> mambalaya's; pattern characters -> transformers' names.
HF_LAYER_TYPES = {"linear_attention": "mamba", "full_attention": "attention", "mlp": "mlp", "moe": "moe"}
PATTERN = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
#: The older layer type names every transformers 5.25 config renames in its layer list
#: (``configuration_utils._LEGACY_LAYER_TYPE_REMAP``: ``mamba`` -> ``linear_attention``,
#: ``attention`` -> ``full_attention``), as mambalaya's names.
LEGACY_LAYER_TYPES = {"mamba": "mamba", "attention": "attention"}

RELU2_EINSUMS: tuple[str, ...] = (
    "SS[b,i] = X[b,i,d]*X[b,i,d]",
    "RS[b,i] = rsqrt(SS[b,i]/D + eps)",
    "XN[b,i,d] = X[b,i,d]*RS[b,i]*WN[d]",
    "UP[b,i,f] = XN[b,i,d]*WU[d,f]",
    "RU[b,i,f] = relu(UP[b,i,f])",
    "HM[b,i,f] = RU[b,i,f]*RU[b,i,f]",
    "O[b,i,d] = HM[b,i,f]*WDN[f,d]",
    "XO[b,i,d] = X[b,i,d] + O[b,i,d]",
)
_RELU2_TENSORS = {
    "X": (("B", "I", "D"), Role.INPUT, "block input (residual stream)"),
    "WN": (("D",), Role.WEIGHT, "block RMSNorm weight"),
    "SS": (("B", "I"), Role.INTERMEDIATE, "sum of squares"),
    "RS": (("B", "I"), Role.INTERMEDIATE, "reciprocal RMS"),
    "XN": (("B", "I", "D"), Role.INTERMEDIATE, "normalised input"),
    "WU": (("D", "F"), Role.WEIGHT, "up_proj"),
    "UP": (("B", "I", "F"), Role.INTERMEDIATE, "up projection"),
    "RU": (("B", "I", "F"), Role.INTERMEDIATE, "relu(up)"),
    "HM": (("B", "I", "F"), Role.INTERMEDIATE, "relu(up)^2"),
    "WDN": (("F", "D"), Role.WEIGHT, "down_proj"),
    "O": (("B", "I", "D"), Role.INTERMEDIATE, "MLP output"),
    "XO": (("B", "I", "D"), Role.OUTPUT, "block output (residual stream)"),
}


def relu2_mlp_layer(d_model: int, d_ff: int, *, eps: float, batch: int, seq_len: int, phase: str = "prefill",
                    bits: int = 16, name: str | None = None) -> Cascade:
    """The squared-ReLU MLP block (RMSNorm, ``up_proj``, ``relu(.)^2``, ``down_proj``,
    residual) over ``seq_len`` positions (prefill) or one (decode); it keeps no state."""
    check_layer_args(phase, batch=batch, seq_len=seq_len, bits=bits)
    positions = 1 if phase == "decode" else seq_len
    ranks = [Rank("B", batch, "batch"), Rank("I", positions, "L" if phase == "prefill" else "1"),
             Rank("D", d_model, "hidden_size"), Rank("F", d_ff, "intermediate_size")]
    sizes = {r.name: r.size for r in ranks}
    return build_cascade(
        name=name or f"relu2-mlp-{phase}",
        params={"batch": batch, "L": positions, "hidden_size": d_model, "intermediate_size": d_ff, "eps": eps},
        ranks=ranks,
        tensors=[TensorSpec(t, rk, role, bits, description=d) for t, (rk, role, d) in _RELU2_TENSORS.items()],
        einsums=[parse_einsum(line, sizes=sizes) for line in RELU2_EINSUMS],
        description=f"squared-ReLU MLP block, {phase}, hidden {d_model}, intermediate {d_ff}, batch={batch}, "
                    f"I={positions}",
    )


class NemotronHModel(FamilyModel):
    """A Nemotron-H model: transformers' ``NemotronHConfig`` fields under mambalaya's names
    (``layer_types`` in mambalaya's names: ``mamba``, ``attention``, ``mlp``, ``moe``). The
    ``moe_`` fields (``NemotronHConfig``'s defaults) act only in ``moe`` layers: ``moe_experts``
    [n_routed_experts], ``moe_top_k`` [num_experts_per_tok], ``moe_d_ff``
    [moe_intermediate_size], ``moe_shared_d_ff`` [moe_shared_expert_intermediate_size],
    ``moe_latent_size``, ``moe_n_group`` [n_group], ``moe_topk_group`` [topk_group],
    ``moe_norm_topk_prob`` [norm_topk_prob], ``moe_routed_scaling_factor``
    [routed_scaling_factor]; ``routing`` is the cost model's token-per-expert assumption
    (:mod:`~mambalaya.workloads.blocks.moe`)."""

    LAYER_TYPES: ClassVar[tuple[str, ...]] = ("mamba", "attention", "mlp", "moe")
    SCANNED: ClassVar[tuple[str, ...]] = ("mamba",)

    family: Literal["nemotron_h"] = "nemotron_h"
    layer_types: Annotated[tuple[Literal["mamba", "attention", "mlp", "moe"], ...],
                           BeforeValidator(list_as_tuple)] = Field(min_length=1)
    d_ff: PositiveInt
    n_heads: PositiveInt
    n_kv_heads: PositiveInt
    head_dim: PositiveInt = 128
    mamba_heads: PositiveInt
    mamba_headdim: PositiveInt
    mamba_d_state: PositiveInt
    mamba_ngroups: PositiveInt = 8
    mamba_d_conv: PositiveInt = 4
    mamba_chunk_size: PositiveInt = 128
    norm_eps: float = Field(1e-5, gt=0)
    moe_experts: PositiveInt = 8
    moe_top_k: PositiveInt = 2
    moe_d_ff: PositiveInt = 7688
    moe_shared_d_ff: PositiveInt = 7688
    moe_latent_size: PositiveInt | None = None
    moe_n_group: PositiveInt = 1
    moe_topk_group: PositiveInt = 1
    moe_norm_topk_prob: bool = True
    moe_routed_scaling_factor: float = 1.0
    routing: Routing = "uniform"

    @model_validator(mode="after")
    def _blocks_fit(self) -> "NemotronHModel":
        if self.tie_embeddings:
            raise ValueError("tie_embeddings is true, but a Nemotron-H model's LM head is never tied to its "
                             "embeddings (transformers 5.25's NemotronHForCausalLM ties no weights, whatever "
                             "tie_word_embeddings says)")
        self.attention_config()
        self.mamba2()
        if "moe" in self.layer_types:
            self.moe_config()
        return self

    @property
    def d_state(self) -> int:
        return self.mamba_d_state

    @property
    def d_ssm(self) -> int:
        """The Mamba width, ``mamba_heads * mamba_headdim``."""
        return self.mamba_heads * self.mamba_headdim

    @property
    def expand(self) -> int | float:
        """The Mamba width over the hidden size, ``d_ssm / d_model`` (whole or not)."""
        ratio = self.d_ssm / self.d_model
        return int(ratio) if ratio.is_integer() else ratio

    @property
    def d_conv(self) -> int:
        return self.mamba_d_conv

    @property
    def n_experts(self) -> int:
        """The routed experts of the ``moe`` layers; 0 without one (nothing to route)."""
        return self.moe_experts if "moe" in self.layer_types else 0

    @property
    def top_k(self) -> int:
        return self.moe_top_k

    def attention_config(self) -> AttentionConfig:
        return AttentionConfig(d_model=self.d_model, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads,
                               head_dim=self.head_dim, partial_rotary_factor=0.0, norm_eps=self.norm_eps)

    def mamba2(self) -> Mamba2Config:
        whole = self.d_ssm // self.d_model if self.d_ssm % self.d_model == 0 else 1
        return Mamba2Config(d_model=self.d_model, n_layers=max(1, self.layer_types.count("mamba")),
                                    d_state=self.mamba_d_state, headdim=self.mamba_headdim,
                                    ngroups=self.mamba_ngroups, expand=whole, d_ssm=self.d_ssm,
                                    d_conv=self.mamba_d_conv, chunk_size=self.mamba_chunk_size,
                                    vocab_size=self.vocab_size, norm_eps=self.norm_eps,
                                    tie_embeddings=self.tie_embeddings)

    def moe_config(self) -> MoEConfig:
        """The block of a ``moe`` layer (``NemotronHMoE``): the sigmoid router, ``relu2`` experts
        and shared MLP, the latent projections when ``moe_latent_size`` is set."""
        return MoEConfig(d_model=self.d_model, d_ff=self.moe_d_ff, n_experts=self.moe_experts, top_k=self.moe_top_k,
                         router="sigmoid-topk", expert_mlp="relu2", shared_d_ff=self.moe_shared_d_ff,
                         norm_eps=self.norm_eps, routing=self.routing, n_group=self.moe_n_group,
                         topk_group=self.moe_topk_group, norm_topk_prob=self.moe_norm_topk_prob,
                         routed_scaling_factor=self.moe_routed_scaling_factor, latent_size=self.moe_latent_size)

    def layer_parameters(self, layer_type: str, *, active: bool = False) -> int:
        """One layer's weight elements (``active``: those one token uses, ``moe_top_k`` of a MoE
        layer's experts)."""
        if layer_type == "mamba":
            return self.mamba2().layer_parameters()
        if layer_type == "attention":
            return self.attention_config().layer_parameters()
        if layer_type == "moe":
            moe = self.moe_config()
            return moe.active_parameters() if active else moe.layer_parameters()
        return self.d_model + 2 * self.d_model * self.d_ff  # norm, up_proj, down_proj

    def active_parameters(self) -> int:
        """The weight elements one token's forward pass uses (every one but the experts a MoE
        layer's router does not pick)."""
        skipped = sum(n * (self.layer_parameters(t) - self.layer_parameters(t, active=True))
                      for t, n in self.layer_counts().items())
        return self.model_parameters() - skipped

    def constants(self, cascade: Cascade) -> dict[str, np.ndarray]:
        """The MoE router's group membership ``GM`` (:func:`~mambalaya.workloads.blocks.moe.moe_constants`)."""
        return {**super().constants(cascade), **moe_constants(cascade)}

    def shape_text(self) -> str:
        text = (f"{super().shape_text()}; attention heads={self.n_heads} kv={self.n_kv_heads} (no rotary); "
                f"relu2 mlp={self.d_ff}; mamba heads={self.mamba_heads} headdim={self.mamba_headdim} "
                f"groups={self.mamba_ngroups}")
        if "moe" not in self.layer_types:
            return text
        m = self.moe_config()
        groups = f", {m.topk_group} of {m.n_group} groups" if m.group_limited else ""
        latent = f", latent {m.latent_size}" if m.latent_size else ""
        return (f"{text}; moe {m.n_experts} experts of {m.d_ff}, top-{m.top_k} (sigmoid{groups}, scaled "
                f"{m.routed_scaling_factor:g}){latent}, shared mlp={m.shared_d_ff}; routing "
                f"{'uniform' if self.routing == 'uniform' else 'histogram'}")

    def layer(self, layer_type: str, *, batch: int, seq_len: int, phase: str = "prefill", bits: int = 16,
              scan: str | None = None, softmax: str = "three-pass", name: str | None = None,
              key_block: int = KEY_BLOCK) -> Cascade:
        name = name or f"nemotron_h-{layer_type}-{phase}"
        if layer_type == "mamba":
            form = chunk_padding_free_form(scan, phase, seq_len, self.mamba_chunk_size, "the gate, norm, output "
                                           "projection and residual would then count the padded rows too")
            return mamba2_layer(self.mamba2(), batch=batch, seq_len=seq_len, phase=phase, bits=bits,  # type: ignore[arg-type]
                                state_io=True, scan=form, name=name)  # type: ignore[arg-type]
        if layer_type == "attention":
            return attention_layer(self.attention_config(), batch=batch, seq_len=seq_len, phase=phase,  # type: ignore[arg-type]
                                   bits=bits, softmax=softmax, name=name, key_block=key_block)  # type: ignore[arg-type]
        if layer_type == "mlp":
            return relu2_mlp_layer(self.d_model, self.d_ff, eps=self.norm_eps, batch=batch, seq_len=seq_len,
                                   phase=phase, bits=bits, name=name)
        if layer_type == "moe":
            return moe_layer(self.moe_config(), batch=batch, seq_len=seq_len, phase=phase, bits=bits, name=name)
        raise SpecError(f"layer type {layer_type!r} is not one of Nemotron-H's ({', '.join(self.LAYER_TYPES)})")


# --------------------------------------------------------------------------------------------
# config.json
# --------------------------------------------------------------------------------------------

#: NemotronHConfig's defaults (transformers 5.25) for the fields read.
DEFAULTS: dict[str, Any] = {
    "vocab_size": 131072, "hidden_size": 4096, "tie_word_embeddings": False, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 21504, "mlp_hidden_act": "relu2",
    "ssm_state_size": 128, "mamba_num_heads": 128, "mamba_head_dim": 64, "mamba_hidden_act": "silu",
    "n_groups": 8, "conv_kernel": 4, "chunk_size": 128, "layer_norm_epsilon": 1e-5,
    "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 7688,
    "moe_shared_expert_intermediate_size": 7688, "moe_latent_size": None, "n_group": 1, "topk_group": 1,
    "norm_topk_prob": True, "routed_scaling_factor": 1.0,
}
#: The older names NemotronHConfig.__post_init__ renames.
ALIASES = {"mamba_n_groups": "n_groups", "mamba_d_conv": "conv_kernel", "mamba_chunk_size": "chunk_size",
           "mamba_conv_bias": "use_conv_bias", "mamba_dt_limit": "time_step_limit", "mamba_expand": "expand",
           "mamba_dt_min": "time_step_min", "mamba_dt_max": "time_step_max", "mamba_dt_init_floor": "time_step_floor"}
#: NemotronHConfig's ``attribute_map`` (alias -> field), transformers 5.25.
ATTRIBUTE_MAP = {"layer_types": "layers_block_type", "num_local_experts": "n_routed_experts"}
#: Fields with one value mambalaya models (the value it must have, and why).
MODELLED = {
    "use_conv_bias": (True, "the Mamba-2 block's depthwise conv has a bias"),
    "use_bias": (False, "the Mamba-2 projections have no bias"),
    "mamba_proj_bias": (False, "the Mamba-2 projections have no bias"),
    "mlp_bias": (False, "the MLP, shared-expert and latent projections have no bias"),
    "attention_bias": (False, "the attention projections have no bias"),
    "sliding_window": (None, "attention is over the whole context"),
    "num_nextn_predict_layers": (0, "multi-token-prediction layers are not modelled"),
}
#: The fields of the MoE block (``NemotronHMoE``): read when the pattern has a ``moe`` layer;
#: without one they act nowhere and, like the inert fields, only their types are checked.
MOE_FIELDS = {"n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "moe_shared_expert_intermediate_size",
              "moe_latent_size", "n_group", "topk_group", "norm_topk_prob", "routed_scaling_factor"}
#: Fields that cannot change what a layer computes (with the reason).
INERT = {
    "model_type", "architectures", "auto_map", "transformers_version", "torch_dtype", "dtype", "use_cache",
    "num_logits_to_keep", "pad_token_id", "bos_token_id", "eos_token_id", "max_position_embeddings",
    "attention_dropout", "hidden_dropout", "initializer_range", "rescale_prenorm_residual", "residual_in_fp32",
    "use_mamba_kernels", "mamba_ssm_cache_dtype", "time_step_min", "time_step_max", "time_step_floor",
    # expand: NemotronHMamba2Mixer's width is mamba_num_heads * mamba_head_dim, it never reads expand
    "expand",
    "num_hidden_layers", "hidden_act", "output_router_logits", "mtp_layers_block_type", "mtp_hybrid_override_pattern",
    # n_shared_experts: NemotronHMoE builds one shared MLP of moe_shared_expert_intermediate_size whatever it
    # says; moe_shared_expert_overlap: read by no module (a kernel scheduling hint); router_aux_loss_coef: a
    # training loss
    "n_shared_experts", "moe_shared_expert_overlap", "router_aux_loss_coef",
    # written by NVIDIA's remote-code configs (Nemotron 3 Nano's config.json), not NemotronHConfig 5.25 fields:
    # no module of modeling_nemotron_h reads them (its attention applies no rotary embedding; its norms read
    # layer_norm_epsilon)
    "norm_eps", "rope_theta", "partial_rotary_factor",
    "_name_or_path", "id2label", "label2id", "return_dict", "output_hidden_states", "output_attentions",
    "chunk_size_feed_forward", "is_encoder_decoder", "problem_type", "tokenizer_class", "attention_head_dim",
}
READ = set(DEFAULTS) | {"layers_block_type", "layer_types", "hybrid_override_pattern", "time_step_limit"}


def nemotron_layer_types(cfg: ConfigFile) -> tuple[str, ...]:
    """The layer pattern as NemotronHConfig 5.25 builds it: ``layers_block_type`` (its alias
    ``layer_types`` read as it, :meth:`ConfigFile.with_aliases`; the older names ``mamba`` and
    ``attention`` renamed), else ``hybrid_override_pattern``, else its default ``M E * -``."""
    if cfg.given("layers_block_type"):
        return cfg.layer_types("layers_block_type", {**HF_LAYER_TYPES, **LEGACY_LAYER_TYPES},  # type: ignore[return-value]
                               "Nemotron-H")
    if cfg.has("hybrid_override_pattern"):
        pattern = cfg.value("hybrid_override_pattern")
        if not isinstance(pattern, str) or not pattern or len(pattern) > MAX_LAYERS:
            raise cfg.error(f"field hybrid_override_pattern must be a string of 1 to {MAX_LAYERS:,} of M, *, - and E "
                            f"(one per layer), not {shown(pattern)}")
        bad = next((k for k, ch in enumerate(pattern) if ch not in PATTERN), None)
        if bad is not None:
            raise cfg.error(f"field hybrid_override_pattern[{bad}] is {pattern[bad]!r}, not one of M (Mamba-2), "
                            "* (attention), - (MLP), E (MoE)")
        return tuple(HF_LAYER_TYPES[PATTERN[ch]] for ch in pattern)
    return ("mamba", "moe", "attention", "mlp")  # NemotronHConfig's default


def _moe_fields(cfg: ConfigFile) -> dict[str, Any]:
    """The MoE block's fields, each by type, and what ``NemotronHTopkRouter`` needs of them
    (one error naming the fields)."""
    experts, top_k = cfg.integer("n_routed_experts"), cfg.integer("num_experts_per_tok")
    groups, kept = cfg.integer("n_group"), cfg.integer("topk_group")
    if experts % groups or experts // groups < 2:
        raise cfg.error(f"fields n_group = {groups} and n_routed_experts = {experts}: the router splits the experts "
                        "into n_group equal groups of at least two (it scores a group by its two best experts)")
    if kept > groups:
        raise cfg.error(f"field topk_group = {kept} exceeds n_group = {groups}: the router cannot keep more groups "
                        "than there are")
    if top_k > kept * (experts // groups):
        raise cfg.error(f"field num_experts_per_tok = {top_k} exceeds the {kept * (experts // groups)} experts of "
                        f"the topk_group = {kept} groups the router keeps: it would pick experts it masked out")
    return {"moe_experts": experts, "moe_top_k": top_k, "moe_d_ff": cfg.integer("moe_intermediate_size"),
            "moe_shared_d_ff": cfg.integer("moe_shared_expert_intermediate_size"),
            "moe_latent_size": cfg.integer_or("moe_latent_size", None), "moe_n_group": groups,
            "moe_topk_group": kept, "moe_norm_topk_prob": cfg.boolean("norm_topk_prob"),
            "moe_routed_scaling_factor": cfg.number("routed_scaling_factor")}


def nemotron_h_config_from_hf(data: dict, *, source: str = "config.json") -> NemotronHModel:
    """A :class:`NemotronHModel` from a transformers ``nemotron_h`` config.json (as a dict),
    read as ``NemotronHConfig`` reads it, every field by type
    (:class:`~mambalaya.workloads.hf.config.ConfigFile`); every problem is one SpecError naming
    the field."""
    cfg = ConfigFile.of(data, source, defaults=DEFAULTS, what="Nemotron-H")
    if cfg.value("model_type") != "nemotron_h":
        raise cfg.error(f"field model_type is {shown(cfg.value('model_type'))}; this reader takes 'nemotron_h'")
    experts_alias = {"num_local_experts": ATTRIBUTE_MAP["num_local_experts"]}
    cfg = cfg.with_aliases({**ALIASES, **{a: f for a, f in ATTRIBUTE_MAP.items() if a not in experts_alias}},
                           "NemotronHConfig")
    types = nemotron_layer_types(cfg)
    has_moe = "moe" in types
    if has_moe:
        cfg = cfg.with_aliases(experts_alias, "NemotronHConfig")
    else:  # transformers sets the alias without a type check, and no dense layer reads it
        cfg = ConfigFile({k: v for k, v in cfg.data.items() if k not in experts_alias}, source, DEFAULTS)
    check_known_fields(cfg, "NemotronHConfig", READ, INERT if has_moe else INERT | MOE_FIELDS, MODELLED)
    for key, value in (("mlp_hidden_act", "relu2"), ("mamba_hidden_act", "silu")):
        cfg.require(key, value, "the only activation modelled there")
    cfg.require_no_clamp("time_step_limit", nullable=False)
    hidden = cfg.integer("hidden_size")
    heads, head_dim = cfg.integer("mamba_num_heads"), cfg.integer("mamba_head_dim")
    groups = cfg.integer("n_groups")
    if heads % groups:
        raise cfg.error(f"field n_groups = {groups} does not divide mamba_num_heads = {heads}")
    n_heads = cfg.integer("num_attention_heads")
    kv = cfg.integer("num_key_value_heads")  # NemotronHConfig refuses a null here (a plain int field)
    if n_heads % kv:
        raise cfg.error(f"field num_key_value_heads = {kv} does not divide num_attention_heads = {n_heads}")
    fields = {
        "d_model": hidden, "layer_types": types, "d_ff": cfg.integer("intermediate_size"),
        "n_heads": n_heads, "n_kv_heads": kv, "head_dim": cfg.integer("head_dim"),
        "mamba_heads": heads, "mamba_headdim": head_dim,
        "mamba_d_state": cfg.integer("ssm_state_size"), "mamba_ngroups": groups,
        "mamba_d_conv": cfg.integer("conv_kernel"), "mamba_chunk_size": cfg.integer("chunk_size"),
        "norm_eps": cfg.positive_number("layer_norm_epsilon"), "vocab_size": cfg.integer("vocab_size"),
        # NemotronHForCausalLM ties nothing (transformers 5.25: its _tied_weights_keys is {}), so the LM
        # head is its own weight whatever tie_word_embeddings says (once read: a true left the head out
        # of the parameter count); the field is still read by type
        "tie_embeddings": cfg.boolean("tie_word_embeddings") and False, **(_moe_fields(cfg) if has_moe else {}),
    }
    return validated_config(NemotronHModel, fields, what="Nemotron-H", source=source)


#: Nemotron-H-8B (nvidia/Nemotron-H-8B-Base-8K). Its config.json: hidden 4096, 52 layers with
#: hybrid_override_pattern "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-" (24 Mamba-2,
#: 4 attention, 24 MLP), 32 attention heads, 8 KV heads, head dim 128, MLP 21504 (relu2), 128
#: Mamba heads of 64 channels, state 128, 8 groups, conv 4, chunk 128, vocab 131072, untied,
#: layer_norm_epsilon 1e-5 (the same sizes are NemotronHConfig's defaults, and Table 1 of the
#: Nemotron-H paper, arXiv 2504.03624, lists 52 layers: 24 Mamba-2, 4 attention, 24 FFN). The
#: model card names it an 8B model; counted from the module shapes: 8,100,852,736 parameters
#: (tests/test_dense_families.py checks it against transformers' modules on the meta device).
NEMOTRON_H_8B_PATTERN = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
PRESETS: dict[str, NemotronHModel] = {
    "nemotron-h-8b": NemotronHModel(
        d_model=4096, layer_types=tuple(HF_LAYER_TYPES[PATTERN[ch]] for ch in NEMOTRON_H_8B_PATTERN),  # type: ignore[arg-type]
        d_ff=21504, n_heads=32, n_kv_heads=8, head_dim=128, mamba_heads=128, mamba_headdim=64, mamba_d_state=128,
        mamba_ngroups=8, mamba_d_conv=4, mamba_chunk_size=128, vocab_size=131072, tie_embeddings=False,
    ),
}
#: Published whole-model parameter counts (billions): the model card's "8B".
PUBLISHED_PARAMETERS_B: dict[str, float] = {"nemotron-h-8b": 8.0}

__all__ = ["HF_LAYER_TYPES", "PRESETS", "PUBLISHED_PARAMETERS_B", "NemotronHModel",
           "nemotron_h_config_from_hf", "relu2_mlp_layer"]
