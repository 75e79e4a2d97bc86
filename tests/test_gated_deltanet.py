"""Gated DeltaNet (OLMo-Hybrid's linear attention) as a cascade: both forms against transformers'
OlmoHybridModel (random weights, float32, CPU torch path), prefill then decode steps through
the cache; the two forms against each other; the IR's new self-reads; the preset; bad input."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from mambalaya.einsum import dump_cascade, loads_cascade
from mambalaya.errors import SpecError
from mambalaya.execute import carry_states, execute
from mambalaya.fusion.edges import FUSION_CLASSES, classify_edges
from mambalaya.workloads import PRESETS, build_layer, load_model_config, resolve_model
from mambalaya.workloads.blocks.gated_deltanet import GatedDeltaNetConfig, gdn_constants, gdn_layer, parse_gdn_config
from mambalaya.workloads.hf.weights_gdn import gdn_config_from_hf, gdn_state_from_hf, gdn_weights
from mambalaya.workloads.families.olmo_hybrid import OlmoHybridModel

#: Worst relative error (max |ours - theirs| / max |theirs|) allowed against transformers in float32.
TOL = 5e-6


def rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


def _run_hf(*, k_heads: int, v_heads: int, k_dim: int, v_dim: int, seq_len: int, n_decode: int, chunk: int,
            hidden: int = 24, batch: int = 2, seed: int = 0, neg_eigval: bool = True) -> dict:
    """transformers' OlmoHybridModel with a GatedDeltaNet layer 0 (and an attention layer 1, the
    config needs one): per step, layer 0's input, ``x + linear_attn(input_layernorm(x))`` and its
    cache (conv state, recurrent state) after the step."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("USE_HUB_KERNELS", "0")  # transformers' torch functions, not a hub kernel
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import DynamicCache
    from transformers.models.olmo_hybrid import modeling_olmo_hybrid as mod
    from transformers.models.olmo_hybrid.configuration_olmo_hybrid import OlmoHybridConfig

    config = OlmoHybridConfig(
        vocab_size=16, pad_token_id=0, hidden_size=hidden, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        layer_types=["linear_attention", "full_attention"], linear_num_key_heads=k_heads,
        linear_num_value_heads=v_heads, linear_key_head_dim=k_dim, linear_value_head_dim=v_dim,
        linear_allow_neg_eigval=neg_eigval, rms_norm_eps=1e-6, attn_implementation="eager")
    torch.manual_seed(seed)
    model = mod.OlmoHybridModel(config).eval()
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.from_numpy(np.log(rng.uniform(0.5, 4.0, p.shape))))
            elif name.endswith("dt_bias"):
                p.copy_(torch.from_numpy(rng.normal(0.0, 0.5, p.shape)))
            elif name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.copy_(torch.from_numpy(rng.uniform(0.5, 1.5, p.shape)))
            else:
                p.copy_(torch.from_numpy(rng.normal(0.0, 1.0 / math.sqrt(p.shape[-1]), p.shape)))
    layer = model.layers[0]
    seen: dict[str, list] = {"x": [], "mix": []}
    layer.register_forward_hook(lambda m, a, kw, out: seen["x"].append(a[0].numpy().copy()), with_kwargs=True)
    layer.linear_attn.register_forward_hook(lambda m, a, kw, out: seen["mix"].append(out.numpy().copy()),
                                            with_kwargs=True)
    x = rng.standard_normal((batch, seq_len + n_decode, hidden)).astype(np.float32)
    cache = DynamicCache(config=config)
    states = []
    with torch.no_grad():
        for start, stop in [(0, seq_len)] + [(seq_len + s, seq_len + s + 1) for s in range(n_decode)]:
            model(inputs_embeds=torch.from_numpy(x[:, start:stop]), cache=cache, use_cache=True,
                  position_ids=torch.arange(start, stop).unsqueeze(0))
            states.append((cache.get_conv_state(0).numpy().copy(), cache.get_recurrent_state(0).numpy().copy()))
    sd = {k[len("layers.0.linear_attn."):]: v.numpy().copy() for k, v in model.state_dict().items()
          if k.startswith("layers.0.linear_attn.")}
    gdn = GatedDeltaNetConfig(d_model=hidden, layer_types=("linear_attention", "full_attention"),
                              num_k_heads=k_heads, num_v_heads=v_heads, k_head_dim=k_dim, v_head_dim=v_dim,
                              chunk_size=chunk, beta_scale=2.0 if neg_eigval else 1.0, norm_eps=1e-6, d_ff=32,
                              n_heads=4, n_kv_heads=4, vocab_size=16)
    weights = gdn_weights(gdn, sd, model.state_dict()["layers.0.input_layernorm.weight"])
    return {"config": gdn, "weights": weights, "inputs": seen["x"],
            "outputs": [a + b for a, b in zip(seen["x"], seen["mix"])], "states": states}


