"""Natural calls (issue 45, section 4):

* ``hybrid_config_from_hf`` reads the config.json of every hybrid family, dispatching on
  ``model_type`` to the family's own reader (the one table ``load_model_config`` uses too), and
  refuses a ``model_type`` no hybrid reader takes by name;
* the Gated DeltaNet chunk size is a setting (config field, default transformers' 64, and a
  build argument), refused by name where it is not a positive integer or the form has no chunks,
  and honoured by every builder of the chunked form: the values do not depend on it;
* a Gated DeltaNet (or Mamba) prefill built without ``state_io`` that is asked for its states
  says so instead of returning none.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from mambalaya.errors import SpecError
from mambalaya.execute import carry_states, execute
from mambalaya.workloads import PRESETS, build_layer, load_model_config
from mambalaya.workloads.blocks.gated_deltanet import (
    DEFAULT_CHUNK_SIZE,
    GatedDeltaNetConfig,
    gdn_constants,
    gdn_layer,
)
from mambalaya.workloads.blocks.mamba2 import chunked_output_to_positions

needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")

HYBRID_MODEL_TYPES = ("bamba", "falcon_h1", "granitemoehybrid", "jamba", "nemotron_h", "olmo_hybrid", "zamba2")


def _small_hf_config(model_type: str) -> Any:
    """A small config of ``model_type`` built by transformers' own config class (the sizes of
    tests/test_hf_saved_configs.py)."""
    import transformers as tf

    return {
        "bamba": lambda: tf.BambaConfig(
            hidden_size=32, intermediate_size=48, num_hidden_layers=3, attn_layer_indices=[1], num_attention_heads=4,
            num_key_value_heads=2, mamba_n_heads=8, mamba_d_state=8, mamba_chunk_size=4, vocab_size=16),
        "jamba": lambda: tf.JambaConfig(
            hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
            num_experts=4, num_experts_per_tok=2, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
            expert_layer_offset=0, mamba_d_state=8, vocab_size=16),
        "granitemoehybrid": lambda: tf.GraniteMoeHybridConfig(
            hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, intermediate_size=16,
            shared_intermediate_size=24, num_local_experts=4, num_experts_per_tok=2, mamba_n_heads=8, mamba_d_state=8,
            mamba_chunk_size=4, vocab_size=16, layer_types=["mamba", "attention", "mamba", "mamba"]),
        "nemotron_h": lambda: tf.NemotronHConfig(
            hidden_size=64, layers_block_type=["mamba", "attention", "mlp", "mamba"], num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, intermediate_size=96, mamba_num_heads=8, mamba_head_dim=16, n_groups=2,
            ssm_state_size=16, chunk_size=8, vocab_size=100),
        "falcon_h1": lambda: tf.FalconH1Config(
            hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            intermediate_size=48, mamba_d_ssm=64, mamba_n_heads=8, mamba_d_state=8, mamba_chunk_size=16, vocab_size=16),
        "zamba2": lambda: tf.Zamba2Config(
            hidden_size=16, num_hidden_layers=3, num_attention_heads=4, n_mamba_heads=4, mamba_d_state=8,
            layers_block_type=["mamba", "hybrid", "mamba"], intermediate_size=24, vocab_size=50, adapter_rank=4),
        "olmo_hybrid": lambda: tf.OlmoHybridConfig(
            hidden_size=32, num_hidden_layers=4, num_attention_heads=4, linear_num_key_heads=2,
            linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=16, intermediate_size=64,
            vocab_size=100),
    }[model_type]()


def _family_reader(model_type: str) -> Callable[..., Any]:
    """The family's own reader, called directly (what the dispatch must hand the config to)."""
    from mambalaya.workloads.families.bamba import bamba_config_from_hf
    from mambalaya.workloads.families.falcon_h1 import falcon_h1_config_from_hf
    from mambalaya.workloads.families.nemotron_h import nemotron_h_config_from_hf
    from mambalaya.workloads.families.olmo_hybrid import olmo_hybrid_config_from_hf
    from mambalaya.workloads.families.zamba2 import zamba2_config_from_hf
    from mambalaya.workloads.hf.config_moe import moe_config_from_hf

    return {"bamba": bamba_config_from_hf, "jamba": moe_config_from_hf, "granitemoehybrid": moe_config_from_hf,
            "nemotron_h": nemotron_h_config_from_hf, "falcon_h1": falcon_h1_config_from_hf,
            "zamba2": zamba2_config_from_hf, "olmo_hybrid": olmo_hybrid_config_from_hf}[model_type]


