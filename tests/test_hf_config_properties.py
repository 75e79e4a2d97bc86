"""Property tests of the config.json readers of every family (Mamba-1 in both formats, Mamba-2,
Bamba, Nemotron-H, Falcon-H1, Zamba2, OLMo-Hybrid, Jamba, Granite 4): from a valid config of
each, malformed ones are generated (a field replaced by a value of another type, NaN, an
infinity, 1e400, a 5000-digit integer, a float where an integer goes, an integer where a
boolean goes; fields deleted; empty and nested lists; junk entries in a layer-type list; a key
given twice) and each, written to a file and read by ``load_model_config``, either gives a valid
model (positive integer sizes, finite numbers, a bounded layer count) or ends in one
:class:`~mambalaya.errors.MambalayaError` of one line naming the file, never another exception,
within seconds. A config of 10**9 layers is read or refused within a second.
"""

from __future__ import annotations

import copy
import json
import math
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from mambalaya.errors import MambalayaError
from mambalaya.workloads import load_model_config
from mambalaya.workloads.hf.config import MAX_LAYERS, ConfigFile

INF = {"__float__": "Infinity"}  # how transformers' save_pretrained writes float("inf")

#: A small valid config.json of each family (the fields transformers 5.25 saves that mambalaya
#: reads, with the saved encoding of the default time_step_limit).
BASES: dict[str, dict[str, Any]] = {
    "mamba": {"model_type": "mamba", "hidden_size": 32, "state_size": 4, "num_hidden_layers": 2, "vocab_size": 16,
              "expand": 2, "conv_kernel": 4, "layer_norm_epsilon": 1e-05, "time_step_rank": 2,
              "intermediate_size": 64, "tie_word_embeddings": True, "use_bias": False, "use_conv_bias": True,
              "hidden_act": "silu", "use_cache": True},
    "mamba-state-spaces": {"d_model": 64, "n_layer": 2, "vocab_size": 50, "pad_vocab_size_multiple": 8,
                           "ssm_cfg": {"d_state": 8, "d_conv": 4, "expand": 2, "dt_rank": "auto"}, "rms_norm": True,
                           "tie_embeddings": True, "norm_epsilon": 1e-5},
    "mamba2": {"model_type": "mamba2", "hidden_size": 32, "num_heads": 8, "head_dim": 8, "state_size": 4,
               "n_groups": 2, "num_hidden_layers": 2, "vocab_size": 16, "chunk_size": 4, "expand": 2, "conv_kernel": 4,
               "layer_norm_epsilon": 1e-05, "time_step_limit": [0.0, INF], "tie_word_embeddings": False},
    "bamba": {"model_type": "bamba", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 3,
              "attn_layer_indices": [1], "num_attention_heads": 4, "num_key_value_heads": 2, "mamba_n_heads": 8,
              "mamba_d_head": 8, "mamba_d_state": 8, "mamba_n_groups": 1, "mamba_expand": 2, "mamba_d_conv": 4,
              "mamba_chunk_size": 4, "rope_parameters": {"partial_rotary_factor": 0.5, "rope_theta": 10000.0,
                                                         "rope_type": "default"},
              "rms_norm_eps": 1e-05, "vocab_size": 16, "tie_word_embeddings": False, "time_step_limit": [0.0, INF],
              "mamba_conv_bias": True, "mamba_proj_bias": False},
    "nemotron_h": {"model_type": "nemotron_h", "hidden_size": 64, "layers_block_type": [
        "linear_attention", "full_attention", "mlp", "linear_attention"], "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96, "mamba_num_heads": 8, "mamba_head_dim": 16,
        "n_groups": 2, "ssm_state_size": 16, "chunk_size": 128, "conv_kernel": 4, "vocab_size": 100,
        "layer_norm_epsilon": 1e-05, "time_step_limit": [0.0, INF], "tie_word_embeddings": False,
        "num_hidden_layers": 4, "use_conv_bias": True, "mlp_hidden_act": "relu2"},
    "falcon_h1": {"model_type": "falcon_h1", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 48, "mamba_d_ssm": 64,
                  "mamba_n_heads": 8, "mamba_d_head": 8, "mamba_d_state": 8, "mamba_chunk_size": 256,
                  "mamba_rms_norm": False, "mamba_norm_before_gate": True, "vocab_size": 16,
                  "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "rms_norm_eps": 1e-05,
                  "mlp_multipliers": [1.0, 1.0], "ssm_multipliers": [1.0, 1.0, 1.0, 1.0, 1.0],
                  "key_multiplier": 1.0, "time_step_limit": [0.0, INF], "tie_word_embeddings": False},
    "zamba2": {"model_type": "zamba2", "hidden_size": 16, "num_hidden_layers": 3, "num_attention_heads": 4,
               "n_mamba_heads": 4, "mamba_d_state": 8, "layers_block_type": ["linear_attention", "hybrid",
                                                                              "linear_attention"],
               "intermediate_size": 24, "vocab_size": 50, "num_key_value_heads": 4, "use_mem_rope": False,
               "use_shared_attention_adapter": False, "adapter_rank": 128, "time_step_min": 0.001,
               "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "tie_word_embeddings": True},
    "olmo_hybrid": {"model_type": "olmo_hybrid", "hidden_size": 32, "num_hidden_layers": 4,
                    "num_attention_heads": 4, "num_key_value_heads": 4, "linear_num_key_heads": 2,
                    "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
                    "intermediate_size": 64, "vocab_size": 100, "linear_allow_neg_eigval": True,
                    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
                    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "rms_norm_eps": 1e-06,
                    "tie_word_embeddings": False},
    "jamba": {"model_type": "jamba", "hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 48, "num_experts": 4, "num_experts_per_tok": 2,
              "attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1,
              "mamba_d_state": 8, "mamba_dt_rank": 2, "vocab_size": 16, "rms_norm_eps": 1e-06,
              "tie_word_embeddings": False, "mamba_conv_bias": True},
    "granitemoehybrid": {"model_type": "granitemoehybrid", "hidden_size": 32, "num_hidden_layers": 4,
                         "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 16,
                         "shared_intermediate_size": 24, "num_local_experts": 4, "num_experts_per_tok": 2,
                         "mamba_n_heads": 8, "mamba_d_head": 8, "mamba_d_state": 8, "mamba_n_groups": 1,
                         "mamba_chunk_size": 4, "vocab_size": 16, "layer_types": [
                             "linear_attention", "full_attention", "linear_attention", "linear_attention"],
                         "position_embedding_type": None, "attention_multiplier": 1.0, "residual_multiplier": 1.0,
                         "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
                         "time_step_limit": [0.0, INF], "rms_norm_eps": 1e-06, "tie_word_embeddings": False},
}

# Values JSON cannot carry through json.dumps, spliced into the text in place of a marker.
RAW = {"__RAW_1e400__": "1e400", "__RAW_-1e400__": "-1e400", "__RAW_digits__": "9" * 5000,
       "__RAW_nan__": "NaN", "__RAW_inf__": "Infinity", "__RAW_float64__": "64.0"}

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 70),
    st.sampled_from([0, -1, 10**9, 10**30, 2**63, 64.0, 1.5, -0.0, 1e-300, 1e300, 1.0]),
    st.sampled_from(list(RAW)),
    st.sampled_from(["auto", "no", "yes", "true", "inf", "NaN", "64", "default", "yarn", "mamba", "hybrid",
                     "linear_attention", "full_attention", "M*-", "silu", ""]),
    st.text(max_size=4),
    st.sampled_from([INF, {"__float__": "NaN"}, {"__float__": "-Infinity"}, [], {}, [[]], [{}], [None]]),
)
junk = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                     st.dictionaries(st.text(max_size=4), inner, max_size=3)),
                    max_leaves=8).map(copy.deepcopy)  # no drawn value shares a list or mapping with another


