"""Several devices, pipeline parallel (issue 46): a design's system section joins its devices;
a model's layers split in order over them, each device checked to hold its layers; the batch's
latency is every layer's plus a transfer of the activations at each boundary over a link; one
device is exactly the single-device evaluation."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from mambalaya.arch import arch_from_dict, arch_to_dict, arch_to_yaml, load_arch, loads_arch, with_settings
from mambalaya.cli import app
from mambalaya.cost.capacity import CapacityError
from mambalaya.cost.pipeline import boundary_bytes, stage_layers
from mambalaya.errors import MambalayaError, SpecError
from mambalaya.experiments.devices import layer_order, stage_needs
from mambalaya.experiments.evaluate import evaluate, model_memory_need
from mambalaya.experiments.hybrid import evaluate_hybrid
from mambalaya.workloads import PRESETS
from mambalaya.workloads.precision import load_policy

runner = CliRunner()
POLICY = load_policy("reference-kernels")


def test_stages_are_contiguous_runs_as_equal_as_the_layers_allow() -> None:
    assert stage_layers(5, 2) == (range(0, 3), range(3, 5))
    assert stage_layers(4, 4) == tuple(range(i, i + 1) for i in range(4))
    assert stage_layers(24, 1) == (range(0, 24),)
    with pytest.raises(SpecError, match="leave a stage without a layer"):
        stage_layers(3, 4)
    with pytest.raises(SpecError, match="at least one device"):
        stage_layers(3, 0)


@pytest.mark.parametrize("name", ["mamba-130m", "mamba2-130m", "bamba-9b", "jamba-v0.1", "granite-4.0-h-tiny",
                                  "nemotron-h-8b", "olmo-hybrid-7b", "falcon-h1-7b", "olmo-hybrid"])
def test_the_devices_hold_together_what_one_device_holds(name: str) -> None:
    """Every weight, state and KV cache of the model is on exactly one device."""
    config = PRESETS[name]
    one = model_memory_need(config, batch=4, seq_len=2048, bits=16, policy=POLICY)
    for devices in (1, 2, 3):
        needs = stage_needs(config, devices, batch=4, seq_len=2048, bits=16, policy=POLICY)
        assert sum(n.parameters for n in needs) == one.parameters
        assert sum(n.state_bytes for n in needs) == pytest.approx(one.state_bytes, rel=1e-12)
        assert sum(n.kv_cache_bytes for n in needs) == pytest.approx(one.kv_cache_bytes, rel=1e-12)


def test_zamba2s_shared_blocks_are_on_every_device_that_runs_a_hybrid_layer() -> None:
    config = PRESETS["zamba2-2.7b"]
    shared = config.extra_parameters()
    one = model_memory_need(config, batch=1, seq_len=2048, bits=16, policy=POLICY)
    needs = stage_needs(config, 3, batch=1, seq_len=2048, bits=16, policy=POLICY)
    assert all("hybrid" in [layer_order(config)[i] for i in s] for s in stage_layers(config.n_layers, 3))
    assert sum(n.parameters for n in needs) == one.parameters + 2 * shared


@pytest.mark.parametrize("arch", ["gpu-h100", "mambalaya"])
def test_one_device_is_the_single_device_evaluation_exactly(arch: str) -> None:
    config = PRESETS["mamba2-130m"]
    base = evaluate(arch, "mamba2-130m", config, phase="prefill", seq_len=1024, batch=2)
    one = evaluate(arch, "mamba2-130m", config, phase="prefill", seq_len=1024, batch=2, devices=1)
    assert one.pipeline is None and one.totals() == base.totals()


def test_zamba2s_original_embedding_travels_while_a_hybrid_layer_is_to_come() -> None:
    """Zamba2's hybrid layers read the original embedding EMB besides X: every boundary before
    the last hybrid layer sends both, whatever layer starts the stage."""
    config = PRESETS["zamba2-2.7b"]
    hv = evaluate_hybrid("gpu-h100", "zamba2-2.7b", config, phase="decode", seq_len=512, batch=2, devices=4)
    x = 2 * 1 * config.d_model * 2  # a decode step's X at 16 bits
    order = layer_order(config)
    last_hybrid = max(i for i, t in enumerate(order) if t == "hybrid")
    assert all(s.start <= last_hybrid for s in hv.pipeline.stages[1:])  # a hybrid layer after every boundary
    assert any(order[s.start] == "mamba" for s in hv.pipeline.stages[1:])  # and a stage that starts without one
    assert hv.pipeline.boundary_bytes == (2 * x, 2 * x, 2 * x)


def test_a_design_without_links_runs_on_one_device_only() -> None:
    with pytest.raises(SpecError, match="mambalaya has no system section"):
        evaluate("mambalaya", "mamba-130m", PRESETS["mamba-130m"], phase="prefill", seq_len=256, batch=1, devices=2)


def test_a_pipeline_adds_a_transfer_of_the_residual_stream_per_boundary() -> None:
    """mamba-130m over 3 H100s: the latency is its 24 layers' plus 2 transfers, each the next
    stage's input X (batch x L x d_model at its width) over 450 GB/s after 3 us."""
    config = PRESETS["mamba-130m"]
    ev = evaluate("gpu-h100", "mamba-130m", config, phase="prefill", seq_len=1024, batch=2, devices=3)
    single = evaluate("gpu-h100", "mamba-130m", config, phase="prefill", seq_len=1024, batch=2)
    x_bytes = 2 * 1024 * 768 * ev.cascade.tensors["X"].bits / 8
    assert boundary_bytes(ev.cascade) == x_bytes
    transfer = 3e-6 + x_bytes / 450e9
    t = ev.totals()
    assert t["devices"] == 3 and t["interconnect_s"] == pytest.approx(2 * transfer)
    assert t["model_latency_s"] == pytest.approx(single.result.model_latency_s + 2 * transfer)
    assert t["interconnect_share"] == pytest.approx(2 * transfer / t["model_latency_s"])
    assert t["devices_busy_share"] == pytest.approx(single.result.model_latency_s / (3 * t["model_latency_s"]))
    assert t["latency_s"] == single.result.latency_s  # a layer costs what it costs on one device
    assert t["interconnect_energy_j"] is None  # the H100 spec gives no link energy