def _run_ours(ref: dict, scan: str) -> tuple[list[np.ndarray], list[dict]]:
    """Our prefill (``scan`` form, states out) then recurrent decode steps carrying the states."""
    cfg, outputs, carried, states = ref["config"], [], None, []
    for n, x in enumerate(ref["inputs"]):
        phase = "prefill" if n == 0 else "decode"
        c = gdn_layer(cfg, batch=x.shape[0], seq_len=x.shape[1], phase=phase, state_io=True,
                      scan=scan if n == 0 else "recurrent")
        if carried is None:
            carried = {t: np.zeros(c.shape(t), np.float32) for t in ("CSQ0", "CSK0", "CSV0", "H0")}
        result = execute(c, {"X": x, **ref["weights"], **gdn_constants(c), **carried}, dtype="float32")
        xo = result["XO"]
        if xo.ndim == 4:  # the chunked form's [B, C, Q, D]
            xo = xo.reshape(xo.shape[0], -1, xo.shape[3])[:, : x.shape[1]]
        outputs.append(xo)
        carried = carry_states(c, result)
        states.append(carried)
    return outputs, states


CASES = {  # name: (k heads, v heads, k dim, v dim, prompt, chunk)
    "gqa-ragged": (2, 4, 8, 6, 11, 4),
    "equal-heads": (3, 3, 4, 8, 8, 4),
    "one-chunk": (1, 2, 6, 4, 5, 8),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("scan", ["recurrent", "chunked"])
def test_both_forms_match_transformers_prefill_and_decode(case: str, scan: str) -> None:
    """The layer's output (x + GatedDeltaNet(norm(x))) after the prefill and 3 decode steps, and
    the conv and recurrent states carried between them, equal transformers' within 5e-6 (measured: at most 7e-7)."""
    k, v, kd, vd, L, chunk = CASES[case]
    ref = _run_hf(k_heads=k, v_heads=v, k_dim=kd, v_dim=vd, seq_len=L, n_decode=3, chunk=chunk)
    outputs, states = _run_ours(ref, scan)
    errors = [rel_err(a, b) for a, b in zip(outputs, ref["outputs"])]
    assert len(errors) == 4 and max(errors) <= TOL, errors
    for ours, (conv, rec) in zip(states, ref["states"]):
        theirs = gdn_state_from_hf(ref["config"], conv, rec)
        assert set(ours) == set(theirs)
        assert max(rel_err(ours[t], theirs[t]) for t in theirs) <= TOL


def test_beta_scale_follows_allow_neg_eigval() -> None:
    """linear_allow_neg_eigval=False (beta in (0, 1), as Qwen3-Next) also matches; and the 2x
    matters: running it with beta_scale 2 does not."""
    ref = _run_hf(k_heads=2, v_heads=2, k_dim=4, v_dim=4, seq_len=6, n_decode=1, chunk=4, neg_eigval=False)
    outputs, _ = _run_ours(ref, "chunked")
    assert max(rel_err(a, b) for a, b in zip(outputs, ref["outputs"])) <= TOL
    ref["config"] = ref["config"].model_copy(update={"beta_scale": 2.0})
    wrong, _ = _run_ours(ref, "chunked")
    assert rel_err(wrong[0], ref["outputs"][0]) > 1e-3


def test_chunked_equals_recurrent_in_float64() -> None:
    """Two forms, one function: every output and state agree to 1e-11 (float64, random input,
    a nonzero incoming state, L not a multiple of the chunk)."""
    cfg = GatedDeltaNetConfig(d_model=12, layer_types=("linear_attention",) * 2 + ("full_attention",),
                              num_k_heads=2, num_v_heads=4, k_head_dim=4, v_head_dim=3, chunk_size=4, d_ff=8,
                              n_heads=2, n_kv_heads=2, vocab_size=8)
    rng = np.random.default_rng(3)
    rec = gdn_layer(cfg, batch=2, seq_len=10, state_io=True)
    chk = gdn_layer(cfg, batch=2, seq_len=10, state_io=True, scan="chunked")
    arrays = {t: rng.normal(0, 0.5, rec.shape(t)) for t in rec.external_tensors()}
    arrays["A"] = -rng.uniform(0.1, 1.0, rec.shape("A"))
    a = execute(rec, arrays, dtype="float64")
    b = execute(chk, {**arrays, **gdn_constants(chk)}, dtype="float64")
    xo = b["XO"].reshape(2, -1, 12)[:, :10]
    assert np.max(np.abs(xo - a["XO"])) <= 1e-11 * np.max(np.abs(a["XO"]))
    for t in ("HN", "CSQN", "CSKN", "CSVN"):
        assert np.max(np.abs(a[t] - b[t])) <= 1e-11 * np.max(np.abs(a[t]))


def test_history_recurrence_is_forward_substitution() -> None:
    """TI, the IR's history read, is the inverse of I + AS (a triangular solve) on its own."""
    cfg = PRESETS["olmo-hybrid"].model_copy(update={"chunk_size": 8})
    c = gdn_layer(cfg.model_copy(update={"d_model": 8, "num_k_heads": 1, "num_v_heads": 1, "k_head_dim": 4,
                                         "v_head_dim": 4}), batch=1, seq_len=8, scan="chunked")
    rng = np.random.default_rng(1)
    arrays = {t: rng.normal(0, 0.5, c.shape(t)) for t in c.external_tensors()}
    arrays.update(gdn_constants(c), A=-rng.uniform(0.1, 1.0, c.shape("A")))
    out = execute(c, arrays, dtype="float64", keep="all")
    a, ti = out["AS"][0, 0, :, :, 0, 0], out["TI"][0, 0, :, :, 0, 0]
    assert np.allclose(np.tril(a, -1), a) and np.abs(a).max() > 0.1
    assert np.max(np.abs(ti @ (np.eye(8) + a) - np.eye(8))) <= 1e-12


@pytest.mark.parametrize("scan", ["recurrent", "chunked"])
@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_every_edge_is_classified_and_the_text_round_trips(scan: str, phase: str) -> None:
    if phase == "decode" and scan == "chunked":
        return
    c = gdn_layer(PRESETS["olmo-hybrid"], batch=1, seq_len=128, phase=phase, scan=scan, state_io=True)
    edges = classify_edges(c)
    assert edges and all(e.fusion_class in FUSION_CLASSES and e.dependency for e in edges)
    deps = {(e.producer, e.consumer): e.dependencies for e in edges}
    if scan == "recurrent":
        assert deps[("H", "H")] == ("recurrent(I, distance 1)", "recurrent(N, contracted)")
        assert c.contracted_state_ranks(c.einsum("H")) == ("N",)
    else:
        assert deps[("TI", "TI")] == ("recurrent(Q, history)",) and c.recurrence(c.einsum("TI")) == ("Q", 64)
        assert deps[("HC", "HC")] == ("recurrent(C, distance 1)", "recurrent(N, contracted)")
    assert loads_cascade(dump_cascade(c)).einsums == c.einsums


def test_the_tiling_search_keeps_a_contracted_state_whole() -> None:
    from mambalaya.search.candidates import tileable_ranks

    c = gdn_layer(PRESETS["olmo-hybrid"], batch=2, seq_len=1, phase="decode")
    assert "N" not in tileable_ranks(c, ["H"]) and "P" in tileable_ranks(c, ["H"])


def test_preset_sizes_and_parameter_counts() -> None:
    """olmo-hybrid's layer: our cascade's weights = the formula = transformers' module
    (built on the meta device from the preset's config); the whole model likewise."""
    cfg = PRESETS["olmo-hybrid"]
    assert (cfg.n_layers, cfg.key_dim, cfg.value_dim, cfg.state_elements()) == (24, 2880, 5760, 30 * 96 * 192)
    c = build_layer(cfg, phase="prefill", seq_len=64, batch=1)
    assert c.parameters() == cfg.layer_parameters() == 88_754_172
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.olmo_hybrid import modeling_olmo_hybrid as mod
    from transformers.models.olmo_hybrid.configuration_olmo_hybrid import OlmoHybridConfig

    hf = OlmoHybridConfig()  # its defaults are OLMo-Hybrid-7B's sizes
    assert gdn_config_from_hf({**hf.to_dict(), "model_type": "olmo_hybrid"}) == cfg
    with torch.device("meta"):
        block = mod.OlmoHybridLinearAttentionDecoderLayer(hf, 0)
        model = mod.OlmoHybridForCausalLM(hf)
    mixer = sum(p.numel() for p in block.linear_attn.parameters()) + hf.hidden_size
    assert mixer == cfg.layer_parameters()
    assert sum(p.numel() for p in model.parameters()) == cfg.model_parameters() == 7_430_870_688


def _hf_config(**fields) -> dict:
    return {"model_type": "olmo_hybrid", "hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
            "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8,
            "linear_value_head_dim": 8, "intermediate_size": 64, "vocab_size": 100, **fields}


def test_config_json_is_read_and_bad_fields_are_named(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_hf_config()))
    whole = load_model_config(path)  # the whole OLMo-Hybrid model, not only its Gated DeltaNet layers
    assert isinstance(whole, OlmoHybridModel) and whole.layer_types.count("attention") == 1
    cfg = whole.mixer
    assert resolve_model(str(path)) == whole and cfg.heads_per_group == 2 and cfg.beta_scale == 2.0
    bad = {
        "layer_types": (_hf_config(layer_types=["linear_attention", "mamba", "full_attention", "linear_attention"]),
                        r"field layer_types\[1\] is 'mamba'"),
        "heads": (_hf_config(linear_num_key_heads=3, linear_num_value_heads=4),
                  "field linear_num_key_heads = 3 does not divide linear_num_value_heads = 4"),
        "k dim": (_hf_config(linear_key_head_dim=0), "field linear_key_head_dim must be a positive integer"),
        "count": (_hf_config(layer_types=["linear_attention", "full_attention"]),
                  "field layer_types lists 2 layers but num_hidden_layers is 4"),
    }
    for name, (data, message) in bad.items():
        path.write_text(json.dumps(data))
        with pytest.raises(SpecError, match=message) as info:
            load_model_config(path)
        assert str(path) in str(info.value), name


