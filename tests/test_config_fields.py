"""Every field of the transformers config classes mambalaya reads is read, refused, or listed with
the reason it cannot change a layer (mambalaya.workloads.hf.fields), and each table says the truth:

* the tables cover every dataclass field of ``BambaConfig``, ``MambaConfig`` and
  ``Mamba2Config``, every key their ``to_dict()`` writes, and every ``config.<name>`` (or
  ``getattr(config, "<name>")``) their modeling code reads;
* changing a read field changes what mambalaya builds (the cascade, its constants or the
  parameter count), and a field read only as a check is refused when it contradicts;
* a refused field with an unsupported value is one error naming the field;
* an inert field changed in transformers leaves a Bamba model's layer outputs unchanged;
* an omitted field reads as transformers' class default, and rope fields and the layer pattern
  are read as transformers' BambaConfig reads them.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import re
from typing import Any

import numpy as np
import pytest

from mambalaya.einsum import dump_cascade
from mambalaya.errors import SpecError
from mambalaya.workloads.blocks.attention import attention_constants
from mambalaya.workloads.hf.fields import (
    BAMBA_DEFAULTS,
    BAMBA_FIELDS,
    MAMBA1_DEFAULTS,
    MAMBA1_FIELDS,
    MAMBA1_SSM_CFG_FIELDS,
    MAMBA1_STATE_SPACES_FIELDS,
    MAMBA2_DEFAULTS,
    MAMBA2_FIELDS,
    MAMBA2_SSM_CFG_FIELDS,
    MAMBA2_STATE_SPACES_FIELDS,
    TRANSFORMERS_VERSION,
    ConfigFields,
)
from mambalaya.workloads.hf.loader import WeightLoadError
from mambalaya.workloads.hf.weights import load_mamba1_config
from mambalaya.workloads.hf.weights_mamba2 import load_mamba2_config
from mambalaya.workloads.families.bamba import bamba_config_from_hf, hybrid_layer, rope_from_hf
from mambalaya.workloads.blocks.mamba1 import Mamba1Config, mamba1_layer
from mambalaya.workloads.blocks.mamba2 import Mamba2Config, mamba2_layer

requires_hf = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
    reason="needs torch and transformers",
)

# --------------------------------------------------------------------------------------------
# small base configs (transformers' names) and what mambalaya builds from them
# --------------------------------------------------------------------------------------------

BAMBA_BASE: dict[str, Any] = {
    "model_type": "bamba", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 3,
    "attn_layer_indices": [1], "num_attention_heads": 4, "num_key_value_heads": 2, "mamba_n_heads": 8,
    "mamba_d_state": 8, "mamba_n_groups": 1, "mamba_expand": 2, "mamba_d_conv": 4, "mamba_chunk_size": 4,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "rms_norm_eps": 1e-5, "vocab_size": 16,
    "tie_word_embeddings": False,
}
MAMBA1_BASE: dict[str, Any] = {"model_type": "mamba", "hidden_size": 32, "state_size": 4, "num_hidden_layers": 2,
                               "vocab_size": 16, "expand": 2, "conv_kernel": 4, "layer_norm_epsilon": 1e-5}
MAMBA2_BASE: dict[str, Any] = {"model_type": "mamba2", "hidden_size": 32, "num_heads": 8, "head_dim": 8,
                               "state_size": 4, "n_groups": 2, "num_hidden_layers": 2, "vocab_size": 16,
                               "chunk_size": 4, "expand": 2, "conv_kernel": 4, "layer_norm_epsilon": 1e-5}


def _bamba_built(data: dict) -> tuple:
    config = bamba_config_from_hf(data)
    out: list[Any] = [config.model_parameters(), config.layer_types]
    for layer_type in config.layer_counts():
        for phase in ("prefill", "decode"):
            c = hybrid_layer(config, layer_type, batch=1, seq_len=config.mamba_chunk_size, phase=phase)
            out.append(dump_cascade(c))
            out += [a.tobytes() for a in attention_constants(c, config).values()] if layer_type == "attention" else []
    return tuple(out)


def _mamba1_built(data: dict) -> tuple:
    config = Mamba1Config(**load_mamba1_config(data))
    return config.model_parameters(), dump_cascade(mamba1_layer(config, batch=1, seq_len=4))


def _mamba2_built(data: dict) -> tuple:
    config = Mamba2Config(**load_mamba2_config(data))
    return config.model_parameters(), dump_cascade(mamba2_layer(config, batch=1, seq_len=8, scan="chunked"))


# Each read field: a change that keeps the config valid (other fields move with it where the
# class requires). A "checked:" field gets a contradicting value instead.
BAMBA_READ_CHANGES: dict[str, dict] = {
    "hidden_size": {"hidden_size": 48},
    "intermediate_size": {"intermediate_size": 40},
    "num_hidden_layers": {"num_hidden_layers": 4},
    "attn_layer_indices": {"attn_layer_indices": [0]},
    "num_attention_heads": {"num_attention_heads": 8},
    "num_key_value_heads": {"num_key_value_heads": 1},
    "head_dim": {"head_dim": 12},
    "rope_parameters": {"rope_parameters": {"rope_type": "default", "rope_theta": 500.0,
                                            "partial_rotary_factor": 0.25}},
    "rope_scaling": {"rope_scaling": {"rope_type": "default", "rope_theta": 77.0}},
    "rope_theta": {"rope_parameters": {"rope_type": "default"}, "rope_theta": 123.0},
    "rms_norm_eps": {"rms_norm_eps": 1e-6},
    "mamba_n_heads": {"mamba_n_heads": 16},
    "mamba_d_head": {"mamba_n_heads": 4, "mamba_d_head": 16},
    "mamba_n_groups": {"mamba_n_groups": 2},
    "mamba_d_state": {"mamba_d_state": 16},
    "mamba_d_conv": {"mamba_d_conv": 3},
    "mamba_expand": {"mamba_expand": 1, "mamba_n_heads": 4},
    "mamba_chunk_size": {"mamba_chunk_size": 8},
    "vocab_size": {"vocab_size": 32},
    "tie_word_embeddings": {"tie_word_embeddings": True},
}
BAMBA_CONTRADICTIONS: dict[str, Any] = {
    "layers_block_type": ["attention", "mamba", "mamba"],
    "layer_types": ["linear_attention"] * 3,
    "partial_rotary_factor": 0.25,
}
MAMBA1_READ_CHANGES: dict[str, dict] = {
    "hidden_size": {"hidden_size": 48}, "state_size": {"state_size": 8}, "num_hidden_layers": {"num_hidden_layers": 3},
    "layer_norm_epsilon": {"layer_norm_epsilon": 1e-6}, "expand": {"expand": 3}, "conv_kernel": {"conv_kernel": 3},
    "time_step_rank": {"time_step_rank": 5}, "vocab_size": {"vocab_size": 32},
    "tie_word_embeddings": {"tie_word_embeddings": False},
}
MAMBA1_CONTRADICTIONS: dict[str, Any] = {"intermediate_size": 100}
MAMBA2_READ_CHANGES: dict[str, dict] = {
    "hidden_size": {"hidden_size": 64, "num_heads": 16}, "num_hidden_layers": {"num_hidden_layers": 3},
    "state_size": {"state_size": 8}, "head_dim": {"head_dim": 16, "num_heads": 4}, "n_groups": {"n_groups": 4},
    "expand": {"expand": 1, "num_heads": 4}, "conv_kernel": {"conv_kernel": 3}, "chunk_size": {"chunk_size": 8},
    "layer_norm_epsilon": {"layer_norm_epsilon": 1e-6}, "vocab_size": {"vocab_size": 32},
    "tie_word_embeddings": {"tie_word_embeddings": True},
}
MAMBA2_CONTRADICTIONS: dict[str, Any] = {"num_heads": 5}

# Each refused field: a value mambalaya does not model.
BAMBA_REFUSED: dict[str, Any] = {"hidden_act": "gelu", "mamba_conv_bias": False, "mamba_proj_bias": True,
                                 "attention_bias": True, "mlp_bias": True, "time_step_limit": [0.001, 0.1]}
# layer_types: any value (even every layer 'linear_attention'), as transformers 5.25 fails to load it
# residual_in_fp32 false: the reference-kernels policy keeps the residual stream in float32 because
# of this flag; a false one was inert (and the residual costed at 32 bits, silently)
MAMBA1_REFUSED: dict[str, Any] = {"use_bias": True, "use_conv_bias": False, "hidden_act": "gelu",
                                  "layer_types": ["linear_attention"], "residual_in_fp32": False}
MAMBA2_REFUSED: dict[str, Any] = {"use_bias": True, "use_conv_bias": False, "hidden_act": "relu",
                                  "time_step_limit": [0.0, 0.1], "layer_types": ["linear_attention"],
                                  "residual_in_fp32": False}

CASES = {
    "bamba": (BAMBA_FIELDS, BAMBA_BASE, _bamba_built, BAMBA_READ_CHANGES, BAMBA_CONTRADICTIONS, BAMBA_REFUSED),
    "mamba": (MAMBA1_FIELDS, MAMBA1_BASE, _mamba1_built, MAMBA1_READ_CHANGES, MAMBA1_CONTRADICTIONS, MAMBA1_REFUSED),
    "mamba2": (MAMBA2_FIELDS, MAMBA2_BASE, _mamba2_built, MAMBA2_READ_CHANGES, MAMBA2_CONTRADICTIONS, MAMBA2_REFUSED),
}


def _refusal(built, data: dict, field: str) -> str:
    with pytest.raises((SpecError, WeightLoadError)) as info:
        built(data)
    message = str(info.value)
    assert re.search(rf"\bfield {re.escape(field)}\b|\b{re.escape(field)}[ =]", message), message
    return message


@pytest.mark.parametrize("family", list(CASES))
def test_every_read_field_changes_what_is_built_or_is_checked(family: str) -> None:
    fields, base, built, changes, contradictions, _ = CASES[family]
    checked = {k for k, why in fields.read.items() if why.startswith("checked:")}
    assert set(changes) == set(fields.read) - checked, "each read field needs a change here"
    assert set(contradictions) == checked, "each checked field needs a contradicting value here"
    reference = built(base)
    for field, change in changes.items():
        assert built({**base, **change}) != reference, f"changing {field} changed nothing mambalaya builds"
    for field, value in contradictions.items():
        _refusal(built, {**base, field: value}, field)


@pytest.mark.parametrize("family", list(CASES))
def test_every_refused_field_is_one_error_naming_it(family: str) -> None:
    fields, base, built, _, _, refused = CASES[family]
    assert set(refused) == set(fields.refused)
    for field, value in refused.items():
        message = _refusal(built, {**base, field: value}, field)
        assert "refuses" in message and repr(value) in message, message


@pytest.mark.parametrize("family", list(CASES))
@pytest.mark.parametrize("wrong", ["x", float("nan"), [[1]], {"a": 1}])
def test_every_read_field_of_a_wrong_type_is_one_error_naming_it(family: str, wrong: Any) -> None:
    """A string, NaN, a nested list or a mapping where a read (or checked) field's value goes is
    refused by name, never taken (the change first makes the field the one that is read)."""
    fields, base, built, changes, _, _ = CASES[family]
    for field in fields.read:
        message = _refusal(built, {**base, **changes.get(field, {}), field: wrong}, field)
        assert "\n" not in message, message


@pytest.mark.parametrize("family", list(CASES))
def test_an_unknown_field_is_refused_by_name(family: str) -> None:
    _, base, built, *_ = CASES[family]
    message = _refusal(built, {**base, "attention_sink_size": 4}, "attention_sink_size")
    assert "cannot tell whether it changes" in message


def test_tables_do_not_overlap() -> None:
    with pytest.raises(ValueError, match="both read and inert"):
        ConfigFields("x", read={"a": "b"}, inert={"a": "c"})
    for fields in (BAMBA_FIELDS, MAMBA1_FIELDS, MAMBA2_FIELDS, MAMBA1_STATE_SPACES_FIELDS, MAMBA1_SSM_CFG_FIELDS,
                   MAMBA2_STATE_SPACES_FIELDS, MAMBA2_SSM_CFG_FIELDS):
        assert not (set(fields.read) & set(fields.inert)) and not (set(fields.refused) & set(fields.inert))
        assert all(why for why in fields.inert.values())


# --------------------------------------------------------------------------------------------
# against transformers: coverage of the classes, defaults, rope and layer pattern, inert fields
# --------------------------------------------------------------------------------------------


def _transformers_names(config_class, modeling) -> set[str]:
    """Every field of a config class, every key its to_dict writes, and every config attribute
    its modeling code reads."""
    names = {f.name for f in dataclasses.fields(config_class)} | set(config_class().to_dict())
    source = inspect.getsource(modeling)
    names |= set(re.findall(r"\bconfig\.([A-Za-z_]\w*)\b(?!\s*\()", source))
    names |= set(re.findall(r"getattr\(\s*(?:self\.)?config\s*,\s*[\"'](\w+)[\"']", source))
    return names


@requires_hf
@pytest.mark.parametrize("family", list(CASES))
def test_tables_cover_every_field_of_the_pinned_transformers_classes(family: str) -> None:
    import transformers
    from transformers import BambaConfig, Mamba2Config as HFMamba2Config, MambaConfig
    from transformers.models.bamba import modeling_bamba
    from transformers.models.mamba import modeling_mamba
    from transformers.models.mamba2 import modeling_mamba2

    assert transformers.__version__ == TRANSFORMERS_VERSION, "the field tables follow the pinned transformers"
    config_class, modeling = {"bamba": (BambaConfig, modeling_bamba), "mamba": (MambaConfig, modeling_mamba),
                              "mamba2": (HFMamba2Config, modeling_mamba2)}[family]
    names = _transformers_names(config_class, modeling)
    missing = sorted(names - CASES[family][0].fields())
    assert not missing, f"{config_class.__name__} fields neither read, refused nor inert: {missing}"


@requires_hf
def test_omitted_fields_read_as_the_class_defaults() -> None:
    from transformers import BambaConfig, Mamba2Config as HFMamba2Config, MambaConfig

    for config_class, defaults in ((BambaConfig, BAMBA_DEFAULTS), (MambaConfig, MAMBA1_DEFAULTS),
                                   (HFMamba2Config, MAMBA2_DEFAULTS)):
        declared = {f.name: f.default for f in dataclasses.fields(config_class)}
        for key, value in defaults.items():
            assert declared[key] == value, (config_class.__name__, key)
    assert bamba_config_from_hf({"model_type": "bamba"}) == bamba_config_from_hf(BambaConfig().to_dict())
    assert load_mamba1_config({"model_type": "mamba"}) == load_mamba1_config(MambaConfig().to_dict())
    assert load_mamba2_config({"model_type": "mamba2"}) == load_mamba2_config(HFMamba2Config().to_dict())
    assert load_mamba2_config({"model_type": "mamba2"})["ngroups"] == 8  # transformers' default, not mamba_ssm's 1


@requires_hf
@pytest.mark.parametrize("rope", [
    {},
    {"rope_parameters": {"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.25}},
    {"rope_parameters": {"rope_type": "default"}, "rope_theta": 500.0},
    {"rope_parameters": {"rope_type": "default", "rope_theta": 20.0}, "rope_theta": 500.0},
    {"rope_theta": 250.0},
    {"rope_scaling": {"type": "default", "rope_theta": 30.0, "partial_rotary_factor": 0.75}},
    {"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 1.0}, "partial_rotary_factor": 1.0},
])
def test_rope_fields_read_as_bamba_config_reads_them(rope: dict) -> None:
    from transformers import BambaConfig

    theirs = BambaConfig(**rope).rope_parameters
    assert rope_from_hf(rope) == (theirs["rope_theta"], theirs["partial_rotary_factor"])


@requires_hf
def test_a_top_level_rotary_fraction_transformers_replaces_is_refused() -> None:
    from transformers import BambaConfig

    assert BambaConfig(partial_rotary_factor=0.25).rope_parameters["partial_rotary_factor"] == 0.5
    with pytest.raises(SpecError, match=r"field partial_rotary_factor is 0.25, but transformers .* replaces"):
        rope_from_hf({"partial_rotary_factor": 0.25})


@requires_hf
@pytest.mark.parametrize("layers", [
    {"num_hidden_layers": 4, "attn_layer_indices": [1, 3]},
    {"num_hidden_layers": 2, "attn_layer_indices": None},
    {"num_hidden_layers": 3, "attn_layer_indices": [0], "layers_block_type": ["full_attention", "linear_attention",
                                                                             "linear_attention"]},
])
def test_the_layer_pattern_is_the_one_transformers_builds(layers: dict) -> None:
    from transformers import BambaConfig

    built = BambaConfig(**{k: v for k, v in layers.items() if k != "layers_block_type"}).layers_block_type
    ours = bamba_config_from_hf({**BAMBA_BASE, **layers}).layer_types
    assert list(ours) == ["attention" if t == "full_attention" else "mamba" for t in built]


# Inert fields changed in transformers: a Bamba model's layers compute the same. The metadata
# fields (names, versions, labels, what forward returns) build nothing and are not run here.
BAMBA_INERT_CHANGES: dict[str, Any] = {
    "num_logits_to_keep": 3, "max_position_embeddings": 64, "attention_dropout": 0.5, "z_loss_coefficient": 0.1,
    "initializer_range": 0.5, "use_cache": False, "pad_token_id": 3, "bos_token_id": 4, "eos_token_id": 5,
    "chunk_size_feed_forward": 2, "output_hidden_states": True, "return_dict": False, "use_mamba_kernels": False,
}
METADATA = {"architectures", "model_type", "transformers_version", "_name_or_path", "dtype", "torch_dtype", "id2label",
            "label2id", "problem_type", "is_encoder_decoder", "output_attentions", "attn_implementation",
            "_attn_implementation"}


@requires_hf
def test_inert_bamba_fields_change_no_layer_in_transformers() -> None:
    import hf_reference_bamba as hf

    assert set(BAMBA_INERT_CHANGES) | METADATA == set(BAMBA_FIELDS.inert)
    common = dict(layer_types=["mamba", "attention"], seq_len=5, n_decode=1, seed=7)
    reference = hf.run_hf_bamba(**common)
    ours = bamba_config_from_hf(reference["config"])
    for field, value in BAMBA_INERT_CHANGES.items():
        changed = hf.run_hf_bamba(**common, **{field: value})
        assert bamba_config_from_hf({**reference["config"], field: value}) == ours, field
        for a, b in zip(reference["layers"], changed["layers"]):
            for x, y in zip(a["outputs"], b["outputs"]):
                np.testing.assert_array_equal(x, y, err_msg=field)
