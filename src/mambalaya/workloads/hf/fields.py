"""What each field of a model config means to mambalaya: read, refused, or unable to change a layer.

A transformers ``config.json`` (or a state-spaces one) says more than a layer's shape. A field
mambalaya skipped would make the cascade compute something other than the model it names, and
no number it then printed would say so. So every config reader here first passes the whole
config through :meth:`ConfigFields.check`, which sorts each field into exactly one of:

* **read** -- the reader turns it into a field of mambalaya's config (the value says which);
* **refused** -- the value must be one mambalaya models (:class:`Supported`), else one error
  naming the field, its value and what is supported;
* **inert** -- it cannot change what a layer computes (tokenizer ids, initialiser settings,
  what ``forward`` returns, ...); the value says why.

A field in none of the three is refused too: it may come from another transformers version, in
which it might change a layer. The tables mirror the config classes of the transformers version
pinned in ``pyproject.toml`` (:data:`TRANSFORMERS_VERSION`); ``tests/test_config_fields.py``
walks every field of those classes (and every ``config.<name>`` their modeling code reads) and
checks that each is in exactly one table, that changing a read field changes the layer, and
that transformers' layers do not change with an inert one.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mambalaya.workloads.hf.field_types import field_type_problem

__all__ = [
    "BAMBA_DEFAULTS",
    "BAMBA_DEFAULT_THETA",
    "BAMBA_FIELDS",
    "BAMBA_FORCED_ROTARY_FRACTION",
    "MAMBA1_DEFAULTS",
    "MAMBA1_FIELDS",
    "MAMBA1_SSM_CFG_FIELDS",
    "MAMBA1_STATE_SPACES_DEFAULTS",
    "MAMBA1_STATE_SPACES_FIELDS",
    "MAMBA2_DEFAULTS",
    "MAMBA2_FIELDS",
    "MAMBA2_SSM_CFG_FIELDS",
    "MAMBA2_STATE_SPACES_DEFAULTS",
    "MAMBA2_STATE_SPACES_FIELDS",
    "ROPE_KEYS",
    "TRANSFORMERS_VERSION",
    "ConfigFields",
    "Supported",
    "as_float",
    "shown",
]

#: The transformers release whose config classes and modeling code these tables follow (the
#: version pinned by the ``reference`` extra in pyproject.toml).
TRANSFORMERS_VERSION = "5.25.0"


def as_float(value: Any) -> float | None:
    """A JSON number as a float, including transformers' encoding of infinities
    (``{"__float__": "Infinity"}``); None if it is not a number (a string, a bool, an integer too
    large for a float)."""
    if isinstance(value, Mapping) and set(value) == {"__float__"}:
        value = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}.get(value["__float__"])
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


class _ShortRepr(reprlib.Repr):
    """``repr`` cut short: a few list entries and mapping items, long strings shortened, and an
    integer too long to print (Python refuses past 4300 digits) by its digit count."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel, self.maxlist, self.maxtuple, self.maxdict, self.maxstring, self.maxother = 3, 8, 8, 6, 60, 60

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 200:
            return f"<an integer of about {int(x.bit_length() * math.log10(2)) + 1:,} digits>"
        return repr(x)


_SHORT = _ShortRepr()


def shown(value: Any) -> str:
    """``value`` as ``repr`` writes it, shortened to a line (a config field's value in an error)."""
    if isinstance(value, bool):
        return repr(value)
    return _SHORT.repr(value)


@dataclass(frozen=True)
class Supported:
    """The values of a refused field that mambalaya models: ``what`` says them in words and
    ``ok`` tests one. Every class default is a supported value, so leaving the field out is fine."""

    what: str
    ok: Callable[[Any], bool]


def equals(expected: Any) -> Supported:
    return Supported(repr(expected), lambda v: type(v) is type(expected) and v == expected)


def _no_clamp(value: Any) -> bool:
    """``time_step_limit`` / ``dt_limit`` that clamps nothing: ``(0, inf)`` (or null)."""
    if value is None:
        return True
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        return False
    lo, hi = (as_float(v) for v in value)
    return lo is not None and hi is not None and lo <= 0 and hi == math.inf