def test_link_energy_is_its_own_line_where_the_spec_gives_it() -> None:
    spec = with_settings(load_arch("gpu-h100"), ["system.link_energy_pj_per_bit=5"])
    ev = evaluate(spec, "mamba-130m", PRESETS["mamba-130m"], phase="decode", seq_len=512, batch=4, devices=2)
    assert ev.totals()["interconnect_energy_j"] == pytest.approx(8 * boundary_bytes(ev.cascade) * 5e-12)


def test_jamba_runs_on_two_h100s_and_names_the_interconnect() -> None:
    """The issue's case: refused on one H100 naming two devices; on two it runs, every layer type
    costed as on one device, the transfer its own line."""
    config = PRESETS["jamba-v0.1"]
    hv = evaluate_hybrid("gpu-h100", "jamba-v0.1", config, phase="prefill", seq_len=2048, batch=8, devices=2)
    layers = sum(ev.result.model_latency_s for ev in hv.layers.values())
    assert hv.pipeline.devices == 2 and hv.model_latency_s == pytest.approx(layers + hv.pipeline.interconnect_s)
    assert hv.pipeline.boundary_bytes == (8 * 2048 * 4096 * 2,)  # X at the design's 16 bits
    assert all(u.used_bytes <= 80e9 for u in hv.stage_dram)
    assert sum(hv.share_of_time(t) for t in hv.layers) + hv.pipeline.interconnect_share == pytest.approx(1.0)
    r = runner.invoke(app, ["evaluate", "-m", "jamba-v0.1", "-a", "gpu-h100", "-L", "2048", "-B", "8",
                            "--devices", "2"])
    assert r.exit_code == 0, r.output
    assert "pipeline over 2 devices (layers 0-15, 16-31)" in r.stdout and "of the time: 1 transfer of" in r.stdout
    out = runner.invoke(app, ["evaluate", "-m", "jamba-v0.1", "-a", "gpu-h100", "-L", "2048", "-B", "8",
                              "--devices", "2", "--format", "json"])
    totals = json.loads(out.stdout)["totals"]
    assert totals["devices"] == 2 and totals["interconnect_s"] > 0 and len(totals["dram_need_bytes_per_device"]) == 2