@st.composite
def malformed(draw: Any, family: str) -> tuple[dict[str, Any], bool]:
    """A base config with one to three changes, and whether to give one key twice."""
    data = json.loads(json.dumps(BASES[family]))
    for _ in range(draw(st.integers(1, 3))):
        keys = sorted(data)
        kind = draw(st.sampled_from(["replace", "replace", "delete", "entry", "add", "nested"]))
        key = draw(st.sampled_from(keys)) if keys else "hidden_size"
        if kind == "replace" or (kind == "entry" and not isinstance(data.get(key), (list, dict))):
            data[key] = draw(junk)
        elif kind == "delete":
            data.pop(key, None)
        elif kind == "entry":  # one entry of a list or mapping (a layer type, a rope field)
            inner = data[key]
            if isinstance(inner, list) and inner:
                inner[draw(st.integers(0, len(inner) - 1))] = draw(junk)
            elif isinstance(inner, dict) and inner:
                inner[draw(st.sampled_from(sorted(inner)))] = draw(junk)
            else:
                data[key] = draw(junk)
        elif kind == "add":  # a field the reader takes from its defaults, or an unknown one
            data[draw(st.sampled_from(["num_hidden_layers", "head_dim", "num_key_value_heads", "tie_word_embeddings",
                                       "rope_theta", "rope_scaling", "layer_types", "layers_block_type",
                                       "hybrid_override_pattern", "mamba_d_head", "mamba_dt_rank", "num_heads",
                                       "partial_rotary_factor", "sliding_window", "intermediate_size",
                                       "time_step_limit", "attn_layer_indices", "ssm_cfg", "flux"]))] = draw(junk)
        else:  # a list nested inside a list, or an empty one
            data[key] = copy.deepcopy(draw(st.sampled_from([[], [[]], [[["mamba"]]], [{"a": [1]}], [key], [[key, 1]]])))
    return data, draw(st.booleans())


