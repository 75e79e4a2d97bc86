"""Every family's reader takes the config.json that the pinned transformers itself writes: a small
config of each family built with transformers 5.25's config class, saved with
``save_pretrained`` (which writes the default ``time_step_limit`` as
``[0.0, {"__float__": "Infinity"}]``) and read back with ``load_model_config``, gives a model
whose sizes are the config's. The same file parsed by plain ``json`` and handed to the reader as
a dict (encoded floats and all) gives the same model."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any, Callable

import pytest

from mambalaya.workloads import load_model_config

pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")

#: transformers' layer type names (and Bamba's and Jamba's own) -> mambalaya's.
KINDS = {"linear_attention": "mamba", "mamba": "mamba", "full_attention": "attention", "attention": "attention",
         "mlp": "mlp", "hybrid": "hybrid"}


def _saved(tmp_path: Path, config: Any) -> Path:
    config.save_pretrained(tmp_path)
    return tmp_path / "config.json"


def _from_dict(family: str) -> Callable[[dict], Any]:
    """The reader a config dict of ``family`` goes to (load_model_config's, without the file)."""
    from mambalaya.workloads.families.dense import family_config_from_hf
    from mambalaya.workloads.hf.config_moe import moe_config_from_hf
    from mambalaya.workloads.hf.weights import load_mamba1_config
    from mambalaya.workloads.hf.weights_mamba2 import load_mamba2_config
    from mambalaya.workloads.families.bamba import bamba_config_from_hf
    from mambalaya.workloads.blocks.mamba1 import Mamba1Config
    from mambalaya.workloads.blocks.mamba2 import Mamba2Config

    return {"mamba": lambda d: Mamba1Config(**load_mamba1_config(d)),
            "mamba2": lambda d: Mamba2Config(**load_mamba2_config(d)),
            "bamba": bamba_config_from_hf, "jamba": moe_config_from_hf,
            "granitemoehybrid": moe_config_from_hf}.get(family, family_config_from_hf)


def _read_both_ways(path: Path, family: str, encoded_limit: bool) -> Any:
    text = path.read_text()
    assert ('"__float__": "Infinity"' in text) == encoded_limit, text
    model = load_model_config(path)
    assert _from_dict(family)(json.loads(text)) == model
    return model


def test_mamba(tmp_path: Path) -> None:
    from transformers import MambaConfig

    hf = MambaConfig(hidden_size=32, state_size=4, num_hidden_layers=3, vocab_size=16, expand=2, conv_kernel=3,
                     time_step_rank=5, tie_word_embeddings=False, layer_norm_epsilon=1e-6)
    m = _read_both_ways(_saved(tmp_path, hf), "mamba", False)
    assert (m.d_model, m.d_state, m.n_layers, m.vocab_size, m.expand, m.d_conv, m.dt_rank_value, m.tie_embeddings,
            m.norm_eps) == (32, 4, 3, 16, 2, 3, 5, False, 1e-6)


def test_mamba2(tmp_path: Path) -> None:
    from transformers import Mamba2Config

    hf = Mamba2Config(hidden_size=32, num_heads=8, head_dim=8, state_size=4, n_groups=2, num_hidden_layers=3,
                      vocab_size=16, chunk_size=4, conv_kernel=3)
    m = _read_both_ways(_saved(tmp_path, hf), "mamba2", True)
    assert (m.d_model, m.n_layers, m.d_state, m.headdim, m.ngroups, m.chunk_size, m.expand, m.d_conv,
            m.vocab_size) == (32, 3, 4, 8, 2, 4, 2, 3, 16)


def test_bamba(tmp_path: Path) -> None:
    from transformers import BambaConfig

    hf = BambaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=3, attn_layer_indices=[1],
                     num_attention_heads=4, num_key_value_heads=2, mamba_n_heads=8, mamba_d_state=8,
                     mamba_chunk_size=4, vocab_size=16, rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    m = _read_both_ways(_saved(tmp_path, hf), "bamba", True)
    assert m.layer_types == tuple(KINDS[t] for t in hf.layers_block_type) == ("mamba", "attention", "mamba")
    assert (m.d_model, m.d_ff, m.n_heads, m.n_kv_heads, m.mamba_heads, m.mamba_headdim, m.mamba_d_state,
            m.mamba_chunk_size, m.vocab_size) == (32, 48, 4, 2, 8, hf.mamba_d_head, 8, 4, 16)
    assert (m.rope_theta, m.partial_rotary_factor) == (hf.rope_parameters["rope_theta"],
                                                       hf.rope_parameters["partial_rotary_factor"])


def test_nemotron_h(tmp_path: Path) -> None:
    from transformers import NemotronHConfig

    hf = NemotronHConfig(hidden_size=64, layers_block_type=["mamba", "attention", "mlp", "mamba"],
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=96,
                         mamba_num_heads=8, mamba_head_dim=16, n_groups=2, ssm_state_size=16, chunk_size=8,
                         vocab_size=100)
    m = _read_both_ways(_saved(tmp_path, hf), "nemotron_h", True)
    assert m.layer_types == tuple(KINDS[t] for t in hf.layers_block_type) == ("mamba", "attention", "mlp", "mamba")
    assert (m.d_model, m.n_heads, m.n_kv_heads, m.head_dim, m.d_ff, m.mamba_heads, m.mamba_headdim, m.mamba_d_state,
            m.mamba_ngroups, m.mamba_chunk_size, m.vocab_size) == (64, 4, 2, 16, 96, 8, 16, 16, 2, 8, 100)


def test_falcon_h1(tmp_path: Path) -> None:
    from transformers import FalconH1Config

    hf = FalconH1Config(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=8, intermediate_size=48, mamba_d_ssm=64, mamba_n_heads=8, mamba_d_state=8,
                        mamba_chunk_size=16, vocab_size=16)
    m = _read_both_ways(_saved(tmp_path, hf), "falcon_h1", True)
    assert m.layer_types == ("parallel",) * 3
    assert (m.d_model, m.n_heads, m.n_kv_heads, m.head_dim, m.d_ff, m.mamba_d_ssm, m.mamba_heads, m.mamba_d_state,
            m.mamba_chunk_size, m.vocab_size) == (32, 4, 2, 8, 48, 64, 8, 8, 16, 16)


def test_zamba2(tmp_path: Path) -> None:
    from transformers import Zamba2Config

    hf = Zamba2Config(hidden_size=16, num_hidden_layers=3, num_attention_heads=4, n_mamba_heads=4,
                      mamba_d_state=8, layers_block_type=["mamba", "hybrid", "mamba"], intermediate_size=24,
                      vocab_size=50, adapter_rank=4)
    m = _read_both_ways(_saved(tmp_path, hf), "zamba2", False)
    assert m.layer_types == tuple(KINDS[t] for t in hf.layers_block_type) == ("mamba", "hybrid", "mamba")
    assert (m.d_model, m.n_heads, m.n_kv_heads, m.d_ff, m.mamba_heads, m.mamba_d_state, m.adapter_rank,
            m.vocab_size, m.tie_embeddings) == (16, 4, 4, 24, 4, 8, 4, 50, True)


def test_olmo_hybrid(tmp_path: Path) -> None:
    from transformers import OlmoHybridConfig

    hf = OlmoHybridConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, linear_num_key_heads=2,
                          linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=16,
                          intermediate_size=64, vocab_size=100)
    whole = _read_both_ways(_saved(tmp_path, hf), "olmo_hybrid", False)
    m = whole.mixer  # the whole model (attention and MLP layers too), its Gated DeltaNet shapes in mixer
    assert m.layer_types == tuple(hf.layer_types) and whole.n_layers == 4
    assert (m.d_model, m.num_k_heads, m.num_v_heads, m.k_head_dim, m.v_head_dim, m.d_ff, m.n_heads,
            m.vocab_size) == (32, 2, 4, 8, 16, 64, 4, 100)