def test_bad_configs_weights_and_states_get_one_clear_error() -> None:
    with pytest.raises(SpecError, match="num_v_heads = 6 is not a multiple of num_k_heads = 4"):
        parse_gdn_config({**PRESETS["olmo-hybrid"].model_dump(), "num_v_heads": 6, "num_k_heads": 4})
    small = GatedDeltaNetConfig(d_model=8, layer_types=("linear_attention",), num_k_heads=1, num_v_heads=2,
                                k_head_dim=4, v_head_dim=2, d_ff=8, n_heads=2, n_kv_heads=2, vocab_size=8)
    rng = np.random.default_rng(0)
    good = {"q_proj.weight": rng.normal(size=(4, 8)), "k_proj.weight": rng.normal(size=(4, 8)),
            "v_proj.weight": rng.normal(size=(4, 8)), "g_proj.weight": rng.normal(size=(4, 8)),
            "a_proj.weight": rng.normal(size=(2, 8)), "b_proj.weight": rng.normal(size=(2, 8)),
            "o_proj.weight": rng.normal(size=(8, 4)), "conv1d.weight": rng.normal(size=(12, 1, 4)),
            "A_log": np.zeros(2), "dt_bias": np.zeros(2), "o_norm.weight": np.ones(2)}
    assert set(gdn_weights(small, good, np.ones(8))) >= {"WQ", "WCV", "WO"}
    wrong_k = {**good, "q_proj.weight": rng.normal(size=(6, 8))}  # a k head dim of 6, not the config's 4
    with pytest.raises(SpecError, match=r"q_proj.weight has shape \(6, 8\); the config makes it \(4, 8\)"):
        gdn_weights(small, wrong_k, np.ones(8))
    with pytest.raises(SpecError, match="lack 'A_log'"):
        gdn_weights(small, {k: v for k, v in good.items() if k != "A_log"}, np.ones(8))
    with pytest.raises(SpecError, match=r"decode step \(I = 1\) uses the recurrent scan"):
        gdn_layer(small, batch=1, seq_len=1, phase="decode", scan="chunked")
    with pytest.raises(SpecError, match="layer_type applies to hybrid models"):
        build_layer(small, phase="prefill", seq_len=4, batch=1, layer_type="attention")