# --------------------------------------------------------------------------------------------
# hybrid_config_from_hf: one dispatch on model_type
# --------------------------------------------------------------------------------------------


@needs_transformers
@pytest.mark.parametrize("model_type", HYBRID_MODEL_TYPES)
def test_hybrid_config_from_hf_reads_every_hybrid_family(tmp_path: Path, model_type: str) -> None:
    """The config.json transformers writes for each family, read by ``hybrid_config_from_hf``
    (imported from where users import it) and by ``load_model_config``: the model the family's
    own reader gives."""
    from mambalaya.workloads import hybrid_config_from_hf as from_package
    from mambalaya.workloads.families.dense import hybrid_config_from_hf as from_dispatch

    _small_hf_config(model_type).save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    data = json.loads(path.read_text())
    assert data["model_type"] == model_type
    expected = _family_reader(model_type)(data)
    assert expected.family == model_type
    assert from_package(data) == expected
    assert from_dispatch(data) == expected
    assert load_model_config(path) == expected


def test_dispatch_table_is_every_hybrid_family() -> None:
    from mambalaya.workloads.families.dense import HYBRID_READERS

    assert tuple(sorted(HYBRID_READERS)) == HYBRID_MODEL_TYPES


@pytest.mark.parametrize("model_type", ["mamba2", "mamba", "llama", 5, ["bamba"]])
def test_a_model_type_no_hybrid_reader_takes_is_refused_by_name(model_type: Any) -> None:
    from mambalaya.workloads import hybrid_config_from_hf

    with pytest.raises(SpecError) as err:
        hybrid_config_from_hf({"model_type": model_type, "hidden_size": 32})
    message = str(err.value)
    assert "field model_type is" in message and "\n" not in message
    assert all(repr(t) in message for t in HYBRID_MODEL_TYPES), message


def test_a_config_without_model_type_is_read_as_bamba_and_a_non_mapping_is_refused() -> None:
    from mambalaya.workloads import hybrid_config_from_hf

    bamba = {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "intermediate_size": 24, "attn_layer_indices": [1], "mamba_n_heads": 4, "mamba_d_state": 4,
             "mamba_chunk_size": 4, "vocab_size": 16}
    model = hybrid_config_from_hf(bamba)
    assert model.family == "bamba" and model.layer_types == ("mamba", "attention")
    assert hybrid_config_from_hf({**bamba, "model_type": None}) == model
    assert hybrid_config_from_hf({**bamba, "model_type": "bamba"}) == model
    with pytest.raises(SpecError, match="mapping of fields"):
        hybrid_config_from_hf([bamba])  # type: ignore[arg-type]


def test_load_model_config_reads_mamba_configs_and_own_fields_as_before(tmp_path: Path) -> None:
    """The single dispatch leaves the non-hybrid readers theirs: a Mamba-2 config.json is a
    Mamba-2 model, mambalaya's own fields are read by their family's parser (which refuses a
    transformers model_type beside them), an unknown model_type is refused by name."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "mamba2", "hidden_size": 64, "num_heads": 2, "head_dim": 64,
                                "state_size": 16, "n_groups": 1, "num_hidden_layers": 2, "vocab_size": 16}))
    assert load_model_config(path).family == "mamba2"
    own = json.loads(PRESETS["olmo-hybrid"].model_dump_json())
    path.write_text(json.dumps(own))
    assert load_model_config(path) == PRESETS["olmo-hybrid"]
    path.write_text(json.dumps({**own, "model_type": "olmo_hybrid"}))
    with pytest.raises(SpecError, match="model_type: unknown field"):
        load_model_config(path)
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    with pytest.raises(SpecError, match="field model_type is 'llama'.*'zamba2'"):
        load_model_config(path)


# --------------------------------------------------------------------------------------------
# The Gated DeltaNet chunk size
# --------------------------------------------------------------------------------------------

TINY = GatedDeltaNetConfig(d_model=8, layer_types=("linear_attention", "full_attention"), num_k_heads=1,
                           num_v_heads=2, k_head_dim=3, v_head_dim=4, d_ff=8, n_heads=2, n_kv_heads=1, vocab_size=16)


@needs_transformers
def test_the_default_chunk_size_is_transformers() -> None:
    """transformers' torch_chunk_gated_delta_rule defaults to chunks of 64 and OlmoHybrid's layer
    calls it without another (read from the pinned transformers' source, no torch import)."""
    import ast

    spec = importlib.util.find_spec("transformers")
    path = Path(spec.origin).parent / "models" / "olmo_hybrid" / "modeling_olmo_hybrid.py"  # type: ignore[arg-type]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    name = "torch_chunk_gated_delta_rule"
    rule = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)
    positional = [a.arg for a in rule.args.args]
    defaults = dict(zip(positional[len(positional) - len(rule.args.defaults):], rule.args.defaults))
    defaults |= {a.arg: d for a, d in zip(rule.args.kwonlyargs, rule.args.kw_defaults) if d is not None}
    assert ast.literal_eval(defaults["chunk_size"]) == 64
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == name]
    assert calls and all("chunk_size" not in {k.arg for k in c.keywords} for c in calls)
    assert DEFAULT_CHUNK_SIZE == GatedDeltaNetConfig.model_fields["chunk_size"].default == 64
    assert PRESETS["olmo-hybrid"].chunk_size == PRESETS["olmo-hybrid-7b"].mixer.chunk_size == 64  # type: ignore[union-attr]