NO_CLAMP = Supported("(0.0, inf) (no clamp of the time step)", _no_clamp)
#: A field transformers cannot load from a config.json (a read-only property of its config class:
#: from_pretrained fails on any value), so none is accepted.
NOT_LOADABLE = Supported(f"absent: transformers {TRANSFORMERS_VERSION} cannot load a config.json that gives it (a "
                         "read-only property of the config class)", lambda v: False)
FALSE_OR_ABSENT = Supported("false", lambda v: v is False or v is None)


@dataclass(frozen=True)
class ConfigFields:
    """The fields of one config class (or one scope of a config, such as a state-spaces
    ``ssm_cfg``) sorted into read, refused and inert. ``name`` says whose fields these are in
    messages ("transformers 5.25.0 BambaConfig")."""

    name: str
    read: Mapping[str, str]
    refused: Mapping[str, Supported] = field(default_factory=dict)
    inert: Mapping[str, str] = field(default_factory=dict)
    #: The transformers config class these fields belong to, whose types the inert fields'
    #: values must have (:func:`~mambalaya.workloads.hf.field_types.field_type_problem`);
    #: None for a state-spaces config, which nothing type-checks.
    config_class: str | None = None

    def __post_init__(self) -> None:
        seen: dict[str, str] = {}
        for table, keys in (("read", self.read), ("refused", self.refused), ("inert", self.inert)):
            for key in keys:
                if key in seen:
                    raise ValueError(f"{self.name}: field {key} is both {seen[key]} and {table}")
                seen[key] = table

    def fields(self) -> set[str]:
        return set(self.read) | set(self.refused) | set(self.inert)

    def problem(self, data: Mapping[str, Any], *, prefix: str = "") -> str | None:
        """The first field of ``data`` mambalaya cannot honour, as one sentence naming it; None
        if every field is read, supported or inert."""
        for key, value in data.items():
            if key in self.read:
                continue
            if key in self.inert:
                wrong_type = field_type_problem(self.config_class, key, value) if self.config_class else None
                if wrong_type:
                    return wrong_type if not prefix else f"{prefix}{wrong_type}"
                continue
            name = f"{prefix}{key}"
            if key in self.refused:
                rule = self.refused[key]
                if not rule.ok(value):
                    return (f"field {name} is {shown(value)}; mambalaya models {self.name} layers only with {name} = "
                            f"{rule.what}, so it refuses this config rather than compute another layer")
                continue
            return (f"field {name} is not a field of {self.name}, and mambalaya cannot tell whether it changes "
                    f"what a layer computes; remove it if it is only metadata")
        return None


# --------------------------------------------------------------------------------------------
# Fields every transformers config has (PreTrainedConfig) and metadata a saved config.json adds
# --------------------------------------------------------------------------------------------

_TOKEN_IDS = "a tokenizer id: it selects no computation inside a layer"
_INIT = "random initialisation only: the loaded (or given) weights replace what it initialises"
_DTYPE = ("the storage dtype of the checkpoint: mambalaya executes in float32 or float64 and sets each "
          "tensor's width in the cost model by its precision policy")

TRANSFORMERS_COMMON_INERT: dict[str, str] = {
    "architectures": "names the model class from_pretrained builds",
    "model_type": "checked by the reader: it picks the reader, and an unknown one is refused",
    "transformers_version": "metadata: the version that saved the file",
    "_name_or_path": "metadata: where the config was loaded from",
    "dtype": _DTYPE,
    "torch_dtype": _DTYPE + " (the field's older name)",
    "id2label": "labels of a classification head, outside the layers",
    "label2id": "labels of a classification head, outside the layers",
    "problem_type": "the loss of a classification head, outside the layers",
    "is_encoder_decoder": "these models are decoders; the flag changes no layer",
    "output_hidden_states": "what forward returns, not what a layer computes",
    "output_attentions": "what forward returns, not what a layer computes",
    "return_dict": "what forward returns, not what a layer computes",
    "chunk_size_feed_forward": "transformers' apply_chunking_to_forward, which these models never call",
    "use_cache": "whether forward returns a cache; a layer computes the same values either way",
    "pad_token_id": _TOKEN_IDS,
    "bos_token_id": _TOKEN_IDS,
    "eos_token_id": _TOKEN_IDS,
    "initializer_range": _INIT,
    "attn_implementation": "eager, sdpa and flash attention compute the same attention",
    "_attn_implementation": "eager, sdpa and flash attention compute the same attention",
}