def test_a_pipeline_too_short_for_the_model_names_the_devices_that_hold_it() -> None:
    spec = with_settings(load_arch("gpu-h100"), ["memory.offchip_capacity_bytes=40GB"])
    with pytest.raises(CapacityError, match="does not fit on 2 devices of gpu-h100 in a pipeline: device 0 holds .*"
                                            "--devices 3 holds it"):
        evaluate_hybrid(spec, "jamba-v0.1", PRESETS["jamba-v0.1"], phase="prefill", seq_len=2048, batch=1, devices=2)


@pytest.mark.parametrize("setting, needle", [
    ("system.link_bandwidth_bytes_per_s=-5", "system.link_bandwidth_bytes_per_s"),
    ("system.link_latency_s=1", "system.link_latency_s"),
    ("system.devices=2", "system.devices"),  # the device count is the evaluation's (--devices), not the spec's
])
def test_bad_system_fields_are_one_clear_error(setting: str, needle: str) -> None:
    with pytest.raises(SpecError, match=needle):
        with_settings(load_arch("gpu-h100"), [setting])


def test_the_system_section_round_trips_and_refuses_unknown_fields() -> None:
    spec = load_arch("gpu-h100")
    assert loads_arch(arch_to_yaml(spec)) == spec
    with pytest.raises(SpecError, match="system.topology"):
        loads_arch(arch_to_yaml(spec).replace("  link_latency_s:", "  topology: ring\n  link_latency_s:"))


def test_devices_option_is_checked() -> None:
    r = runner.invoke(app, ["evaluate", "-m", "mamba-130m", "--devices", "0"])
    assert r.exit_code == 2 and "--devices" in r.output
    r = runner.invoke(app, ["evaluate", "-m", "mamba-130m", "--devices", "30", "-a", "gpu-h100", "--set",
                            "system.max_devices=256"])
    assert r.exit_code == 1 and "use at most 24 devices" in " ".join(r.stderr.split())
    # past the one switch domain the links describe (an HGX H100 board's 8 GPUs): once costed as if
    # one NVSwitch joined them all
    r = runner.invoke(app, ["evaluate", "-m", "mamba-130m", "--devices", "16", "-a", "gpu-h100"])
    assert r.exit_code == 1 and "joins at most 8 devices (system.max_devices" in " ".join(r.stderr.split())


def test_compare_runs_every_design_over_the_devices() -> None:
    r = runner.invoke(app, ["compare", "-m", "mamba-130m", "--archs", "gpu-h100", "--baseline", "gpu-h100",
                            "--seq-lens", "1024", "-B", "2", "--devices", "2", "--format", "json"])
    assert r.exit_code == 0, r.output
    (row,) = json.loads(r.stdout)
    single = evaluate("gpu-h100", "mamba-130m", PRESETS["mamba-130m"], phase="prefill", seq_len=1024, batch=2)
    assert row["devices"] == 2 and row["model_latency_s"] == pytest.approx(
        single.result.model_latency_s + row["interconnect_s"])
    r = runner.invoke(app, ["compare", "-m", "mamba-130m", "--archs", "mambalaya", "--baseline", "gpu-h100",
                            "--seq-lens", "1024", "--devices", "2"])
    assert r.exit_code == 1 and "mambalaya has no system section" in " ".join(r.stderr.split())


# -- micro-batches: GPipe's schedule --------------------------------------------------------------

def test_micro_batches_fill_the_pipeline_by_gpipes_schedule() -> None:
    """Each layer costed for one micro-batch; the first micro-batch passes every stage and
    boundary, the others follow one per bottleneck interval (its stage and outgoing transfer)."""
    config = PRESETS["mamba-2.8b"]
    kw = dict(phase="prefill", seq_len=2048, batch=8, devices=4)
    one = evaluate("gpu-h100", "mamba-2.8b", config, **kw)
    four = evaluate("gpu-h100", "mamba-2.8b", config, micro_batches=4, **kw)
    p = four.pipeline
    micro = evaluate("gpu-h100", "mamba-2.8b", config, phase="prefill", seq_len=2048, batch=2)
    assert four.result.latency_s == micro.result.latency_s and four.batch == 8 and four.result.batch == 2
    assert p.stage_s == pytest.approx((16 * micro.result.latency_s,) * 4)
    interval = max(s + (p.transfer_s[i] if i < 3 else 0.0) for i, s in enumerate(p.stage_s))
    assert four.model_latency_s == pytest.approx(sum(p.stage_s) + sum(p.transfer_s) + 3 * interval)
    assert p.busy_share == pytest.approx(4 * sum(p.stage_s) / (4 * four.model_latency_s))
    assert four.model_latency_s < one.model_latency_s and p.busy_share > one.pipeline.busy_share
    assert four.totals()["tokens_per_s"] == pytest.approx(8 * 2048 / four.model_latency_s)
    width = four.cascade.tensors["X"].bits // 8  # float32 in Mamba-1 (residual_in_fp32)
    assert p.boundary_bytes == (2 * 2048 * 2560 * width,) * 3  # a micro-batch's residual stream