def test_the_delta_rule_update_is_counted_factored() -> None:
    """H's contraction KB[n]*AD*H[p,m]*KN[m] is P*M MACs per head and position (the factors
    without m multiply the sum once per output point), not P*N*M."""
    from mambalaya.einsum.stats import einsum_ops

    cfg = PRESETS["olmo-hybrid"]
    c = gdn_layer(cfg, batch=2, seq_len=8)
    points = 2 * 8 * cfg.num_v_heads * cfg.v_head_dim * cfg.k_head_dim
    ops = einsum_ops(c, c.einsum("H"))
    assert ops["mac"] == points and ops["mul"] == 4 * points and ops["add"] == 2 * points


@pytest.mark.parametrize("scan", ["recurrent", "chunked"])
def test_the_tiled_executor_runs_searched_mappings_and_moves_the_bytes_the_model_counts(scan: str) -> None:
    """Each named mapping at a few buffers: outputs equal the untiled run, and the off-chip and
    buffer bytes the tiled run moves equal the model's, its on-chip peak within the footprint."""
    from mambalaya.execute import run_tiled
    from mambalaya.cost.buffer import group_buffer_accesses
    from mambalaya.search.mappings import named_mapping
    from mambalaya.cost.traffic import mapping_traffic

    cfg = GatedDeltaNetConfig(d_model=12, layer_types=("linear_attention",) * 2 + ("full_attention",),
                              num_k_heads=2, num_v_heads=4, k_head_dim=4, v_head_dim=3, chunk_size=4, d_ff=8,
                              n_heads=2, n_kv_heads=2, vocab_size=8)
    rng = np.random.default_rng(5)
    c = gdn_layer(cfg, batch=2, seq_len=16, scan=scan)
    arrays = {t: rng.normal(0, 0.5, c.shape(t)) for t in c.external_tensors()}
    arrays["A"] = -rng.uniform(0.1, 1.0, c.shape("A"))
    arrays.update(gdn_constants(c))
    ref = execute(c, arrays, dtype="float64")
    tiled_groups = 0
    for name in ("ssm-ri", "stitched", "optimal"):
        for buffer in (4096, 1024):
            m = named_mapping(name, c, buffer)
            run = run_tiled(c, m, arrays)
            for t, want in ref.items():
                assert np.max(np.abs(run.outputs[t] - want)) <= 1e-12 * (np.max(np.abs(want)) or 1.0), (name, t)
            for g in mapping_traffic(c, m).groups:
                assert (run.group_read_bytes(g.group), run.group_write_bytes(g.group)) == (g.read_bytes, g.write_bytes)
                assert run.onchip_peak_bytes[g.group] <= g.footprint_bytes
            for group in m.groups:
                buf = group_buffer_accesses(c, group)
                assert run.group_buffer_bytes(group.name) == (buf.read_bytes, buf.write_bytes), (name, group.einsums)
                tiled_groups += bool(group.loops)
    assert tiled_groups >= 6


