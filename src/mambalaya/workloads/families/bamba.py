"""Hybrid models: Mamba-2 layers interleaved with attention layers, each followed by a gated
MLP, as transformers' Bamba family runs them (``BambaDecoderLayer``).

A layer is ``x + mixer(input_layernorm(x))`` then ``h + mlp(pre_ff_layernorm(h))``; the mixer
is Mamba-2 (``BambaMixer``: :mod:`~mambalaya.workloads.blocks.mamba2`, identical in its operations)
or grouped-query attention with a partial rotary embedding (``BambaAttention``:
:mod:`~mambalaya.workloads.blocks.attention`). :func:`hybrid_layer` builds a layer of either type as
one cascade (:func:`~mambalaya.einsum.compose.chain_cascades`: the mixer block, then the MLP
block with its tensors prefixed ``FF_``), so fusion may cross from the mixer into the MLP.

A transformers Bamba ``config.json`` is read as transformers' ``BambaConfig`` reads it
(:func:`bamba_config_from_hf`): the layer pattern from ``attn_layer_indices`` with
``num_hidden_layers``, the rotary embedding from ``rope_parameters`` (theta and the rotated
fraction of each head), an explicit ``head_dim``, and every other field either read, checked to
be one mambalaya models, or listed as unable to change a layer
(:data:`~mambalaya.workloads.hf.fields.BAMBA_FIELDS`).
:func:`~mambalaya.workloads.families.dense.hybrid_config_from_hf` reads the config.json of any
hybrid family, dispatching on its ``model_type`` to that family's reader.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, BeforeValidator, Field, PositiveInt, model_validator

from mambalaya.errors import SpecError
from mambalaya.specio import SPEC_MODEL_CONFIG, list_as_tuple
from mambalaya.workloads.checks import chunk_padding_free_form, validated_config
from mambalaya.workloads.hf.config import ConfigFile
from mambalaya.workloads.hf.fields import (
    BAMBA_DEFAULT_THETA,
    BAMBA_DEFAULTS,
    BAMBA_FIELDS,
    BAMBA_FORCED_ROTARY_FRACTION,
    ROPE_KEYS,
    TRANSFORMERS_VERSION,
    shown,
)
from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.compose import chain_cascades
from mambalaya.einsum.ir import Role
from mambalaya.workloads.blocks.attention import KEY_BLOCK, AttentionConfig, Softmax, attention_layer
from mambalaya.workloads.blocks.mamba2 import Mamba2Config, mamba2_layer
from mambalaya.workloads.blocks.mlp import MLPConfig, mlp_layer

LayerType = Literal["mamba", "attention"]
LAYER_TYPES: tuple[str, ...] = ("mamba", "attention")
#: The prefix of the MLP block's tensors inside a layer's cascade.
MLP_PREFIX = "FF_"



class HybridConfig(BaseModel):
    """A Bamba-family model: transformers' ``BambaConfig`` fields under mambalaya's names. A
    field with a default takes BambaConfig's default; the others are required. Strict
    (:data:`~mambalaya.specio.SPEC_MODEL_CONFIG`): integers are integers, booleans booleans,
    numbers finite."""

    model_config = SPEC_MODEL_CONFIG

    family: Literal["bamba"] = "bamba"
    d_model: PositiveInt
    layer_types: Annotated[tuple[LayerType, ...], BeforeValidator(list_as_tuple)] = Field(min_length=1)
    d_ff: PositiveInt
    n_heads: PositiveInt
    n_kv_heads: PositiveInt
    head_dim: PositiveInt | None = None
    rope_theta: float = Field(10000.0, gt=0)
    partial_rotary_factor: float = Field(0.5, ge=0, le=1)
    mamba_heads: PositiveInt
    mamba_headdim: PositiveInt
    mamba_d_state: PositiveInt
    mamba_ngroups: PositiveInt = 1
    mamba_expand: PositiveInt = 2
    mamba_d_conv: PositiveInt = 4
    mamba_chunk_size: PositiveInt = 256
    vocab_size: PositiveInt
    tie_embeddings: bool = False
    norm_eps: float = Field(1e-5, gt=0)

    @model_validator(mode="after")
    def _blocks_fit(self) -> "HybridConfig":
        if self.mamba_heads * self.mamba_headdim != self.mamba_expand * self.d_model:
            raise ValueError(
                f"mamba_heads * mamba_headdim = {self.mamba_heads * self.mamba_headdim} is not "
                f"mamba_expand * d_model = {self.mamba_expand * self.d_model}"
            )
        self.attention()  # the attention and Mamba-2 blocks' own checks
        self.mamba2()
        return self

    @property
    def n_layers(self) -> int:
        return len(self.layer_types)

    def layer_counts(self) -> dict[str, int]:
        counts = Counter(self.layer_types)
        return {t: counts[t] for t in LAYER_TYPES if counts[t]}

    def attention(self) -> AttentionConfig:
        return AttentionConfig(d_model=self.d_model, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads,
                               head_dim=self.head_dim, rope_theta=self.rope_theta,
                               partial_rotary_factor=self.partial_rotary_factor, norm_eps=self.norm_eps)

    def mamba2(self) -> Mamba2Config:
        return Mamba2Config(d_model=self.d_model, n_layers=max(1, self.layer_counts().get("mamba", 0)),
                            d_state=self.mamba_d_state, headdim=self.mamba_headdim, ngroups=self.mamba_ngroups,
                            expand=self.mamba_expand, d_conv=self.mamba_d_conv, chunk_size=self.mamba_chunk_size,
                            vocab_size=self.vocab_size, norm_eps=self.norm_eps)

    def mlp(self) -> MLPConfig:
        return MLPConfig(d_model=self.d_model, d_ff=self.d_ff, norm_eps=self.norm_eps)

    def layer_parameters(self, layer_type: str) -> int:
        """Weight elements of one layer of ``layer_type``: its mixer block (with the input norm)
        and its MLP block (with the pre-feed-forward norm)."""
        mixer = self.attention().layer_parameters() if layer_type == "attention" else self.mamba2().layer_parameters()
        return mixer + self.mlp().layer_parameters()

    def model_parameters(self) -> int:
        """Embedding (and the LM head unless tied) + every layer + the final norm."""
        embed = self.vocab_size * self.d_model * (1 if self.tie_embeddings else 2)
        return embed + sum(n * self.layer_parameters(t) for t, n in self.layer_counts().items()) + self.d_model


def parse_hybrid_config(data: dict, *, source: str = "model config") -> HybridConfig:
    return validated_config(HybridConfig, data, what="hybrid (Bamba)", source=source)


_LAYER_NAMES = {"mamba": "mamba", "linear_attention": "mamba", "attention": "attention", "full_attention": "attention"}


def layer_types_from_hf(data: dict | ConfigFile, *, source: str = "config.json") -> tuple[str, ...]:
    """The layer pattern of a Bamba config as transformers builds it: ``attn_layer_indices``
    over ``num_hidden_layers`` (BambaConfig's ``layers_block_type`` is a property of those two,
    and a ``layers_block_type`` or ``layer_types`` in the file cannot set it). Such a list in the
    file must therefore say the same, or the config is refused: it would mean another model than
    the one transformers builds."""
    cfg = data if isinstance(data, ConfigFile) else ConfigFile.of(data, source, defaults=BAMBA_DEFAULTS, what="Bamba")
    n = cfg.layer_count("num_hidden_layers")
    indices = cfg.integers("attn_layer_indices")
    outside = [i for i in indices if not 0 <= i < n]
    if outside:
        raise cfg.error(f"field attn_layer_indices names layer {outside[0]}, outside 0..{n - 1}")
    attention = set(indices)
    types = tuple("attention" if i in attention else "mamba" for i in range(n))
    for key in ("layers_block_type", "layer_types"):
        said = cfg.layer_types(key, _LAYER_NAMES, "the Bamba family")
        if said is None or said == types:
            continue
        where = next((k for k in range(max(len(said), len(types)))
                      if k >= len(said) or k >= len(types) or said[k] != types[k]), 0)
        raise cfg.error(
            f"field {key} lists {len(said)} layers and makes layer {where} "
            f"{said[where] if where < len(said) else 'absent'}, but transformers {TRANSFORMERS_VERSION} builds a "
            f"Bamba model's layers from num_hidden_layers = {n} and attn_layer_indices = {sorted(attention)} (layer "
            f"{where} {types[where] if where < len(types) else 'absent'}) and cannot set {key}; make the two agree")
    return types


def rope_from_hf(data: dict | ConfigFile, *, source: str = "config.json") -> tuple[float, float]:
    """``(rope_theta, partial_rotary_factor)`` as transformers' BambaConfig reads them:
    ``rope_scaling`` (the older name) replaces ``rope_parameters``; its ``rope_theta`` wins over
    a top-level one, which wins over the default 10000; its ``partial_rotary_factor`` wins over
    BambaConfig's forced 0.5, and a top-level ``partial_rotary_factor`` is replaced by that 0.5, so
    one that says otherwise is refused. Only the ``default`` rope type is modelled."""
    cfg = data if isinstance(data, ConfigFile) else ConfigFile.of(data, source, what="Bamba")
    key = "rope_scaling" if cfg.value("rope_scaling") else "rope_parameters"
    rope = cfg.section(key)
    for name in rope.data:
        if name not in ROPE_KEYS:
            raise cfg.error(
                f"field {key}.{name} is not read by the default rotary embedding mambalaya models (it reads "
                f"{', '.join(ROPE_KEYS)}); a nested rope_parameters per layer type or another rope type's "
                "parameters are not modelled")
    type_key = "rope_type" if rope.has("rope_type") else "type"
    rope_type = rope.text(type_key) if rope.has(type_key) else "default"
    if rope_type != "default":
        raise cfg.error(f"field {key}.rope_type is {rope_type!r}; mambalaya models the 'default' rotary embedding "
                        "only (no frequency scaling)")
    theta = rope.positive_number("rope_theta") if rope.has("rope_theta") else \
        cfg.positive_number("rope_theta") if cfg.has("rope_theta") else BAMBA_DEFAULT_THETA
    fraction = rope.number("partial_rotary_factor", above=0, maximum=1) if rope.has("partial_rotary_factor") \
        else BAMBA_FORCED_ROTARY_FRACTION
    if cfg.given("partial_rotary_factor") and cfg.number("partial_rotary_factor") != fraction:
        raise cfg.error(
            f"field partial_rotary_factor is {shown(cfg.value('partial_rotary_factor'))}, but transformers "
            f"{TRANSFORMERS_VERSION}'s BambaConfig replaces a top-level value by {BAMBA_FORCED_ROTARY_FRACTION} and "
            f"rotates the fraction {key}.partial_rotary_factor = {fraction!r} of each head; put the fraction you mean "
            f"in {key}.partial_rotary_factor")
    return theta, fraction


def bamba_config_from_hf(data: dict, *, source: str = "config.json") -> HybridConfig:
    """A :class:`HybridConfig` from a transformers Bamba ``config.json`` (as a dict), read as
    transformers' BambaConfig reads it: an omitted field takes BambaConfig's default, and every
    field is read, checked to be one mambalaya models, or one that cannot change a layer
    (:data:`~mambalaya.workloads.hf.fields.BAMBA_FIELDS`). Every field is read by type
    (:class:`~mambalaya.workloads.hf.config.ConfigFile`); every problem is one SpecError naming
    the config.json field. (:func:`~mambalaya.workloads.families.dense.hybrid_config_from_hf`
    reads a config.json of any hybrid family, this one's included.)"""
    cfg = ConfigFile.of(data, source, defaults=BAMBA_DEFAULTS, what="Bamba")
    if cfg.value("model_type") not in (None, "bamba"):
        raise cfg.error(f"field model_type is {shown(cfg.value('model_type'))}; the Bamba reader reads 'bamba' configs "
                        "(hybrid_config_from_hf reads every hybrid family's)")
    problem = BAMBA_FIELDS.problem(cfg.data)
    if problem:
        raise cfg.error(problem)
    hidden = cfg.integer("hidden_size")
    heads = cfg.integer("num_attention_heads")
    kv_heads = cfg.integer_or("num_key_value_heads", heads)
    if cfg.has("head_dim"):
        head_dim: int | None = cfg.integer("head_dim")
    elif hidden % heads:
        raise cfg.error(f"field num_attention_heads = {heads} does not divide hidden_size = {hidden}")
    else:
        head_dim = None
    if heads % kv_heads:
        raise cfg.error(f"field num_key_value_heads = {kv_heads} does not divide num_attention_heads = {heads}")
    expand = cfg.integer("mamba_expand")
    mamba_heads = cfg.integer("mamba_n_heads")
    if (expand * hidden) % mamba_heads:
        raise cfg.error(f"field mamba_n_heads = {mamba_heads} does not divide mamba_expand * hidden_size = "
                        f"{expand * hidden}")
    d_head = cfg.integer_or_auto("mamba_d_head")
    if d_head is None:
        d_head = expand * hidden // mamba_heads
    elif d_head * mamba_heads != expand * hidden:
        raise cfg.error(f"fields mamba_n_heads * mamba_d_head = {mamba_heads * d_head} is not mamba_expand * "
                        f"hidden_size = {expand * hidden}")
    theta, fraction = rope_from_hf(cfg)
    fields: dict[str, Any] = {
        "d_model": hidden,
        "layer_types": layer_types_from_hf(cfg),
        "d_ff": cfg.integer("intermediate_size"),
        "n_heads": heads,
        "n_kv_heads": kv_heads,
        "head_dim": head_dim,
        "rope_theta": theta,
        "partial_rotary_factor": fraction,
        "mamba_heads": mamba_heads,
        "mamba_headdim": d_head,
        "mamba_d_state": cfg.integer("mamba_d_state"),
        "mamba_ngroups": cfg.integer("mamba_n_groups"),
        "mamba_expand": expand,
        "mamba_d_conv": cfg.integer("mamba_d_conv"),
        "mamba_chunk_size": cfg.integer("mamba_chunk_size"),
        "vocab_size": cfg.integer("vocab_size"),
        "tie_embeddings": cfg.boolean("tie_word_embeddings"),
        "norm_eps": cfg.positive_number("rms_norm_eps"),
    }
    return parse_hybrid_config(fields, source=source)


#: Bamba-9B (ibm-fms/Bamba-9B, also ibm-ai-platform/Bamba-9B). Published on its model card:
#: 9.78B parameters, 32 layers, hidden 4096, 32 attention heads, 8 KV heads (GQA), untied
#: embeddings. Its config.json: attn_layer_indices [9, 18, 27], mamba_d_state 128. The other
#: fields are transformers' BambaConfig defaults, which the released config keeps:
#: intermediate_size 14336, mamba_n_heads 128 (head dim 64), mamba_expand 2, mamba_n_groups 1,
#: mamba_d_conv 4, mamba_chunk_size 256, vocab_size 128000. With these the parameter count is
#: 9,778,138,240, the published 9.78B (tests/test_hybrid_layers.py).
PRESETS: dict[str, HybridConfig] = {
    "bamba-9b": HybridConfig(
        d_model=4096,
        layer_types=tuple("attention" if i in (9, 18, 27) else "mamba" for i in range(32)),
        d_ff=14336, n_heads=32, n_kv_heads=8, mamba_heads=128, mamba_headdim=64, mamba_d_state=128,
        vocab_size=128000, tie_embeddings=False,
    ),
}

#: Whole-model parameter counts as published (billions): the Bamba-9B model card's "9B (9.78B)".
PUBLISHED_PARAMETERS_B: dict[str, float] = {"bamba-9b": 9.78}


def hybrid_layer(
    config: HybridConfig,
    layer_type: str,
    *,
    batch: int,
    seq_len: int | None = None,
    phase: str = "prefill",
    bits: int = 16,
    scan: str | None = None,
    softmax: Softmax = "three-pass",
    name: str | None = None,
    state: Mapping[str, Any] | None = None,
    key_block: int = KEY_BLOCK,
) -> Cascade:
    """One layer of ``layer_type`` (``mamba`` or ``attention``) as one cascade: the mixer block
    then the MLP block (tensors prefixed ``FF_``). A Mamba layer's prefill uses ``scan``
    (default chunked) and carries its state out (``state_io``, as a generating model must); an
    attention layer writes its KV cache; ``softmax`` is its form (``three-pass``, ``online``, or
    ``blocked`` over blocks of ``key_block`` keys: :func:`~mambalaya.workloads.blocks.attention.attention_layer`).

    ``seq_len`` is the prompt length in prefill. In decode it is the number of cached positions
    before the new one, which only an attention layer needs: a Mamba layer's step does not
    depend on it, and an attention layer's can take it from ``state``, the KV cache it will read
    (``VC0``, ``[B, M, G, E]``). Given both, they must agree."""
    if layer_type not in LAYER_TYPES:
        raise SpecError(f"layer type {layer_type!r} is not one of {', '.join(LAYER_TYPES)}")
    seq_len = layer_length(layer_type, phase, seq_len, state)
    if layer_type == "attention":
        mixer = attention_layer(config.attention(), batch=batch, seq_len=seq_len, phase=phase,  # type: ignore[arg-type]
                                bits=bits, softmax=softmax, key_block=key_block)
    else:
        form = chunk_padding_free_form(scan, phase, seq_len, config.mamba_chunk_size, "a hybrid layer's MLP would "
                                       "then count the padded rows too (the real model drops them before its MLP)")
        mixer = mamba2_layer(config.mamba2(), batch=batch, seq_len=seq_len, phase=phase, bits=bits,  # type: ignore[arg-type]
                             state_io=True, scan=form)  # type: ignore[arg-type]
    chunk = mixer.size("Q") if "Q" in mixer.ranks else None  # the chunked scan writes [B,C,Q,D]
    mlp = mlp_layer(config.mlp(), batch=batch, seq_len=seq_len, phase=phase, bits=bits,  # type: ignore[arg-type]
                    chunk_size=chunk)
    return chain_cascades(mixer, mlp, prefix=MLP_PREFIX, name=name or f"{config.family}-{layer_type}-{phase}")


def layer_length(layer_type: str, phase: str, seq_len: int | None, state: Mapping[str, Any] | None) -> int:
    """The ``seq_len`` a layer cascade is built with (see :func:`hybrid_layer`)."""
    if phase != "decode":
        if seq_len is None:
            raise SpecError("a prefill layer needs seq_len, the prompt length")
        return seq_len
    if layer_type == "mamba":
        return 1 if seq_len is None else seq_len  # a Mamba step reads its state, whatever came before
    cached = None
    if state is not None:
        if "VC0" not in state:
            raise SpecError("the state of an attention layer's decode step is its KV cache (KC0A, KC0B, VC0); "
                            f"the state given has {', '.join(sorted(state)) or 'nothing'}")
        cached = int(np.shape(state["VC0"])[1])
    if seq_len is None and cached is None:
        raise SpecError("an attention layer's decode step reads a KV cache: give the cache (state=...) or its length "
                        "(seq_len=, the cached positions before the new one)")
    if seq_len is not None and cached is not None and seq_len != cached:
        raise SpecError(f"seq_len={seq_len} but the KV cache given holds {cached} positions; a decode step reads "
                        "the whole cache, so leave seq_len out")
    return cached if cached is not None else seq_len  # type: ignore[return-value]


def _is_decode(cascade: Cascade) -> bool:
    """Whether a layer cascade is a decode step: it reads a KV cache (rank ``M``), or its mixer
    block was built for decode (the builders' descriptions start "<block>, decode, ..."). A
    Mamba step and a one-token prefill are the same cascade otherwise."""
    return "M" in cascade.ranks or cascade.description.split(";")[0].split(",")[1:2] == [" decode"]


def hybrid_inputs(cascade: Cascade, config: HybridConfig, *, state: Mapping[str, Any] | None = None
                  ) -> dict[str, np.ndarray]:
    """Every input a hybrid layer's cascade reads besides ``X`` and the weights: its constants
    (the rotary tables at the cascade's own positions and the causal mask of attention, the
    chunked scan's in-chunk mask) and its incoming state.

    ``state`` is what the previous step left (the arrays of :func:`~mambalaya.execute.carry_states`
    for a Mamba layer, of :func:`~mambalaya.workloads.blocks.attention.append_kv` for an attention
    layer): it must hold exactly the cascade's incoming state tensors, each of its shape. With
    no state, a prefill starts from zero SSM and conv states (as transformers starts one with a
    fresh cache); a decode step has no such start, so it needs the state."""
    from mambalaya.workloads.blocks.attention import attention_constants
    from mambalaya.workloads.blocks.mamba2 import mamba2_constants

    attention = "T" in cascade.ranks or "TB" in cascade.ranks
    out = attention_constants(cascade, config) if attention else mamba2_constants(cascade)
    return {**out, **incoming_state(cascade, state, decode=_is_decode(cascade))}


def incoming_state(cascade: Cascade, state: Mapping[str, Any] | None, *, decode: bool) -> dict[str, np.ndarray]:
    """The cascade's incoming state tensors: ``state``, which must hold exactly them, each of its
    shape; without it, zeros for a prefill (a fresh cache) and an error for a decode step."""
    incoming = [t for t in cascade.external_tensors() if cascade.tensors[t].role == Role.STATE]
    if state is None:
        if decode:
            raise SpecError(f"cascade {cascade.name} is a decode step: it continues from the state its prefill left "
                            f"({', '.join(incoming)}); pass state=")
        return {t: np.zeros(cascade.shape(t)) for t in incoming}
    missing = [t for t in incoming if t not in state]
    extra = [t for t in state if t not in incoming]
    if missing or extra:
        raise SpecError(f"cascade {cascade.name} reads the incoming state {', '.join(incoming) or 'nothing'}; the state "
                        f"given lacks {', '.join(missing) or 'nothing'} and has extra {', '.join(extra) or 'nothing'}")
    out = {}
    for t in incoming:
        if tuple(np.shape(state[t])) != cascade.shape(t):
            raise SpecError(f"state tensor {t} has shape {tuple(np.shape(state[t]))}; cascade {cascade.name} reads it "
                            f"as {cascade.shape(t)} ({', '.join(cascade.tensors[t].ranks)})")
        out[t] = np.asarray(state[t])
    return out


def hybrid_weights(mixer: dict[str, np.ndarray], mlp: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A layer cascade's weights from its mixer block's and MLP block's (each in its own
    block's names): the MLP's get the ``FF_`` prefix."""
    return {**mixer, **{MLP_PREFIX + k: v for k, v in mlp.items()}}


__all__ = ["layer_length", 
    "LAYER_TYPES",
    "MLP_PREFIX",
    "PRESETS",
    "PUBLISHED_PARAMETERS_B",
    "HybridConfig",
    "bamba_config_from_hf",
    "hybrid_inputs",
    "hybrid_layer",
    "hybrid_weights",
    "layer_types_from_hf",
    "parse_hybrid_config",
    "rope_from_hf",
]