def test_micro_batched_energy_is_every_micro_batchs() -> None:
    spec = arch_from_dict({**arch_to_dict(load_arch("mambalaya")),
                           "system": {"link_bandwidth_bytes_per_s": 4.5e11, "link_latency_s": 3e-6}})
    ev = evaluate(spec, "mamba-130m", PRESETS["mamba-130m"], phase="prefill", seq_len=1024, batch=4, devices=2,
                  micro_batches=2)
    t, p = ev.totals(), ev.pipeline
    waiting = [ev.energy.leakage_w * (p.latency_s - 2 * s) for s in p.stage_s]  # each device leaks while it waits
    assert t["model_energy_j"] == pytest.approx(2 * ev.energy.model_j + sum(waiting))
    # the busiest device's power: its stage's 12 of the 24 layers, both micro-batches, and its waits
    assert t["average_power_w"] == pytest.approx((2 * 12 * ev.energy.layer_j + max(waiting)) / ev.model_latency_s)
    assert t["energy_per_token_j"] == pytest.approx(t["model_energy_j"] / (4 * 1024)) and t["micro_batches"] == 2


def _with_linked_energy(name: str):
    """A shipped design with an energy section, joined to others by links that have an energy."""
    return arch_from_dict({**arch_to_dict(load_arch(name)),
                           "system": {"link_bandwidth_bytes_per_s": 4.5e11, "link_latency_s": 3e-6,
                                      "link_energy_pj_per_bit": 5.0}})


def test_a_pipelines_energy_counts_its_links_and_its_transfers_time() -> None:
    """One batch through a two-device pipeline: the model's energy is its layers' and its links',
    the EDP takes the model's latency (the transfer included) and the power is the busiest
    device's (its stage's layers over that latency): the links' energy was left out and the
    EDP and power took the layers' time alone, as if on one device."""
    ev = evaluate(_with_linked_energy("mambalaya"), "mamba2-130m", PRESETS["mamba2-130m"], phase="prefill",
                  seq_len=512, batch=2, mapping="unfused", devices=2)
    t, p = ev.totals(), ev.pipeline
    assert p.interconnect_j and p.interconnect_s > 0
    waiting = [ev.energy.leakage_w * (p.latency_s - s) for s in p.stage_s]  # each device leaks while it waits
    total = ev.energy.model_j + sum(waiting) + p.interconnect_j
    assert t["model_energy_j"] == pytest.approx(total)
    assert t["edp_js"] == pytest.approx(total * ev.model_latency_s)
    assert t["average_power_w"] == pytest.approx((12 * ev.energy.layer_j + waiting[0]) / ev.model_latency_s)
    assert t["energy_per_token_j"] == pytest.approx(total / (2 * 512))
    hv = evaluate_hybrid(_with_linked_energy("mambalaya"), "granite-4.0-h-tiny", PRESETS["granite-4.0-h-tiny"],
                         phase="prefill", seq_len=256, batch=2, devices=2)
    ht = hv.totals()
    assert ht["model_energy_j"] == pytest.approx(hv.energy.model_j + ht["waiting_leakage_j"] + hv.pipeline.interconnect_j)
    assert ht["edp_js"] == pytest.approx(ht["model_energy_j"] * hv.model_latency_s)