def _text(data: dict[str, Any], duplicate: bool) -> str:
    text = json.dumps(data)
    for marker, literal in RAW.items():
        text = text.replace(json.dumps(marker), literal)
    if duplicate and data:
        text = text[:-1] + f', {json.dumps(next(iter(data)))}: 1}}'
    return text


@contextmanager
def time_limit(seconds: float):
    """A TimeoutError if the block runs past ``seconds`` (a hang fails the test, not the suite)."""
    def expired(signum: int, frame: Any) -> None:
        raise TimeoutError(f"still reading after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _values(value: Any):
    if isinstance(value, BaseModel):
        for _, inner in value:
            yield from _values(inner)
    elif isinstance(value, (list, tuple)):
        for inner in value:
            yield from _values(inner)
    else:
        yield value


def assert_valid_model(model: Any) -> None:
    """Every integer of the model non-negative (sizes positive) and every number finite; the
    layer count within MAX_LAYERS; the parameter count a positive integer."""
    for value in _values(model):
        if isinstance(value, float):
            assert math.isfinite(value), model
        elif isinstance(value, int) and not isinstance(value, bool):
            assert value >= 0, model
        else:
            assert value is None or isinstance(value, (str, bool)), (type(value), model)
    assert model.d_model >= 1 and model.vocab_size >= 1
    assert 1 <= model.n_layers <= MAX_LAYERS
    parameters = model.model_parameters()
    assert isinstance(parameters, int) and parameters > 0


def read_or_refuse(path: Path) -> None:
    started = time.perf_counter()
    with time_limit(10):
        try:
            model = load_model_config(path)
        except MambalayaError as err:
            message = str(err)
            assert "\n" not in message and str(path) in message, message
        else:
            assert_valid_model(model)
    assert time.perf_counter() - started < 5


@pytest.mark.parametrize("family", list(BASES))
def test_the_bases_are_valid(tmp_path: Path, family: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(_text(BASES[family], False))
    assert_valid_model(load_model_config(path))


@pytest.mark.parametrize("family", list(BASES))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_malformed_configs_are_read_or_refused_in_one_line(tmp_path: Path, family: str, data: Any) -> None:
    config, duplicate = data.draw(malformed(family))
    path = tmp_path / "config.json"
    path.write_text(_text(config, duplicate))
    read_or_refuse(path)


# One change each that a reader once took as a number or crashed on: refused, naming the field.
REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("bamba", {"tie_word_embeddings": "no"}, "tie_word_embeddings"),
    ("jamba", {"tie_word_embeddings": "no"}, "tie_word_embeddings"),
    ("granitemoehybrid", {"tie_word_embeddings": 1}, "tie_word_embeddings"),
    ("olmo_hybrid", {"tie_word_embeddings": "false"}, "tie_word_embeddings"),
    ("falcon_h1", {"tie_word_embeddings": "no"}, "tie_word_embeddings"),
    ("mamba", {"tie_word_embeddings": 0}, "tie_word_embeddings"),
    ("nemotron_h", {"use_conv_bias": 1}, "use_conv_bias"),
    ("jamba", {"mamba_conv_bias": 1}, "mamba_conv_bias"),
    ("bamba", {"hidden_size": 32.0}, "hidden_size"),
    ("mamba", {"hidden_size": 32.0}, "hidden_size"),
    ("mamba2", {"n_groups": 2.0}, "n_groups"),
    ("mamba", {"expand": 1.5}, "expand"),
    ("mamba2", {"num_heads": "8"}, "num_heads"),
    ("bamba", {"rope_parameters": "yarn"}, "rope_parameters"),
    ("falcon_h1", {"rope_parameters": "yarn"}, "rope_parameters"),
    ("zamba2", {"rope_parameters": ["default"]}, "rope_parameters"),
    ("granitemoehybrid", {"rope_parameters": "yarn"}, "rope_parameters"),
    ("nemotron_h", {"time_step_limit": 5}, "time_step_limit"),
    ("falcon_h1", {"time_step_limit": 5}, "time_step_limit"),
    ("granitemoehybrid", {"time_step_limit": 5}, "time_step_limit"),
    ("mamba2", {"time_step_limit": []}, "time_step_limit"),
    ("nemotron_h", {"time_step_limit": [0.0, "inf"]}, "time_step_limit"),
    ("nemotron_h", {"layers_block_type": []}, "layers_block_type"),
    ("nemotron_h", {"layers_block_type": [["mlp"], "mlp"]}, "layers_block_type[0]"),
    ("zamba2", {"layers_block_type": [{"a": 1}, "hybrid", "hybrid"]}, "layers_block_type[0]"),
    ("granitemoehybrid", {"layer_types": [["mamba"]] * 4}, "layer_types[0]"),
    ("jamba", {"layers_block_type": ["mamba", {}, "mamba", "mamba"]}, "layers_block_type[1]"),
    ("olmo_hybrid", {"layer_types": [[]] * 4}, "layer_types[0]"),
    ("bamba", {"attn_layer_indices": [[1]]}, "attn_layer_indices[0]"),
    ("falcon_h1", {"layers_block_type": [["hybrid"]]}, "layers_block_type is given"),  # any value: transformers fails
    ("nemotron_h", {"hybrid_override_pattern": ["M"], "layers_block_type": None}, "hybrid_override_pattern"),
    ("bamba", {"rms_norm_eps": "__RAW_nan__"}, "rms_norm_eps"),
    ("nemotron_h", {"layer_norm_epsilon": "__RAW_nan__"}, "layer_norm_epsilon"),
    ("falcon_h1", {"rms_norm_eps": "__RAW_inf__"}, "rms_norm_eps"),
    ("zamba2", {"rms_norm_eps": "__RAW_1e400__"}, "rms_norm_eps"),
    ("jamba", {"hidden_size": "__RAW_1e400__"}, "hidden_size"),
    ("granitemoehybrid", {"hidden_size": "__RAW_nan__"}, "hidden_size"),
    ("olmo_hybrid", {"rms_norm_eps": {"__float__": "Infinity"}}, "rms_norm_eps"),
    ("falcon_h1", {"mlp_multipliers": [1.0, "__RAW_nan__"]}, "mlp_multipliers[1]"),
    ("falcon_h1", {"key_multiplier": "__RAW_inf__"}, "key_multiplier"),
    ("zamba2", {"rope_parameters": {"rope_theta": "__RAW_inf__"}}, "rope_parameters.rope_theta"),
    ("jamba", {"vocab_size": 10**15}, "vocab_size"),
    ("mamba-state-spaces", {"ssm_cfg": "Mamba1"}, "ssm_cfg"),
    ("mamba-state-spaces", {"n_layer": 2.0}, "n_layer"),
    ("mamba-state-spaces", {"d_intermediate": False}, "d_intermediate"),
]


@pytest.mark.parametrize("family, change, field", REFUSED)
def test_wrong_types_are_refused_naming_the_field(tmp_path: Path, family: str, change: dict, field: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(_text({**BASES[family], **change}, False))
    with pytest.raises(MambalayaError) as info:
        load_model_config(path)
    message = str(info.value)
    assert f"field {field}" in message and str(path) in message and "\n" not in message, message


def test_encoded_floats_in_a_dict_are_decoded_and_infinite_only_where_transformers_allows() -> None:
    from mambalaya.workloads.families.bamba import bamba_config_from_hf
    from mambalaya.workloads.families.nemotron_h import nemotron_h_config_from_hf

    assert bamba_config_from_hf(BASES["bamba"]).n_layers == 3
    assert nemotron_h_config_from_hf(BASES["nemotron_h"]).n_layers == 4
    with pytest.raises(MambalayaError, match="field rms_norm_eps must be a positive finite number, not inf"):
        bamba_config_from_hf({**BASES["bamba"], "rms_norm_eps": INF})
    with pytest.raises(MambalayaError, match="field time_step_limit"):  # a lower bound of -inf is no value
        nemotron_h_config_from_hf({**BASES["nemotron_h"], "time_step_limit": [INF, INF]})
    cfg = ConfigFile.of({"a": [0.0, {"__float__": "Infinity"}], "b": {"c": {"__float__": "-Infinity"}}}, "x")
    assert cfg.data == {"a": [0.0, math.inf], "b": {"c": -math.inf}}


def test_a_non_text_encoded_float_in_a_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**BASES["jamba"], "hidden_size": {"__float__": []}}))
    with pytest.raises(MambalayaError, match="field hidden_size"):
        load_model_config(path)