def test_the_presets_keep_chunks_of_64() -> None:
    c = build_layer(PRESETS["olmo-hybrid-7b"], phase="prefill", seq_len=256, batch=1, layer_type="gdn")
    assert (c.size("C"), c.size("Q"), c.size("S"), c.size("T")) == (4, 64, 64, 64)
    assert build_layer(PRESETS["olmo-hybrid"], phase="prefill", seq_len=256, batch=1, scan="chunked").size("Q") == 64


@pytest.mark.parametrize("chunk", [1, 5, 32])
def test_every_builder_of_the_chunked_form_honours_the_chunk_size(chunk: int) -> None:
    block = gdn_layer(TINY, batch=1, seq_len=70, scan="chunked", chunk_size=chunk)
    assert (block.size("C"), block.size("Q"), block.size("T")) == (math.ceil(70 / chunk), chunk, chunk)
    assert block.params["chunk_size"] == chunk
    assert block == gdn_layer(TINY.with_chunk_size(chunk), batch=1, seq_len=70, scan="chunked")
    if 70 % chunk:  # a model's layer refuses the padded rows its output projection would count (the block pads)
        with pytest.raises(SpecError, match="chunk size"):
            build_layer(TINY, phase="prefill", seq_len=70, batch=1, chunk_size=chunk)
    else:
        assert build_layer(TINY, phase="prefill", seq_len=70, batch=1, chunk_size=chunk) == block  # chunked by default
    # a whole OLMo-Hybrid gdn layer: the Gated DeltaNet block and its MLP over the same chunks
    whole = build_layer(PRESETS["olmo-hybrid-7b"], phase="prefill", seq_len=3 * chunk, batch=1, layer_type="gdn",
                        chunk_size=chunk)
    assert (whole.size("C"), whole.size("Q")) == (3, chunk) and whole.tensors["FF_XO"].ranks[1:3] == ("C", "Q")
    if chunk > 1:
        with pytest.raises(SpecError, match="chunk size"):  # its MLP would count the padded rows
            build_layer(PRESETS["olmo-hybrid-7b"], phase="prefill", seq_len=3 * chunk + 1, batch=1, layer_type="gdn",
                        chunk_size=chunk)


@pytest.mark.parametrize("bad", [0, -4, True, 2.5, "8", None])
def test_a_chunk_size_that_is_not_a_positive_integer_is_refused_by_name(bad: Any, tmp_path: Path) -> None:
    if bad is not None:
        with pytest.raises(SpecError, match="chunk_size.*positive integer"):
            gdn_layer(TINY, batch=1, seq_len=8, scan="chunked", chunk_size=bad)
        with pytest.raises(SpecError, match="chunk_size.*positive integer"):
            build_layer(PRESETS["olmo-hybrid-7b"], phase="prefill", seq_len=64, batch=1, layer_type="gdn",
                        chunk_size=bad)
        with pytest.raises(SpecError, match="chunk_size.*positive integer"):
            TINY.with_chunk_size(bad)
    path = tmp_path / "gdn.json"  # the config field, in a model file
    path.write_text(json.dumps({**json.loads(TINY.model_dump_json()), "chunk_size": bad}))
    with pytest.raises(SpecError, match="chunk_size"):
        load_model_config(path)