def _transformers(name: str, read: dict[str, str], refused: dict[str, Supported], inert: dict[str, str]) -> ConfigFields:
    return ConfigFields(f"transformers {TRANSFORMERS_VERSION} {name}", read, refused,
                        {**{k: v for k, v in TRANSFORMERS_COMMON_INERT.items() if k not in read and k not in refused},
                         **inert}, config_class=name)


_SILU = equals("silu")
#: A Mamba model's residual stream in float32 (the configs' default): the ``reference-kernels``
#: precision policy keeps the residual (X, XO) at 32 bits because of it, so a model without it is
#: refused rather than costed at the flag's widths (it was inert: 21% more off-chip bytes, silently).
RESIDUAL_IN_FP32 = Supported(
    "true: the reference-kernels precision policy keeps the residual stream (X, XO) in float32 as this flag does "
    "(under --precision uniform or a policy file it changes nothing); for a model that keeps it at the model "
    "dtype, drop the field and give those widths in a precision policy file",
    lambda v: v is True or v is None)

# --------------------------------------------------------------------------------------------
# BambaConfig (models/bamba/configuration_bamba.py, modeling_bamba.py)
# --------------------------------------------------------------------------------------------

BAMBA_FIELDS = _transformers(
    "BambaConfig",
    read={
        "hidden_size": "d_model",
        "intermediate_size": "d_ff (the gated MLP)",
        "num_hidden_layers": "the number of layers",
        "attn_layer_indices": "which layers are attention (the only field BambaConfig builds its layer pattern from)",
        "layers_block_type": "checked: must equal the pattern attn_layer_indices gives (BambaConfig cannot set it)",
        "layer_types": "checked: must equal the pattern attn_layer_indices gives (BambaConfig cannot set it)",
        "num_attention_heads": "n_heads",
        "num_key_value_heads": "n_kv_heads (null: num_attention_heads)",
        "head_dim": "head_dim (read by BambaAttention through getattr; else hidden_size / num_attention_heads)",
        "rope_parameters": "rope_theta and partial_rotary_factor (rope_type must be 'default')",
        "rope_scaling": "the older name of rope_parameters, which replaces it as in transformers",
        "rope_theta": "rope_theta where rope_parameters has none",
        "partial_rotary_factor": "checked: BambaConfig replaces a top-level value by 0.5, so it must agree",
        "rms_norm_eps": "norm_eps of every RMSNorm (input, pre-MLP and the mixer's gated norm)",
        "mamba_n_heads": "mamba_heads",
        "mamba_d_head": "mamba_headdim ('auto': mamba_expand * hidden_size / mamba_n_heads)",
        "mamba_n_groups": "mamba_ngroups",
        "mamba_d_state": "mamba_d_state",
        "mamba_d_conv": "mamba_d_conv",
        "mamba_expand": "mamba_expand",
        "mamba_chunk_size": "mamba_chunk_size",
        "vocab_size": "vocab_size (embedding and LM head: the parameter count)",
        "tie_word_embeddings": "tie_embeddings (the parameter count)",
    },
    refused={
        "hidden_act": _SILU,
        "mamba_conv_bias": equals(True),
        "mamba_proj_bias": equals(False),
        "attention_bias": equals(False),
        "mlp_bias": equals(False),
        "time_step_limit": NO_CLAMP,
    },
    inert={
        "num_logits_to_keep": "how many positions the LM head scores, outside the layers",
        "max_position_embeddings": "the rotary cache length, which changes values only for the dynamic rope types "
                                   "mambalaya refuses",
        "attention_dropout": "dropout acts in training only; mambalaya models inference",
        "z_loss_coefficient": "a training loss term",
        "use_mamba_kernels": "a flag of older transformers versions choosing CUDA kernels; the same values",
    },
)