def test_a_split_layers_tokens_are_every_devices() -> None:
    """Tokens per second and energy per token divide by the whole batch's tokens: a sequence-
    parallel device holds L/N positions and an expert-parallel device B/N sequences, and both
    were divided by one device's (half the throughput, twice the energy per token at N = 2)."""
    spec = _with_linked_energy("mambalaya")
    ev = evaluate(spec, "mamba2-130m", PRESETS["mamba2-130m"], phase="prefill", seq_len=512, batch=2,
                  mapping="unfused", devices=2, parallel="sequence")
    t = ev.totals()
    assert t["tokens_per_s"] == pytest.approx(2 * 512 / ev.model_latency_s)
    assert t["energy_per_token_j"] == pytest.approx(t["model_energy_j"] / (2 * 512))
    hv = evaluate_hybrid("gpu-h100", "jamba-v0.1", PRESETS["jamba-v0.1"], phase="decode", seq_len=1024, batch=8,
                         devices=2, parallel="expert")
    for layer_type, part in hv.layers.items():
        assert part.totals()["tokens_per_s"] == pytest.approx(8 / part.result.model_latency_s), layer_type
    hv = evaluate_hybrid("gpu-h100", "jamba-v0.1", PRESETS["jamba-v0.1"], phase="prefill", seq_len=2048, batch=8,
                         devices=2, micro_batches=4)
    parts = sum(ev.result.offchip_bytes * ev.result.n_layers for ev in hv.layers.values())
    assert hv.offchip_bytes == 4 * parts and hv.pipeline.micro_batches == 4


@pytest.mark.parametrize("args, needle", [
    (["--micro-batches", "3", "--devices", "2", "-B", "8"], "--micro-batches 3 must divide the batch (8)"),
    (["--micro-batches", "2", "-B", "8"], "use it with --devices N (N > 1) and --parallel pipeline"),
    (["--micro-batches", "2", "-B", "8", "--devices", "2", "--parallel", "tensor"], "--parallel pipeline"),
    (["--micro-batches", "0"], "--micro-batches"),
])
def test_micro_batches_are_checked(args, needle) -> None:
    r = runner.invoke(app, ["evaluate", "-m", "mamba2-130m", "-a", "gpu-h100", *args])
    assert r.exit_code in (1, 2) and needle in " ".join(r.output.split())


