"""The types transformers checks on config fields mambalaya does not read.

An inert field (:mod:`mambalaya.workloads.hf.fields`) cannot change what a layer computes, but
its value still has a type: transformers' config classes are strict dataclasses, and
``MambaConfig(use_cache="false")`` is refused. A config.json transformers refuses is not a model
it runs, so mambalaya refuses it too, naming the field and the type. Fields transformers does
not check (``architectures``, ``output_attentions``, ...) stay unchecked here as well: being
stricter than transformers would refuse configs it runs.

:data:`INERT_FIELD_TYPES` holds, per config class of transformers 5.25, the annotation of each
inert field whose value transformers checks, written as transformers writes it.
``tests/test_hf_field_types.py`` checks, for every class and every inert field, that
:func:`field_type_problem` accepts exactly the sample values transformers accepts.
"""

from __future__ import annotations

import reprlib
from typing import Any

__all__ = ["INERT_FIELD_TYPES", "TORCH_DTYPE_NAMES", "field_type_problem", "value_has_type"]

#: The dtype names ``torch`` resolves (``getattr(torch, name)``) that a config's ``dtype`` may take.
TORCH_DTYPE_NAMES = frozenset({
    "float32", "float", "float64", "double", "float16", "half", "bfloat16", "complex64", "complex128",
    "cfloat", "cdouble", "uint8", "int8", "int16", "short", "int32", "int", "int64", "long", "bool",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "uint16", "uint32", "uint64",
    "auto",
})

_TOKEN_ID = "int | None"
_EOS = "int | list[int] | None"
_LABELS = "dict[int, str] | dict[str, str] | None"
#: transformers resolves a text dtype with ``getattr(torch, name)`` and passes any other value on.
_DTYPE = "torch dtype name | not text"
_COMMON = {"bos_token_id": _TOKEN_ID, "pad_token_id": _TOKEN_ID, "eos_token_id": _EOS, "id2label": _LABELS,
           "dtype": _DTYPE, "torch_dtype": _DTYPE, "initializer_range": "float"}
_MAMBA_INIT = {"time_step_floor": "float", "time_step_max": "float", "time_step_min": "float"}

#: config class -> inert field -> the type transformers 5.25 requires of its value.
INERT_FIELD_TYPES: dict[str, dict[str, str]] = {
    "MambaConfig": {**_COMMON, **_MAMBA_INIT, "rescale_prenorm_residual": "bool", "residual_in_fp32": "bool",
                    "time_step_init_scheme": "str", "time_step_scale": "float", "use_associative_scan": "bool",
                    "use_cache": "bool", "use_mambapy": "bool"},
    "Mamba2Config": {**_COMMON, **_MAMBA_INIT, "rescale_prenorm_residual": "bool", "residual_in_fp32": "bool",
                     "time_step_rank": "str | int", "use_cache": "bool"},
    "BambaConfig": {**_COMMON, "attention_dropout": "float | int | None", "max_position_embeddings": "int",
                    "num_logits_to_keep": "int | None", "use_cache": "bool", "z_loss_coefficient": "float | None"},
    "FalconH1Config": {**_COMMON, "attention_dropout": "float | int | None", "max_position_embeddings": "int",
                       "num_logits_to_keep": "int | None", "use_cache": "bool | None"},
    "Zamba2Config": {**_COMMON, "attention_dropout": "float | int", "max_position_embeddings": "int",
                     "num_logits_to_keep": "int", "time_step_floor": "float", "time_step_max": "float",
                     "use_cache": "bool", "use_long_context": "bool", "use_mamba_kernels": "bool",
                     "use_mem_eff_path": "bool"},
    "NemotronHConfig": {**_COMMON, **_MAMBA_INIT, "attention_dropout": "float | int", "expand": "int",
                        "hidden_dropout": "float | int", "mamba_ssm_cache_dtype": "str",
                        "max_position_embeddings": "int", "moe_intermediate_size": "int",
                        "moe_latent_size": "int | None", "moe_shared_expert_intermediate_size": "int",
                        "moe_shared_expert_overlap": "bool", "mtp_layers_block_type": "list[str] | None",
                        "n_group": "int", "n_routed_experts": "int", "n_shared_experts": "int",
                        "norm_topk_prob": "bool", "num_experts_per_tok": "int", "num_logits_to_keep": "int",
                        "output_router_logits": "bool", "rescale_prenorm_residual": "bool",
                        "residual_in_fp32": "bool", "routed_scaling_factor": "float | int", "topk_group": "int",
                        "use_cache": "bool", "use_mamba_kernels": "bool"},
    "JambaConfig": {**_COMMON, "attention_dropout": "float | int", "max_position_embeddings": "int",
                    "output_router_logits": "bool", "router_aux_loss_coef": "float", "use_associative_scan": "bool",
                    "use_cache": "bool", "use_mamba_kernels": "bool", "use_mambapy": "bool"},
    "OlmoHybridConfig": {**_COMMON, "initializer_range": "float in [0, 1]", "attention_dropout": "int | float | None", "linear_a_log_max": "float",
                         "linear_a_log_min": "float", "linear_dt_init_floor": "float", "linear_dt_max": "float",
                         "linear_dt_min": "float", "max_position_embeddings": "int", "use_cache": "bool"},
    "GraniteMoeHybridConfig": {**_COMMON, "attention_dropout": "float | int | None",
                               "embedding_multiplier": "int | float | None", "logits_scaling": "int | float | None",
                               "max_position_embeddings": "int", "output_router_logits": "bool | None",
                               "router_aux_loss_coef": "float | None", "use_cache": "bool"},
}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_ATOMS = {
    "None": lambda v: v is None,
    "bool": lambda v: isinstance(v, bool),
    "int": _is_int,
    "float": lambda v: type(v) is float,
    "float in [0, 1]": lambda v: type(v) is float and 0.0 <= v <= 1.0,
    "str": lambda v: isinstance(v, str),
    "list[int]": lambda v: isinstance(v, list) and all(_is_int(x) for x in v),
    "list[str]": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    "dict[int, str]": lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
    "dict[str, str]": lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
    "torch dtype name": lambda v: isinstance(v, str) and v in TORCH_DTYPE_NAMES,
    "not text": lambda v: not isinstance(v, str),
}


def value_has_type(value: Any, type_text: str) -> bool:
    """Whether ``value`` (as JSON gives it) has the type ``type_text`` ("int | None", ...), read
    as transformers' strict dataclasses read it: a boolean is not an integer and an integer is
    not a float."""
    return any(_ATOMS[atom.strip()](value) for atom in type_text.split(" | "))


def field_type_problem(config_class: str, key: str, value: Any) -> str | None:
    """One sentence if transformers' ``config_class`` refuses ``value`` for the inert field
    ``key``; None if it accepts it (or does not check the field)."""
    type_text = INERT_FIELD_TYPES.get(config_class, {}).get(key)
    if type_text is None or value_has_type(value, type_text):
        return None
    return (f"field {key} is {reprlib.repr(value)}, but transformers' {config_class} requires {type_text} there and refuses "
            "this config; mambalaya does not read the field, but refuses a config transformers cannot build")