#: BambaConfig's class defaults for the fields mambalaya reads (an omitted field takes these in
#: transformers, so it does here; the test checks them against the class).
BAMBA_DEFAULTS: dict[str, Any] = {
    "vocab_size": 128000, "tie_word_embeddings": False, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-5,
    "attn_layer_indices": None, "mamba_n_heads": 128, "mamba_d_head": "auto", "mamba_n_groups": 1,
    "mamba_d_state": 256, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 256, "rope_parameters": None,
}
#: transformers' ``RotaryEmbeddingConfigMixin.default_theta``, BambaConfig's forced rotary fraction.
BAMBA_DEFAULT_THETA = 10000.0
BAMBA_FORCED_ROTARY_FRACTION = 0.5
#: The keys of a default-type rope_parameters dict that transformers reads.
ROPE_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor")

# --------------------------------------------------------------------------------------------
# MambaConfig (models/mamba) and state-spaces/mamba's MambaConfig + Mamba mixer arguments
# --------------------------------------------------------------------------------------------

_MAMBA1_INERT = {
    "time_step_scale": _INIT, "time_step_min": _INIT, "time_step_max": _INIT, "time_step_init_scheme": _INIT,
    "time_step_floor": _INIT, "rescale_prenorm_residual": _INIT,
    "use_mambapy": "picks a training fallback implementation computing the same values",
    "use_associative_scan": "picks a scan implementation computing the same values",
}

MAMBA1_FIELDS = _transformers(
    "MambaConfig",
    read={
        "hidden_size": "d_model",
        "state_size": "d_state",
        "num_hidden_layers": "n_layers",
        "layer_norm_epsilon": "norm_eps",
        "expand": "expand",
        "intermediate_size": "checked: must be expand * hidden_size (transformers builds in_proj from it)",
        "conv_kernel": "d_conv",
        "time_step_rank": "dt_rank ('auto': ceil(hidden_size / 16))",
        "vocab_size": "vocab_size (the parameter count)",
        "tie_word_embeddings": "tie_embeddings (the parameter count)",
    },
    refused={"use_bias": equals(False), "use_conv_bias": equals(True), "hidden_act": _SILU,
             "layer_types": NOT_LOADABLE, "residual_in_fp32": RESIDUAL_IN_FP32},
    inert=_MAMBA1_INERT,
)

MAMBA1_DEFAULTS: dict[str, Any] = {
    "vocab_size": 50280, "hidden_size": 768, "state_size": 16, "num_hidden_layers": 32, "layer_norm_epsilon": 1e-5,
    "expand": 2, "conv_kernel": 4, "time_step_rank": "auto", "tie_word_embeddings": True,
}

_STATE_SPACES_INERT = {
    "fused_add_norm": "picks a fused kernel computing the same add and norm",
    "attn_cfg": "configures attention layers, which attn_layer_idx (refused unless empty) would place",
    "architectures": TRANSFORMERS_COMMON_INERT["architectures"],
    "_name_or_path": TRANSFORMERS_COMMON_INERT["_name_or_path"],
    "torch_dtype": _DTYPE,
    "dtype": _DTYPE,
}

MAMBA1_STATE_SPACES_FIELDS = ConfigFields(
    "state-spaces/mamba MambaConfig (Mamba-1)",
    read={
        "d_model": "d_model",
        "n_layer": "n_layers",
        "vocab_size": "vocab_size (padded to pad_vocab_size_multiple)",
        "pad_vocab_size_multiple": "vocab_size padding",
        "ssm_cfg": "the mixer's arguments (checked field by field)",
        "tie_embeddings": "tie_embeddings (the parameter count)",
        "norm_epsilon": "norm_eps",
    },
    refused={
        "rms_norm": equals(True),
        "d_intermediate": Supported("0 (no MLP block)", lambda v: v is None or (type(v) is int and v == 0)),
        "attn_layer_idx": Supported("[] (no attention layers)", lambda v: v is None or v == []),
        "residual_in_fp32": RESIDUAL_IN_FP32,
    },
    inert=_STATE_SPACES_INERT,
)

MAMBA1_STATE_SPACES_DEFAULTS: dict[str, Any] = {"d_state": 16, "d_conv": 4, "expand": 2, "dt_rank": "auto",
                                                "norm_epsilon": 1e-5, "tie_embeddings": True}

