"""Hybrid models: Mamba-2 layers interleaved with attention layers, each followed by a gated
MLP, as transformers' Bamba family runs them (``BambaDecoderLayer``).

A layer is ``x + mixer(input_layernorm(x))`` then ``h + mlp(pre_ff_layernorm(h))``; the mixer
is Mamba-2 (``BambaMixer``: :mod:`~mambalaya.workloads.mamba2`, identical in its operations)
or grouped-query attention with a partial rotary embedding (``BambaAttention``:
:mod:`~mambalaya.workloads.attention`). :func:`hybrid_layer` builds a layer of either type as
one cascade (:func:`~mambalaya.einsum.compose.chain_cascades`: the mixer block, then the MLP
block with its tensors prefixed ``FF_``), so fusion may cross from the mixer into the MLP.

The layer pattern comes from a transformers ``config.json``: ``layers_block_type`` (or
``layer_types``) per layer, or ``attn_layer_indices`` with ``num_hidden_layers``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

from mambalaya.errors import SpecError
from mambalaya.workloads.checks import validated_config
from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.compose import chain_cascades
from mambalaya.workloads.attention import AttentionConfig, Softmax, attention_layer
from mambalaya.workloads.mamba2 import Mamba2Config, mamba2_layer
from mambalaya.workloads.mlp import MLPConfig, mlp_layer

LayerType = Literal["mamba", "attention"]
LAYER_TYPES: tuple[str, ...] = ("mamba", "attention")
#: The prefix of the MLP block's tensors inside a layer's cascade.
MLP_PREFIX = "FF_"

#: transformers' spellings of the layer types (``layers_block_type`` / ``layer_types``).
_TYPE_NAMES = {"mamba": "mamba", "linear_attention": "mamba", "attention": "attention", "full_attention": "attention"}


class HybridConfig(BaseModel):
    """A Bamba-family model: transformers' ``BambaConfig`` fields under mambalaya's names."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    family: Literal["bamba"] = "bamba"
    d_model: PositiveInt
    layer_types: tuple[LayerType, ...] = Field(min_length=1)
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


#: transformers ``BambaConfig`` options that change what a layer computes, with the value
#: mambalaya models.
_MODELLED = {"hidden_act": "silu", "mamba_conv_bias": True, "mamba_proj_bias": False, "attention_bias": False,
             "mlp_bias": False}


def layer_types_from_hf(data: dict, *, source: str = "config.json") -> tuple[str, ...]:
    """The layer pattern of a transformers config: ``layers_block_type`` / ``layer_types`` (one
    entry per layer) or ``attn_layer_indices`` with ``num_hidden_layers``."""
    for key in ("layers_block_type", "layer_types"):
        if key in data and data[key] is not None:
            value = data[key]
            if not isinstance(value, list) or not value:
                raise SpecError(f"field {key} must be a non-empty list of layer types", source=source)
            types = []
            for n, name in enumerate(value):
                if not isinstance(name, str) or name not in _TYPE_NAMES:
                    raise SpecError(
                        f"field {key}[{n}] is {name!r}, not a layer type of the Bamba family (known: "
                        f"{', '.join(repr(k) for k in _TYPE_NAMES)})", source=source)
                types.append(_TYPE_NAMES[name])
            if "num_hidden_layers" in data and data["num_hidden_layers"] != len(types):
                raise SpecError(f"field {key} lists {len(types)} layers but num_hidden_layers is "
                                f"{data['num_hidden_layers']}", source=source)
            return tuple(types)
    n = data.get("num_hidden_layers")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise SpecError(f"field num_hidden_layers must be a positive integer, not {n!r}", source=source)
    indices = data.get("attn_layer_indices") or []
    if not isinstance(indices, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in indices):
        raise SpecError(f"field attn_layer_indices must be a list of layer indices, not {indices!r}", source=source)
    outside = [i for i in indices if not 0 <= i < n]
    if outside:
        raise SpecError(f"field attn_layer_indices names layer {outside[0]}, outside 0..{n - 1}", source=source)
    return tuple("attention" if i in indices else "mamba" for i in range(n))


def _hf_int(data: dict, key: str, source: str, default: Any = None) -> int:
    """A positive integer field of a config.json (its default when absent), or a SpecError."""
    value = data.get(key, default)
    if value is None:
        raise SpecError(f"field {key} is missing", source=source)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(f"field {key} must be a positive integer, not {value!r}", source=source)
    return value


def _hf_number(data: dict, key: str, source: str, default: float) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise SpecError(f"field {key} must be a positive number, not {value!r}", source=source)
    return float(value)