def test_jamba(tmp_path: Path) -> None:
    from transformers import JambaConfig

    hf = JambaConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=48, num_experts=4, num_experts_per_tok=2, attn_layer_period=2,
                     attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=0, mamba_d_state=8,
                     vocab_size=16)
    m = _read_both_ways(_saved(tmp_path, hf), "jamba", False)
    assert m.layer_types == tuple(KINDS[t] + ("-moe" if e > 1 else "")
                                  for t, e in zip(hf.layers_block_type, hf.layers_num_experts))
    assert m.layer_types == ("mamba-moe", "attention", "mamba-moe", "attention")
    assert (m.d_model, m.n_heads, m.n_kv_heads, m.d_ff, m.n_experts, m.top_k, m.mamba_d_state,
            m.vocab_size) == (32, 4, 2, 48, 4, 2, 8, 16)


def test_granite_moe_hybrid(tmp_path: Path) -> None:
    from transformers import GraniteMoeHybridConfig

    hf = GraniteMoeHybridConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                intermediate_size=16, shared_intermediate_size=24, num_local_experts=4,
                                num_experts_per_tok=2, mamba_n_heads=8, mamba_d_state=8, mamba_chunk_size=4,
                                vocab_size=16, layer_types=["mamba", "attention", "mamba", "mamba"])
    m = _read_both_ways(_saved(tmp_path, hf), "granitemoehybrid", True)
    assert m.layer_types == tuple(KINDS[t] + "-moe" for t in hf.layer_types)
    assert (m.d_model, m.n_heads, m.n_kv_heads, m.d_ff, m.shared_d_ff, m.n_experts, m.top_k, m.mamba_heads,
            m.mamba_headdim, m.mamba_d_state, m.vocab_size) == (32, 4, 2, 16, 24, 4, 2, 8, 8, 8, 16)