_SSM_CFG_INERT = {
    "dt_min": _INIT, "dt_max": _INIT, "dt_init": _INIT, "dt_scale": _INIT, "dt_init_floor": _INIT,
    "conv_init": _INIT, "A_init_range": _INIT,
    "use_fast_path": "picks a fused CUDA kernel computing the same values",
    "use_mem_eff_path": "picks a fused CUDA kernel computing the same values",
    "layer_idx": "the layer's index for caching; no computation",
    "device": "where tensors are placed", "dtype": _DTYPE,
    "process_group": "tensor parallelism: the same values split over devices",
    "sequence_parallel": "sequence parallelism: the same values split over devices",
}

MAMBA1_SSM_CFG_FIELDS = ConfigFields(
    "state-spaces/mamba Mamba (Mamba-1 mixer, ssm_cfg)",
    read={"layer": "checked: must be 'Mamba1'", "d_state": "d_state", "d_conv": "d_conv", "expand": "expand",
          "dt_rank": "dt_rank"},
    refused={"bias": FALSE_OR_ABSENT, "conv_bias": equals(True)},
    inert=_SSM_CFG_INERT,
)

# --------------------------------------------------------------------------------------------
# Mamba2Config (models/mamba2) and state-spaces/mamba's Mamba2 mixer arguments
# --------------------------------------------------------------------------------------------

MAMBA2_FIELDS = _transformers(
    "Mamba2Config",
    read={
        "hidden_size": "d_model",
        "num_hidden_layers": "n_layers",
        "state_size": "d_state",
        "head_dim": "headdim",
        "num_heads": "checked: num_heads * head_dim must be expand * hidden_size",
        "n_groups": "ngroups",
        "expand": "expand",
        "conv_kernel": "d_conv",
        "chunk_size": "chunk_size",
        "layer_norm_epsilon": "norm_eps (block norm and gated norm)",
        "vocab_size": "vocab_size (the parameter count)",
        "tie_word_embeddings": "tie_embeddings (the parameter count)",
    },
    refused={"use_bias": equals(False), "use_conv_bias": equals(True), "hidden_act": _SILU,
             "time_step_limit": NO_CLAMP, "layer_types": NOT_LOADABLE, "residual_in_fp32": RESIDUAL_IN_FP32},
    inert={
        "time_step_rank": "Mamba-2 has no low-rank dt projection: transformers stores it and never reads it",
        "time_step_min": _INIT, "time_step_max": _INIT, "time_step_floor": _INIT, "rescale_prenorm_residual": _INIT,
    },
)

MAMBA2_DEFAULTS: dict[str, Any] = {
    "num_heads": 128, "head_dim": 64, "vocab_size": 32768, "hidden_size": 4096, "state_size": 128,
    "num_hidden_layers": 64, "layer_norm_epsilon": 1e-5, "expand": 2, "conv_kernel": 4, "n_groups": 8,
    "chunk_size": 256, "tie_word_embeddings": False,
}

MAMBA2_STATE_SPACES_FIELDS = ConfigFields(
    "state-spaces/mamba MambaConfig (Mamba-2)",
    read=dict(MAMBA1_STATE_SPACES_FIELDS.read),
    refused=dict(MAMBA1_STATE_SPACES_FIELDS.refused),
    inert=_STATE_SPACES_INERT,
)

#: mamba_ssm's Mamba2 mixer defaults (mamba_ssm/modules/mamba2.py).
MAMBA2_STATE_SPACES_DEFAULTS: dict[str, Any] = {"d_state": 128, "headdim": 64, "ngroups": 1, "expand": 2,
                                                "d_conv": 4, "chunk_size": 256, "norm_epsilon": 1e-5,
                                                "tie_embeddings": True}

MAMBA2_SSM_CFG_FIELDS = ConfigFields(
    "state-spaces/mamba Mamba2 (Mamba-2 mixer, ssm_cfg)",
    read={"layer": "checked: must be 'Mamba2'", "d_state": "d_state", "d_conv": "d_conv", "expand": "expand",
          "headdim": "headdim", "ngroups": "ngroups", "chunk_size": "chunk_size",
          "d_ssm": "checked: must be absent, null or expand * d_model (else part of the channels skip the SSM)"},
    refused={"bias": FALSE_OR_ABSENT, "conv_bias": equals(True), "rmsnorm": equals(True),
             "norm_before_gate": equals(False), "D_has_hdim": equals(False), "dt_limit": NO_CLAMP},
    inert={**_SSM_CFG_INERT, "dt_init": _INIT},
)