@pytest.mark.parametrize("model, kwargs", [
    ("tiny", {"phase": "prefill", "scan": "recurrent"}),
    ("tiny", {"phase": "decode", "seq_len": 1}),
    ("olmo-hybrid-7b", {"phase": "prefill", "layer_type": "gdn", "scan": "recurrent"}),
    ("olmo-hybrid-7b", {"phase": "decode", "layer_type": "gdn"}),
    ("olmo-hybrid-7b", {"phase": "prefill", "layer_type": "attention"}),
    ("bamba-9b", {"phase": "prefill", "layer_type": "mamba"}),
    ("mamba2-130m", {"phase": "prefill"}),
])
def test_a_chunk_size_for_a_form_without_chunks_is_refused_by_name(model: str, kwargs: dict) -> None:
    config = TINY if model == "tiny" else PRESETS[model]
    with pytest.raises(SpecError, match="chunk_size") as err:
        build_layer(config, **{"seq_len": 64, "batch": 1, **kwargs}, chunk_size=8)  # type: ignore[arg-type]
    assert "\n" not in str(err.value)


def _random_arrays(cascade: Any, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Weights, an input and a nonzero incoming state for a Gated DeltaNet cascade (decays in
    (0, 1): A < 0)."""
    arrays = {t: rng.normal(0.0, 0.5, cascade.shape(t)) for t in cascade.external_tensors()
              if t not in gdn_constants(cascade)}
    arrays["A"] = -rng.uniform(0.5, 2.0, cascade.shape("A"))
    return {**arrays, **gdn_constants(cascade)}


def test_the_values_do_not_depend_on_the_chunk_size() -> None:
    """Chunks of 2, 3 and 8 (longer than the prompt) through build_layer's chunk_size: the same
    outputs and carried states as the recurrent form, in float64, from a nonzero state."""
    rng = np.random.default_rng(45)
    recurrent = build_layer(TINY, phase="prefill", seq_len=7, batch=2, scan="recurrent", state_io=True)
    arrays = _random_arrays(recurrent, rng)
    reference = execute(recurrent, arrays, dtype="float64")
    for chunk in (2, 3, 8):
        chunked = gdn_layer(TINY, phase="prefill", seq_len=7, batch=2, state_io=True, scan="chunked", chunk_size=chunk)
        assert chunked.size("Q") == chunk
        result = execute(chunked, {**{t: a for t, a in arrays.items() if t in chunked.tensors},
                                   **gdn_constants(chunked)}, dtype="float64")
        output = chunked_output_to_positions(result["XO"], 7)
        np.testing.assert_allclose(output, reference["XO"], rtol=1e-10, atol=1e-12)
        ours, theirs = carry_states(chunked, result), carry_states(recurrent, reference)
        assert sorted(ours) == sorted(theirs) == ["CSK0", "CSQ0", "CSV0", "H0"]
        for t in ours:
            np.testing.assert_allclose(ours[t], theirs[t], rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------------------------
# A prefill without state_io asked for its states
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scan", ["chunked", "recurrent"])
def test_a_prefill_without_state_io_asked_for_its_states_says_so(scan: str) -> None:
    rng = np.random.default_rng(0)
    # (the block: a model's layer refuses a chunked length the chunk does not divide)
    stateless = gdn_layer(TINY, phase="prefill", seq_len=6, batch=1, scan=scan)
    result = execute(stateless, _random_arrays(stateless, rng))
    with pytest.raises(SpecError, match="without state_io.*state_io=True") as err:
        carry_states(stateless, result)
    assert "\n" not in str(err.value)
    carried = gdn_layer(TINY, phase="prefill", seq_len=6, batch=1, scan=scan, state_io=True)
    states = carry_states(carried, execute(carried, _random_arrays(carried, rng)))
    assert sorted(states) == ["CSK0", "CSQ0", "CSV0", "H0"]


def test_the_same_holds_for_mamba_and_a_stateless_block_still_carries_nothing() -> None:
    from mambalaya.workloads.blocks.mamba2 import Mamba2Config, mamba2_constants, mamba2_layer
    from mambalaya.workloads.blocks.mlp import MLPConfig, mlp_layer

    rng = np.random.default_rng(1)
    m2 = mamba2_layer(Mamba2Config(d_model=16, headdim=8, d_state=4, chunk_size=4), batch=1, seq_len=8, scan="chunked")
    arrays = {t: rng.normal(0.0, 0.5, m2.shape(t)) for t in m2.external_tensors()}
    result = execute(m2, {**arrays, **mamba2_constants(m2)})
    with pytest.raises(SpecError, match="without state_io"):
        carry_states(m2, result)
    mlp = mlp_layer(MLPConfig(d_model=8, d_ff=16), batch=1, seq_len=4)  # no scan, no state: nothing to carry
    assert carry_states(mlp, execute(mlp, {t: rng.normal(size=mlp.shape(t)) for t in mlp.external_tensors()})) == {}
