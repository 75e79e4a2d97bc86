"""Evaluating hybrid models: whole-model latency from the layer types, the mapping each layer
type runs on each design, the CLI (evaluate, compare, cascade commands, sweeps) and
`reproduce --suite hybrid`."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from typer.testing import CliRunner

from mambalaya.cli import app
from mambalaya.experiments.hybrid import evaluate_hybrid, layer_mapping
from mambalaya.experiments.sweep import SweepSpec, evaluate_point
from mambalaya.arch import load_arch
from mambalaya.workloads import build_layer, resolve_model
from mambalaya.workloads.families.bamba import HybridConfig

runner = CliRunner()

#: A small Bamba-shaped model (every field of the family), fast to evaluate.
SMALL = HybridConfig(d_model=256, layer_types=("mamba", "mamba", "attention", "mamba"), d_ff=512, n_heads=4,
                     n_kv_heads=2, mamba_heads=8, mamba_headdim=64, mamba_d_state=16, mamba_chunk_size=64,
                     vocab_size=1000)


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_whole_model_latency_is_the_sum_over_layer_types(phase: str) -> None:
    ev = evaluate_hybrid("mambalaya", "small", SMALL, phase=phase, seq_len=512, batch=2)
    assert {t: e.result.n_layers for t, e in ev.layers.items()} == {"mamba": 3, "attention": 1}
    total = sum(e.result.n_layers * e.result.latency_s for e in ev.layers.values())
    assert math.isclose(ev.model_latency_s, total, rel_tol=1e-12)
    assert math.isclose(ev.share_of_time("mamba") + ev.share_of_time("attention"), 1.0, rel_tol=1e-12)
    positions = 1 if phase == "decode" else 512
    assert math.isclose(ev.tokens_per_s, 2 * positions / ev.model_latency_s)
    if phase == "prefill":  # the Mamba layers run the faster scan form
        forms = {scan: evaluate_hybrid("mambalaya", "small", SMALL, phase=phase, seq_len=512, batch=2, scan=scan)
                 for scan in ("chunked", "recurrent")}
        assert ev.layers["mamba"].result.latency_s == min(f.layers["mamba"].result.latency_s for f in forms.values())


def test_an_unfused_hybrid_layer_costs_its_mixer_and_mlp_blocks_run_apart() -> None:
    """Unfused, a hybrid layer (one chained cascade) costs exactly what its Mamba-2 and MLP
    blocks cost as separate cascades: an independent check of the chaining and the sum."""
    from mambalaya.cost.latency import layer_latency
    from mambalaya.search.mappings import named_mapping
    from mambalaya.workloads.blocks.mamba2 import mamba2_layer
    from mambalaya.workloads.blocks.mlp import mlp_layer

    spec = load_arch("marca-ideal")
    ev = evaluate_hybrid(spec, "small", SMALL, phase="prefill", seq_len=256, batch=2, scan="recurrent",
                         precision="uniform", mapping="unfused")
    buffer = spec.memory.onchip_buffer_bytes
    parts = [mamba2_layer(SMALL.mamba2(), batch=2, seq_len=256, state_io=True, scan="recurrent"),
             mlp_layer(SMALL.mlp(), batch=2, seq_len=256)]
    apart = sum(layer_latency(spec, c, named_mapping("unfused", c, buffer, arch=spec)).latency_s for c in parts)
    assert math.isclose(ev.layers["mamba"].result.latency_s, apart, rel_tol=1e-12)
    assert ev.layers["mamba"].result.n_layers == 3


def test_each_layer_type_runs_the_designs_mapping_and_attention_is_unfused_on_the_baselines() -> None:
    mappings = {}
    for arch in ("mambalaya", "marca-ideal", "geens-ideal"):
        ev = evaluate_hybrid(arch, "small", SMALL, phase="decode", seq_len=1024, batch=2)
        mappings[arch] = {t: e.mapping.name for t, e in ev.layers.items()}
    assert mappings == {"mambalaya": {"mamba": "optimal", "attention": "optimal"},
                        "marca-ideal": {"mamba": "unfused", "attention": "unfused"},
                        "geens-ideal": {"mamba": "ssm-ri", "attention": "unfused"}}
    spec = load_arch("geens-ideal")
    assert layer_mapping(spec, "attention", None) == "unfused" and layer_mapping(spec, "attention", "stitched") == "stitched"
    # on Mambalaya the searched attention is no slower than the unfused one on the same design
    fused = evaluate_hybrid("mambalaya", "small", SMALL, phase="decode", seq_len=1024, batch=2)
    unfused = evaluate_hybrid("mambalaya", "small", SMALL, phase="decode", seq_len=1024, batch=2, mapping="unfused")
    assert fused.layers["attention"].result.latency_s <= unfused.layers["attention"].result.latency_s
    assert fused.model_latency_s < unfused.model_latency_s


def test_attention_share_grows_with_the_context() -> None:
    shares = [evaluate_hybrid("marca-ideal", "small", SMALL, phase=phase, seq_len=L, batch=1).share_of_time("attention")
              for phase in ("prefill", "decode") for L in (256, 4096)]
    assert shares[0] < shares[1] and shares[2] < shares[3]


def test_build_layer_needs_a_layer_type_for_a_hybrid_model() -> None:
    from mambalaya.errors import SpecError

    with pytest.raises(SpecError, match="name the one to build"):
        build_layer(SMALL, phase="prefill", seq_len=64, batch=1)
    c = build_layer(SMALL, phase="prefill", seq_len=64, batch=1, layer_type="attention", precision="reference-kernels")
    assert "FF_XO" in c.output_tensors() and c.tensors["X"].bits == 16
    with pytest.raises(SpecError, match="layer_type applies to hybrid models"):
        build_layer(resolve_model("mamba-130m"), phase="prefill", seq_len=64, batch=1, layer_type="mamba")


def test_cli_evaluate_compare_and_cascade_commands_take_a_hybrid_model(tmp_path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "bamba", "hidden_size": 256, "num_hidden_layers": 4,
                                  "attn_layer_indices": [2], "num_attention_heads": 4, "num_key_value_heads": 2,
                                  "intermediate_size": 512, "mamba_n_heads": 8, "mamba_d_state": 16,
                                  "mamba_chunk_size": 64, "vocab_size": 1000}))
    assert resolve_model(str(config)) == SMALL
    out = runner.invoke(app, ["evaluate", "--model", str(config), "--phase", "decode", "-L", "1024", "--batch", "1",
                              "--format", "json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert set(doc["layers"]) == {"mamba", "attention"} and doc["totals"]["n_layers"] == 4
    assert doc["provenance"]["mappings"] == {"mamba": "optimal", "attention": "optimal"}
    # a layer type's totals say they are its layers' (they were named as the model's), and add up to it
    per_type = [doc["layers"][t]["totals"] for t in ("mamba", "attention")]
    assert all("model_latency_s" not in t and "tokens_per_s" not in t for t in per_type)
    assert sum(t["layers_latency_s"] for t in per_type) == pytest.approx(doc["totals"]["model_latency_s"])
    assert sum(t["layers_energy_j"] for t in per_type) == pytest.approx(doc["totals"]["model_energy_j"])
    assert sum(doc["model_energy_by_component_j"].values()) == pytest.approx(doc["totals"]["model_energy_j"])
    assert all("energy_pj" in row for t in ("mamba", "attention") for row in doc["layers"][t]["einsums"])
    out = runner.invoke(app, ["evaluate", "--model", str(config), "--phase", "decode", "-L", "1024", "--batch", "1"])
    assert out.exit_code == 0 and "model (4 layers)" in out.output and "of the time, mapping optimal" in out.output
    out = runner.invoke(app, ["compare", "--archs", "mambalaya,marca-ideal", "--model", str(config), "--seq-lens",
                              "256,1024", "--batch", "1", "--phase", "decode", "--format", "csv"])
    assert out.exit_code == 0, out.output
    rows = pd.read_csv(pd.io.common.StringIO(out.output))
    assert sorted(set(rows["seq_len"])) == [256, 1024]  # a hybrid decode step depends on the KV cache's length
    assert (rows[rows["arch"] == "marca-ideal"]["speedup_vs_marca-ideal"] == 1.0).all()
    out = runner.invoke(app, ["cascade", "show", "--model", str(config), "--layer-type", "attention", "-L", "64"])
    assert out.exit_code == 0 and "FF_XO" in out.output and "1 attention layers" in out.output
    out = runner.invoke(app, ["fusion", "map", "--model", str(config), "--layer-type", "mamba", "-L", "64",
                              "--mapping", "stitched"])
    assert out.exit_code == 0, out.output
    out = runner.invoke(app, ["cascade", "show", "--model", str(config)])
    assert out.exit_code == 1 and "--layer-type" in out.output
    out = runner.invoke(app, ["evaluate", "--model", str(config), "--objective", "energy"])
    assert out.exit_code == 1 and "searched for latency" in out.output


def test_a_bad_hybrid_config_file_names_the_field(tmp_path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "bamba", "hidden_size": 256, "num_hidden_layers": 2,
                                  "layers_block_type": ["mamba", "sliding_attention"], "num_attention_heads": 4,
                                  "num_key_value_heads": 2,
                                  "intermediate_size": 512, "mamba_n_heads": 8, "mamba_d_state": 16}))
    out = runner.invoke(app, ["evaluate", "--model", str(config)])
    assert out.exit_code == 1
    assert "layers_block_type[1] is 'sliding_attention', not a layer type of the Bamba family" in out.output
    assert str(config) in out.output.replace("\n", "")


def test_sweep_points_of_a_hybrid_model(tmp_path) -> None:
    path = tmp_path / "small.yaml"
    path.write_text(SMALL.model_dump_json())
    spec = SweepSpec("h", tmp_path / "s.sqlite", {"model": [str(path), "mamba-130m"], "phase": ["decode"],
                                                   "seq_len": [256, 1024], "batch": [1]})
    points = spec.points()
    assert sorted((p["model"] == str(path), p["seq_len"]) for p in points) == [(False, 1), (True, 256), (True, 1024)]
    point = next(p for p in points if p["model"] == str(path))
    out = evaluate_point(point)
    assert 0 < out["attention_share"] < 1 and out["mapping_used"] == "mamba:optimal attention:optimal"
    direct = evaluate_hybrid("mambalaya", "small", SMALL, phase="decode", seq_len=point["seq_len"], batch=1)
    assert out["model_latency_s"] == direct.model_latency_s
    assert out["attention_share"] == direct.share_of_time("attention")
    # the worker reuses the decode step's Mamba layer at the other length (the same numbers as a fresh search)
    from mambalaya.experiments.sweep import HYBRID_LAYERS

    hits = HYBRID_LAYERS.hits
    other = next(p for p in points if p["model"] == str(path) and p is not point)
    again = evaluate_point(other)
    assert HYBRID_LAYERS.hits >= hits + 1
    fresh = evaluate_hybrid("mambalaya", "small", SMALL, phase="decode", seq_len=other["seq_len"], batch=1)
    assert again["model_latency_s"] == fresh.model_latency_s


def test_reproduce_hybrid_suite_writes_tables_figures_and_reports(tmp_path) -> None:
    out = runner.invoke(app, ["reproduce", "--suite", "hybrid", "--models", "bamba-9b", "--seq-lens", "2048", "--batch",
                              "1", "--workers", "1", "--out", str(tmp_path)])
    assert out.exit_code == 0, out.output
    folder = tmp_path / "hybrid"
    latency = pd.read_csv(folder / "hybrid_latency.csv")
    speedups = pd.read_csv(folder / "hybrid_speedups.csv")
    assert sorted(set(latency["arch"])) == ["geens-ideal", "gpu-h100", "mambalaya", "marca-ideal"]
    assert len(latency) == 2 * 4 and set(latency["phase"]) == {"prefill", "decode"}
    row = latency[(latency["arch"] == "marca-ideal") & (latency["phase"] == "prefill")].iloc[0]
    mine = latency[(latency["arch"] == "mambalaya") & (latency["phase"] == "prefill")].iloc[0]
    s = speedups[(speedups["baseline"] == "marca-ideal") & (speedups["phase"] == "prefill")].iloc[0]
    assert math.isclose(s["speedup"], row["model_latency_s"] / mine["model_latency_s"])
    assert row["attention_mapping"] == "unfused" and mine["attention_mapping"] == "optimal"
    report = (folder / "report.md").read_text()
    assert "Attention layers run unfused on MARCA and Geens et al." in report
    assert "with the best fusion our engine finds on Mambalaya" in report
    assert (folder / "report.html").exists()
    assert sorted(p.name for p in (folder / "figures").iterdir()) == [
        "bamba-9b_speedup_vs_attention_share.png", "bamba-9b_speedup_vs_attention_share.svg",
        "bamba-9b_speedup_vs_length.png", "bamba-9b_speedup_vs_length.svg"]
    bad = runner.invoke(app, ["reproduce", "--suite", "hybrid", "--models", "mamba-130m", "--out", str(tmp_path)])
    assert bad.exit_code == 1 and "is not a hybrid model" in bad.output


def test_commands_that_cover_mamba_models_only_say_so_for_a_hybrid(tmp_path) -> None:
    from mambalaya.errors import SpecError
    from mambalaya.specio import parse_yaml_text
    from mambalaya.workloads.blocks.attention import AttentionConfig, attention_layer
    from mambalaya.workloads.precision import apply_policy, cascade_family

    only_mamba = HybridConfig(**{**SMALL.model_dump(), "layer_types": ("mamba", "mamba")})
    with pytest.raises(SpecError, match="it has no 'attention' layer"):
        build_layer(only_mamba, phase="prefill", seq_len=64, batch=1, layer_type="attention")
    for args, needle in ((["reproduce", "--models", "bamba-9b", "--out", str(tmp_path)], "--suite hybrid"),
                         (["sensitivity", "--model", "bamba-9b"], "the sensitivity study covers Mamba models"),
                         (["export", "accelforge", "--model", "bamba-9b", "--phase", "decode", "-o", str(tmp_path)],
                          "the AccelForge export covers Mamba-1 and Mamba-2"),
                         (["export", "accelforge", "--model", "olmo-hybrid", "--unroll-scan", "4", "-o", str(tmp_path)],
                          "a gated_deltanet model: the AccelForge export covers")):  # (it met a padding error)
        out = runner.invoke(app, args)
        assert out.exit_code == 1 and needle in out.output, (args, out.output)
    # a bare attention block takes the hybrid family's widths (softmax statistics in float32)
    block = attention_layer(AttentionConfig(d_model=32, n_heads=4, n_kv_heads=2), batch=1, seq_len=8)
    assert cascade_family(block) == "bamba"
    widened = apply_policy(block, "reference-kernels", 16)
    assert widened.tensors["MX"].bits == 32 and widened.tensors["X"].bits == 16
    # a YAML value error that is not an escape keeps its own message
    with pytest.raises(SpecError, match="not valid YAML: month must be in 1..12"):
        parse_yaml_text("a: 2001-13-01\n", source="s.yaml")


def test_a_layer_costed_again_under_the_same_inputs_is_reused_with_the_same_numbers() -> None:
    """A decode step's Mamba layer does not read the KV cache: at a second context length the
    suite reuses its mapping and cost (CostedLayers), and they equal a fresh search's; the
    attention layer (it reads the cache) and a design that differs in any field are searched."""
    from mambalaya.experiments.evaluate import CostedLayers
    from mambalaya.arch import with_settings

    reuse = CostedLayers()
    first = evaluate_hybrid("mambalaya", "small", SMALL, phase="decode", seq_len=256, batch=2, reuse=reuse)
    assert reuse.hits == 0 and len(reuse.entries) == 2
    second = evaluate_hybrid("mambalaya", "small", SMALL, phase="decode", seq_len=512, batch=2, reuse=reuse)
    assert reuse.hits == 1 and len(reuse.entries) == 3  # the Mamba layer reused, the attention layer searched
    fresh = evaluate_hybrid("mambalaya", "small", SMALL, phase="decode", seq_len=512, batch=2)
    for t in fresh.layers:
        assert second.layers[t].result == fresh.layers[t].result and second.layers[t].mapping == fresh.layers[t].mapping
    assert second.layers["mamba"].result == first.layers["mamba"].result
    other = with_settings(load_arch("mambalaya"), ["memory.onchip_buffer_bytes=1MB"])
    evaluate_hybrid(other, "small", SMALL, phase="decode", seq_len=512, batch=2, reuse=reuse)
    assert reuse.hits == 1 and len(reuse.entries) == 5


@pytest.mark.slow  # long: started first (conftest), not the run's tail
def test_hybrid_suite_on_worker_processes_writes_the_same_tables(tmp_path) -> None:
    """The suite's tasks (each model's decode, then its prefill one length each) on two spawned
    worker processes give the tables the suite computes in one process, row for row."""
    from mambalaya.experiments.hybrid_suite import HybridSuiteConfig, run_hybrid_suite, suite_tasks, suite_workers
    from mambalaya.specio import dump_yaml

    model = tmp_path / "small.yaml"
    model.write_text(dump_yaml(SMALL.model_dump(mode="json")))
    tables = {}
    for workers in (1, 2):
        config = HybridSuiteConfig(models=(str(model),), batch=2, seq_lens=(256, 512), figures=False,
                                   designs=("mambalaya", "marca-ideal"), out=tmp_path / f"w{workers}", workers=workers)
        assert suite_workers(config) == workers
        steps: list[int] = []
        tables[workers] = run_hybrid_suite(config, lambda _msg, n: steps.append(n)).tables["hybrid_latency"]
        assert sum(steps) == 2 * 2 * 2 + 2
    pd.testing.assert_frame_equal(tables[1], tables[2])
    assert list(tables[1][["phase", "seq_len"]].drop_duplicates().itertuples(index=False, name=None)) == [
        ("prefill", 256), ("prefill", 512), ("decode", 256), ("decode", 512)]  # the grid's order, whatever ends first
    assert suite_tasks(config) == [(str(model), "decode", (256, 512)), (str(model), "prefill", (256,)),
                                   (str(model), "prefill", (512,))]
    assert suite_workers(HybridSuiteConfig(models=("bamba-9b",), seq_lens=(2048,), workers=8)) == 2  # never more than its tasks


def test_softmax_option_picks_the_attention_form_and_names_it(tmp_path) -> None:
    """``--softmax blocked`` evaluates a hybrid model's attention layers in FlashAttention's form
    (the cascade's name says so, and its cost differs);
    ``compare`` takes it too; on a model without attention it is refused, naming the model."""
    model = tmp_path / "small.yaml"
    from mambalaya.specio import dump_yaml

    model.write_text(dump_yaml(SMALL.model_dump(mode="json")))
    args = ["evaluate", "--model", str(model), "--arch", "mambalaya", "--mapping", "ideal", "-L", "512", "--batch", "2",
            "--format", "json"]
    runs = {form: runner.invoke(app, args + (["--softmax", form] if form else [])) for form in (None, "blocked")}
    assert all(r.exit_code == 0 for r in runs.values()), [r.output[-400:] for r in runs.values()]
    default, blocked = (json.loads(runs[f].output) for f in (None, "blocked"))
    assert "attention-prefill-blocked" in runs["blocked"].output and "-blocked" not in runs[None].output
    assert blocked["totals"]["model_latency_s"] != default["totals"]["model_latency_s"]
    compared = runner.invoke(app, ["compare", "--model", str(model), "--archs", "gpu-h100,mambalaya", "--baseline",
                                   "gpu-h100", "--seq-lens", "512", "--batch", "2", "--softmax", "online"])
    assert compared.exit_code == 0, compared.output
    refused = runner.invoke(app, ["evaluate", "--model", "mamba-130m", "--softmax", "blocked"])
    assert refused.exit_code == 1 and "model 'mamba-130m' has no attention layers" in refused.output


def test_the_hybrid_suite_takes_the_softmax_form(tmp_path) -> None:
    """``reproduce --suite hybrid --softmax blocked``: every attention layer runs FlashAttention's
    form (the tables name its cascades) and the report says so; the paper suite refuses it."""
    from mambalaya.specio import dump_yaml

    model = tmp_path / "small.yaml"
    model.write_text(dump_yaml(SMALL.model_dump(mode="json")))
    out = runner.invoke(app, ["reproduce", "--suite", "hybrid", "--models", str(model), "--seq-lens", "512", "--batch",
                              "2", "--no-figures", "--workers", "1", "--softmax", "blocked", "--out", str(tmp_path / "r")])
    assert out.exit_code == 0, out.output
    latency = pd.read_csv(tmp_path / "r" / "hybrid" / "hybrid_latency.csv")
    assert latency["attention_cascade"].str.endswith("-blocked").all()
    assert "Attention runs the `blocked` softmax form" in (tmp_path / "r" / "hybrid" / "report.md").read_text()
    refused = runner.invoke(app, ["reproduce", "--softmax", "blocked", "--out", str(tmp_path / "p")])
    assert refused.exit_code == 1 and "--softmax applies to --suite hybrid only" in refused.output
    # and the paper suite's options with the hybrid suite (once accepted, ignored, exit 0)
    for option, value in (("--generated-tokens", "3"), ("--sensitivity", "none"), ("--compare-precision", "none"),
                          ("--sensitivity-seq-lens", "512")):
        refused = runner.invoke(app, ["reproduce", "--suite", "hybrid", "--models", str(model), option, value,
                                      "--out", str(tmp_path / "h")])
        assert refused.exit_code == 1 and f"{option} applies to the paper suite only" in refused.output, option


def test_a_hybrid_layer_run_in_its_only_mapping_scan_form_says_why() -> None:
    """At a length the chunk does not divide, a hybrid model's Mamba layers run the recurrent form;
    evaluate said so for a Mamba-2 model but not for a hybrid one (its title named only the cascade)."""
    from typer.testing import CliRunner

    from mambalaya.cli import app

    out = CliRunner().invoke(app, ["evaluate", "-m", "bamba-9b", "-L", "96", "-B", "1", "-a", "gpu-h100"])
    assert out.exit_code == 0, out.output
    said = " ".join(out.output.split())
    assert "mamba layers (29 of 32), prefill (recurrent scan, the only form that runs here (chunked scan: the chunked " \
           "scan pads L = 96" in said


def test_the_hybrid_report_says_when_a_scan_ran_its_only_form_and_when_activations_pass_the_memory(tmp_path) -> None:
    """At L 1000 every design's Mamba layers run the recurrent form (the chunked pads), which the
    Method's "the faster form" hid (speedups 3.6x those around it); activations beyond what the
    memory leaves were reported by evaluate and the paper suite's report, not the hybrid one."""
    from mambalaya.arch import load_arch
    from mambalaya.experiments.hybrid_suite import _activation_lines

    out = runner.invoke(app, ["reproduce", "--suite", "hybrid", "--models", "bamba-9b", "--seq-lens", "1000", "--batch",
                              "1", "--workers", "1", "--no-figures", "--out", str(tmp_path)])
    assert out.exit_code == 0, out.output
    report = (tmp_path / "hybrid" / "report.md").read_text()
    assert ("**Scan forms.** At bamba-9b prefill L = 1,000 every design runs its Mamba layers' only scan form that "
            "maps, not the faster of two (chunked scan: the chunked scan pads L = 1000") in report  # its own reason
    assert "mambalaya `reference-kernels`" in report and "An attention share is '-'" in report
    rows = pd.DataFrame([{"model": "m", "phase": "prefill", "seq_len": 4096, "arch": "mambalaya", "devices_needed": 1,
                          "dram_need_bytes": 60e9, "activation_peak_bytes": 30e9},
                         {"model": "m", "phase": "prefill", "seq_len": 2048, "arch": "mambalaya", "devices_needed": 1,
                          "dram_need_bytes": 60e9, "activation_peak_bytes": 10e9}])
    (line, _) = _activation_lines(rows, {"mambalaya": load_arch("mambalaya")})
    assert line.startswith("**Activations.** 1 of the 2 evaluations that fit one device") and "m prefill from L = 4,096" in line


def test_a_hybrid_points_figures_mean_what_a_mamba_points_do() -> None:
    """A hybrid sweep point stored one core's off-chip bytes on a multi-core chip (a Mamba point the
    chip's), its utilisations over the model's time with the collectives in it (a Mamba point's over
    its layers' own), and with micro-batches its layer types' shares counted one micro-batch's
    layers against the whole batch's time (with the interconnect, 0.4 of the time, not 1)."""
    from mambalaya.experiments.evaluate import chip_cores
    from mambalaya.experiments.hybrid import evaluate_hybrid, point_outputs
    from mambalaya.workloads import resolve_model

    cfg = resolve_model("bamba-9b")
    split = evaluate_hybrid("gpu-h100", "bamba-9b", cfg, phase="decode", seq_len=256, batch=4, devices=2,
                            parallel="tensor")
    out = point_outputs(split)
    busy = sum(ev.result.model_latency_s for ev in split.layers.values())
    assert busy < split.model_latency_s  # the all-reduces are outside the layers' own time
    expected = sum(ev.result.compute_util * ev.result.model_latency_s for ev in split.layers.values()) / busy
    assert out["compute_util"] == pytest.approx(expected, rel=1e-12)
    piped = evaluate_hybrid("gpu-h100", "bamba-9b", cfg, phase="decode", seq_len=256, batch=16, devices=2,
                            micro_batches=4)
    shares = sum(piped.share_of_time(t) for t in piped.layers)
    assert shares + piped.pipeline.interconnect_share == pytest.approx(1.0, rel=1e-12)
    chip = evaluate_hybrid("marca-multicore", "bamba-9b", cfg, phase="decode", seq_len=256, batch=1)
    cores = chip_cores(chip.arch, chip.layer_split)
    assert cores > 1 and point_outputs(chip)["offchip_bytes"] == pytest.approx(
        chip.offchip_bytes / cfg.n_layers * cores, rel=1e-12)


def test_the_hybrid_reports_scan_form_paragraph_gives_each_rows_own_reason() -> None:
    """The hybrid report said the chunked scan 'pads L to whole chunks' for every row that ran its
    only scan form, Jamba's too, whose Mamba layers are Mamba-1 (no chunked form at any length):
    each row now carries why (scan_form_refused), and the paragraph quotes it."""
    from mambalaya.arch import load_arch, with_settings
    from mambalaya.experiments import hybrid_suite
    from mambalaya.experiments.hybrid import evaluate_hybrid
    from mambalaya.workloads import resolve_model

    roomy = with_settings(load_arch("gpu-h100"), ["memory.offchip_capacity_bytes=200GB"], option="test")
    hv = evaluate_hybrid(roomy, "jamba-v0.1", resolve_model("jamba-v0.1"), phase="prefill", seq_len=256, batch=1)
    row = hybrid_suite._row("jamba-v0.1", hv)
    assert "Mamba-1, which has only the recurrent scan" in row["scan_form_refused"]
    text = " ".join(hybrid_suite._scan_form_lines(pd.DataFrame([row])))
    assert "Mamba-1, which has only the recurrent scan" in text and "pads L" not in text