# ---------------------------------------------------------------------------------------------
# precision: the reference-kernels policy's gated_deltanet entries (fla's kernels)


@pytest.mark.parametrize("phase, scan", [("prefill", "recurrent"), ("prefill", "chunked"), ("decode", "recurrent")])
def test_reference_kernels_keep_the_state_and_decays_in_float32(phase: str, scan: str) -> None:
    model = PRESETS["olmo-hybrid"]
    kw = dict(phase=phase, seq_len=1 if phase == "decode" else 128, batch=1, scan=scan,
              state_io=True if phase == "prefill" else None)
    ref = build_layer(model, precision="reference-kernels", **kw)
    uni = build_layer(model, precision="uniform", **kw)
    assert {s.bits for s in uni.tensors.values()} == {16}
    bits = {n: s.bits for n, s in ref.tensors.items()}
    wide = {"H0", "HN", "GL", "A", "SS", "RS", "SG", "RG", "GZ"}
    wide |= {"ACS", "LD", "DO", "DC", "CD", "KK", "QK", "AS", "YI", "YO"} if scan == "chunked" else {"H", "AD", "KB"}
    for name in wide & set(bits):
        assert bits[name] == 32, name
    assert {"H0", "ACS" if scan == "chunked" else "H"} <= set(bits)
    # written by fla in the model dtype: the activations, TI, U, W, the chunk-boundary states and
    # the output; the residual stream stays in the model dtype in OLMo-Hybrid
    for name in {"X", "XO", "XN", "QN", "KN", "V", "BETA", "TI", "U", "W", "HC", "YD", "YN", "WQ"} & set(bits):
        assert bits[name] == 16, name
    # a design of another width moves only the 'design' tensors
    eight = build_layer(model, precision="reference-kernels", bits=8, **kw)
    assert {n for n, s in eight.tensors.items() if s.bits == 32} == {n for n, b in bits.items() if b == 32}