def test_a_non_text_encoded_float_in_a_dict_is_refused() -> None:
    from mambalaya.workloads.hf.config_moe import moe_config_from_hf

    with pytest.raises(MambalayaError, match="field hidden_size must be a positive integer, not {'__float__': \\[\\]}"):
        moe_config_from_hf({**BASES["jamba"], "hidden_size": {"__float__": []}})


def test_a_huge_integer_in_a_dict_is_named_not_printed() -> None:
    from mambalaya.workloads.hf.config_moe import moe_config_from_hf

    with pytest.raises(MambalayaError, match=r"field hidden_size is <an integer of about 5,001 digits>, more than"):
        moe_config_from_hf({**BASES["jamba"], "hidden_size": 10**5000})


_HANG_SCRIPT = r"""
import json, sys, time
from pathlib import Path
from mambalaya.errors import MambalayaError
from mambalaya.workloads import load_model_config
out = {}
for name, text in json.loads(sys.stdin.read()).items():
    path = Path(sys.argv[1]) / f"{name}.json"
    path.write_text(text)
    started = time.perf_counter()
    try:
        model = load_model_config(path)
        outcome = f"read, {model.n_layers} layers"
    except MambalayaError as err:
        outcome = "refused: " + str(err)
    out[name] = (time.perf_counter() - started, outcome)
print(json.dumps(out))
"""