def hybrid_config_from_hf(data: dict, *, source: str = "config.json") -> HybridConfig:
    """A :class:`HybridConfig` from a transformers Bamba ``config.json`` (as a dict). Every
    problem is one SpecError naming the config.json field."""
    if data.get("model_type", "bamba") != "bamba":
        raise SpecError(f"field model_type is {data.get('model_type')!r}; the hybrid family modelled is 'bamba'",
                        source=source)
    for key, value in _MODELLED.items():
        if key in data and data[key] != value:
            raise SpecError(f"field {key} is {data[key]!r}; mambalaya models Bamba layers with {key} = {value!r}",
                            source=source)
    hidden = _hf_int(data, "hidden_size", source)
    heads = _hf_int(data, "num_attention_heads", source)
    kv_heads = _hf_int(data, "num_key_value_heads", source, heads)
    head_dim = data.get("head_dim")
    if head_dim is None and hidden % heads:
        raise SpecError(f"field num_attention_heads = {heads} does not divide hidden_size = {hidden}", source=source)
    if head_dim is not None:
        head_dim = _hf_int(data, "head_dim", source)
    if heads % kv_heads:
        raise SpecError(f"field num_key_value_heads = {kv_heads} does not divide num_attention_heads = {heads}",
                        source=source)
    expand = _hf_int(data, "mamba_expand", source, 2)
    mamba_heads = _hf_int(data, "mamba_n_heads", source)
    d_head = data.get("mamba_d_head", "auto")
    if d_head in (None, "auto"):
        if (expand * hidden) % mamba_heads:
            raise SpecError(f"field mamba_n_heads = {mamba_heads} does not divide mamba_expand * hidden_size = "
                            f"{expand * hidden}", source=source)
        d_head = expand * hidden // mamba_heads
    else:
        d_head = _hf_int(data, "mamba_d_head", source)
        if d_head * mamba_heads != expand * hidden:
            raise SpecError(f"fields mamba_n_heads * mamba_d_head = {mamba_heads * d_head} is not mamba_expand * "
                            f"hidden_size = {expand * hidden}", source=source)
    rope = data.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        raise SpecError(f"field rope_parameters must be a mapping, not {rope!r}", source=source)
    theta = rope.get("rope_theta", data.get("rope_theta", 10000.0))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        raise SpecError(f"field rope_parameters.rope_theta must be a positive number, not {theta!r}", source=source)
    tied = data.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise SpecError(f"field tie_word_embeddings must be true or false, not {tied!r}", source=source)
    fields: dict[str, Any] = {
        "d_model": hidden,
        "layer_types": layer_types_from_hf(data, source=source),
        "d_ff": _hf_int(data, "intermediate_size", source),
        "n_heads": heads,
        "n_kv_heads": kv_heads,
        "head_dim": head_dim,
        "rope_theta": float(theta),
        "partial_rotary_factor": 0.5,  # BambaConfig forces it
        "mamba_heads": mamba_heads,
        "mamba_headdim": d_head,
        "mamba_d_state": _hf_int(data, "mamba_d_state", source),
        "mamba_ngroups": _hf_int(data, "mamba_n_groups", source, 1),
        "mamba_expand": expand,
        "mamba_d_conv": _hf_int(data, "mamba_d_conv", source, 4),
        "mamba_chunk_size": _hf_int(data, "mamba_chunk_size", source, 256),
        "vocab_size": _hf_int(data, "vocab_size", source, 128000),
        "tie_embeddings": tied,
        "norm_eps": _hf_number(data, "rms_norm_eps", source, 1e-5),
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
    seq_len: int,
    phase: str = "prefill",
    bits: int = 16,
    scan: str | None = None,
    softmax: Softmax = "three-pass",
    name: str | None = None,
) -> Cascade:
    """One layer of ``layer_type`` (``mamba`` or ``attention``) as one cascade: the mixer block
    then the MLP block (tensors prefixed ``FF_``). A Mamba layer's prefill uses ``scan``
    (default chunked) and carries its state out (``state_io``, as a generating model must); an
    attention layer writes its KV cache. ``seq_len`` in decode is the number of cached
    positions before the new one."""
    if layer_type not in LAYER_TYPES:
        raise SpecError(f"layer type {layer_type!r} is not one of {', '.join(LAYER_TYPES)}")
    if layer_type == "attention":
        mixer = attention_layer(config.attention(), batch=batch, seq_len=seq_len, phase=phase,  # type: ignore[arg-type]
                                bits=bits, softmax=softmax)
    else:
        form = scan or ("chunked" if phase == "prefill" else "recurrent")
        if form == "chunked" and seq_len % config.mamba_chunk_size:
            raise SpecError(
                f"the chunked scan pads L = {seq_len} to a multiple of the chunk size {config.mamba_chunk_size}, and a "
                "hybrid layer's MLP would then count the padded rows too (the real model drops them before its MLP); "
                "use the recurrent scan (scan='recurrent', --scan recurrent) or a multiple of the chunk size")
        mixer = mamba2_layer(config.mamba2(), batch=batch, seq_len=seq_len, phase=phase, bits=bits,  # type: ignore[arg-type]
                             state_io=True, scan=form)  # type: ignore[arg-type]
    chunk = mixer.size("Q") if "Q" in mixer.ranks else None  # the chunked scan writes [B,C,Q,D]
    mlp = mlp_layer(config.mlp(), batch=batch, seq_len=seq_len, phase=phase, bits=bits,  # type: ignore[arg-type]
                    chunk_size=chunk)
    return chain_cascades(mixer, mlp, prefix=MLP_PREFIX, name=name or f"{config.family}-{layer_type}-{phase}")


def hybrid_weights(mixer: dict[str, np.ndarray], mlp: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A layer cascade's weights from its mixer block's and MLP block's (each in its own
    block's names): the MLP's get the ``FF_`` prefix."""
    return {**mixer, **{MLP_PREFIX + k: v for k, v in mlp.items()}}


__all__ = [
    "LAYER_TYPES",
    "MLP_PREFIX",
    "PRESETS",
    "PUBLISHED_PARAMETERS_B",
    "HybridConfig",
    "hybrid_config_from_hf",
    "hybrid_layer",
    "hybrid_weights",
    "layer_types_from_hf",
    "parse_hybrid_config",
]