def test_a_policy_naming_no_gated_deltanet_tensor_is_refused(tmp_path) -> None:
    from mambalaya.workloads.precision import load_policy

    path = tmp_path / "p.yaml"
    path.write_text("name: p\nfamilies: {gated_deltanet: {H: 32, DELTA: 32}}\n")
    with pytest.raises(SpecError, match="families.gated_deltanet.DELTA"):
        load_policy(path)
    path.write_text("name: p\nfamilies: {gated_deltanet: {HC: 32}}\n")
    c = build_layer(PRESETS["olmo-hybrid"], phase="prefill", seq_len=128, batch=1, scan="chunked", precision=path)
    assert c.tensors["HC"].bits == 32 and c.tensors["H0" if "H0" in c.tensors else "ACS"].bits == 16


def test_cascade_show_with_reference_kernels() -> None:
    from typer.testing import CliRunner

    from mambalaya.cli import app

    r = CliRunner().invoke(app, ["cascade", "show", "--model", "olmo-hybrid", "--seq-len", "256",
                                 "--precision", "reference-kernels", "--format", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["provenance"]["precision"] == "reference-kernels"
    r = CliRunner().invoke(app, ["cascade", "show", "--model", "olmo-hybrid", "--precision", "reference-kernels"])
    assert r.exit_code == 0 and "reference-kernels" in r.output, r.output


def test_the_ssm_ri_mapping_names_the_region_it_fuses() -> None:
    """ssm-ri's description names the cascade's own ssm region, not Mamba-1's tensors."""
    from mambalaya.search.mappings import named_mapping

    c = build_layer(PRESETS["olmo-hybrid"], phase="prefill", seq_len=64, batch=1)
    m = named_mapping("ssm-ri", c, None)
    region = [e.name for e in c.einsums if e.name in set(c.regions["ssm"])]
    assert m.description.startswith(f"RI fusion of {', '.join(region)} ") and "AD, BX" not in m.description