def test_the_pipeline_line_names_the_micro_batches() -> None:
    r = runner.invoke(app, ["evaluate", "-m", "mamba2-130m", "-a", "gpu-h100", "-L", "1024", "-B", "4",
                            "--devices", "2", "--micro-batches", "2"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert "2 micro-batches, GPipe's schedule" in text and "each micro-batch's (batch 2): layer" in text


def test_a_strategy_the_model_cannot_take_is_refused_on_one_device_too() -> None:
    """On one device every strategy is the one-device evaluation, but expert parallelism of a model
    without experts, or sequence parallelism of a decode step, was run as if it applied (and
    refused only with --devices 2)."""
    base = ["evaluate", "-a", "gpu-h100", "-m", "mamba-130m", "-B", "2", "-L", "64"]
    # on one device any --parallel is refused (it changed no number); over two, by the strategy's own rule
    for args in (["--parallel", "expert"], ["--phase", "decode", "--parallel", "sequence"], ["--parallel", "tensor"]):
        r = runner.invoke(app, [*base, *args])
        assert r.exit_code == 1 and "give --devices N (N > 1)" in " ".join(r.stderr.split()), args
    r = runner.invoke(app, [*base, "--parallel", "expert", "--devices", "2"])
    assert r.exit_code == 1 and "no mixture-of-experts layers" in " ".join(r.stderr.split())
    r = runner.invoke(app, [*base, "--phase", "decode", "--parallel", "sequence", "--devices", "2"])
    assert r.exit_code == 1 and "a decode step has one position" in " ".join(r.stderr.split())
    from mambalaya.experiments.evaluate import evaluate
    from mambalaya.workloads import PRESETS

    with pytest.raises(MambalayaError, match="no mixture-of-experts layers"):  # the API keeps the rule on one device
        evaluate("gpu-h100", "mamba-130m", PRESETS["mamba-130m"], phase="prefill", seq_len=64, batch=2,
                 parallel="expert")


def test_parallel_best_lists_every_strategy_at_its_faster_scan_form_and_checks_its_micro_batches() -> None:
    """--parallel best on a Mamba-2 prefill listed only the winning form's strategies (sequence,
    which only the recurrent form runs at L 256, was missing); with --micro-batches not dividing
    the batch it left the pipeline out without a word; a pipeline's boundaries are each listed."""
    from mambalaya.experiments.evaluate import evaluate_best_scan

    config = PRESETS["mamba2-130m"]
    best = evaluate_best_scan("gpu-h100", "mamba2-130m", config, phase="prefill", seq_len=256, batch=1, devices=2,
                              parallel="best")
    listed = dict(best.strategies_s)
    assert {"pipeline", "tensor", "sequence"} <= set(listed)
    for strategy, seconds in listed.items():
        alone = evaluate_best_scan("gpu-h100", "mamba2-130m", config, phase="prefill", seq_len=256, batch=1, devices=2,
                                   parallel=strategy)
        assert seconds == alone.model_latency_s, strategy
    with pytest.raises(SpecError, match="--micro-batches 3 must divide the batch"):
        evaluate("gpu-h100", "mamba-1.4b", PRESETS["mamba-1.4b"], phase="prefill", seq_len=2048, batch=8, devices=2,
                 parallel="best", micro_batches=3)
    ev = evaluate("gpu-h100", "mamba-130m", PRESETS["mamba-130m"], phase="prefill", seq_len=256, batch=1, devices=3)
    assert ev.totals()["boundary_bytes"] == list(ev.pipeline.boundary_bytes) and len(ev.totals()["boundary_bytes"]) == 2


def test_sequence_parallel_on_one_device_refuses_a_model_it_cannot_split() -> None:
    """On one device every strategy is the one-device evaluation, but a strategy the model cannot
    take is refused there too: bamba-9b's attention under sequence parallelism ran on one device."""
    from mambalaya.experiments.hybrid import evaluate_hybrid

    with pytest.raises(MambalayaError, match="attention layers cannot run sequence parallel"):
        evaluate_hybrid(load_arch("gpu-h100"), "bamba-9b", PRESETS["bamba-9b"], phase="prefill", seq_len=512, batch=1,
                        devices=1, parallel="sequence")


def test_a_parallel_strategy_on_one_device_is_refused_naming_the_option(tmp_path) -> None:
    """--parallel on a run of one device (of a design that is not a multi-core chip) changed no
    number and said nothing: every strategy is the one-device evaluation there. evaluate and
    compare refuse it, as a sweep whose every point runs one device refuses a parallel axis; a
    multi-core design (its cores as devices) and --devices N take it."""
    from typer.testing import CliRunner

    from mambalaya.cli import app
    from mambalaya.errors import SpecError
    from mambalaya.experiments.sweep_spec import load_sweep_spec

    runner = CliRunner()
    for args in (["evaluate", "-a", "gpu-h100"], ["compare", "--archs", "gpu-h100", "--baseline", "gpu-h100",
                                                  "--seq-lens", "2048"]):
        out = runner.invoke(app, [*args, "-m", "mamba-130m", "-L", "2048", "-B", "8", "--parallel", "tensor"]
                            if args[0] == "evaluate" else [*args, "-m", "mamba-130m", "-B", "8", "--parallel", "tensor"])
        assert out.exit_code != 0 and "--parallel tensor" in out.output and "--devices N" in out.output, out.output
    ok = runner.invoke(app, ["evaluate", "-a", "gpu-h100", "-m", "mamba-130m", "-L", "2048", "-B", "8",
                             "--parallel", "tensor", "--devices", "2"])
    assert ok.exit_code == 0 and "tensor parallel over 2 devices" in ok.output
    cores = runner.invoke(app, ["evaluate", "-a", "marca-multicore", "-m", "mamba-130m", "-L", "512", "-B", "8",
                                "--parallel", "tensor"])
    assert cores.exit_code == 0, cores.output
    spec = tmp_path / "s.yaml"
    spec.write_text("name: p\ngrid:\n  parallel: [tensor, pipeline]\nfixed:\n  arch: gpu-h100\n  model: mamba-130m\n"
                    "  phase: prefill\n  seq_len: 512\n  batch: 2\n")
    with pytest.raises(SpecError, match="grid.parallel: every point runs one device"):
        load_sweep_spec(spec)