def test_a_billion_layers_is_read_or_refused_at_once(tmp_path: Path) -> None:
    """num_hidden_layers 10**9 (n_layer in a state-spaces config) and a 20,000-entry layer list:
    nothing is built per layer past MAX_LAYERS, so each is read or refused at once (run in a
    subprocess with a timeout, so a hang fails the test rather than stalling the suite)."""
    docs = {}
    for family, base in BASES.items():
        key = "n_layer" if "d_model" in base else "num_hidden_layers"
        docs[family] = _text({**base, key: 10**9}, False)
    for family, key in (("nemotron_h", "layers_block_type"), ("zamba2", "layers_block_type"),
                        ("granitemoehybrid", "layer_types"), ("olmo_hybrid", "layer_types")):
        docs[f"{family}-list"] = _text({**BASES[family], key: ["linear_attention"] * 20_000}, False)
    docs["nemotron_h-pattern"] = _text({**BASES["nemotron_h"], "layers_block_type": None,
                                        "hybrid_override_pattern": "M-" * 10**6}, False)
    run = subprocess.run([sys.executable, "-c", _HANG_SCRIPT, str(tmp_path)], input=json.dumps(docs),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    results = json.loads(run.stdout)
    for name, (seconds, outcome) in results.items():
        assert seconds < 5.0, (name, seconds, outcome)  # a hang guard: building 10**9 layers would take hours
        assert outcome == "read, 4 layers" if name == "nemotron_h" else outcome.startswith("refused"), (name, outcome)
        if outcome.startswith("refused") and not name.endswith("pattern"):
            assert f"at most {MAX_LAYERS:,}" in outcome, (name, outcome)
