"""Multi-core designs (a spec's ``cores`` section, mambalaya.cost.cores): each core costed as one
of several devices at its share of the chip's memory bandwidth, the chip's memory shared (every
tensor moved once), the cores' collectives over the network on chip; marca-multicore after Geens
et al.'s artifact."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from mambalaya.arch import arch_from_dict, arch_to_dict, core_design, load_arch, shipped_archs
from mambalaya.cli import app
from mambalaya.cost.cores import core_dram_share
from mambalaya.cost.latency import layer_latency
from mambalaya.cost.tensor_parallel import device_cascade, split_parts, tensor_parallel_ranks
from mambalaya.errors import MambalayaError, SpecError
from mambalaya.experiments.evaluate import compare_rows, evaluate
from mambalaya.experiments.sweep import evaluate_chunk
from mambalaya.search.mappings import named_mapping
from mambalaya.workloads import PRESETS, build_layer

runner = CliRunner()
MODEL = PRESETS["mamba-2.8b"]


def test_a_core_is_the_spec_at_its_share_of_the_chips_memory_joined_by_the_network():
    chip = load_arch("marca-multicore")
    assert "marca-multicore" in shipped_archs() and chip.cores.count == 32
    core = core_design(chip)
    assert core.cores is None and core.system.unit == "core" and core.name == "marca-multicore-core"
    assert core.memory.offchip_bandwidth_bytes_per_s == chip.memory.offchip_bandwidth_bytes_per_s / 32
    assert core.memory.onchip_buffer_bytes == 768 * 1024 and core.compute.array_rows * core.compute.array_cols == 256
    assert core.system.link_bandwidth_bytes_per_s == chip.cores.noc_bandwidth_bytes_per_s
    # 32 cores of 16x16 PEs and 768 KiB: marca-original's 8192 PEs and 24 MiB
    one = load_arch("marca-original")
    assert 32 * 256 == one.compute.array_rows * one.compute.array_cols
    assert 32 * core.memory.onchip_buffer_bytes == one.memory.onchip_buffer_bytes


def test_every_tensor_a_core_holds_whole_is_one_share_of_the_chips_traffic():
    layer = build_layer(MODEL, phase="prefill", seq_len=256, batch=1, bits=32)
    split = split_parts(layer, tensor_parallel_ranks(layer), 32)
    part = device_cascade(layer, tensor_parallel_ranks(layer), 32)
    share = core_dram_share(part, split, 32)
    assert share["X"] == share["XN"] == share["DL"] == share["O"] == share["O_AR"] == 1 / 32  # whole on every core
    assert "WX" not in share and "H" not in share and "XI" not in share  # split over the cores: each core its own


def test_marca_on_32_cores_moves_each_tensor_once_and_costs_what_its_cores_do():
    one = evaluate("marca-original", "mamba-2.8b", MODEL, phase="prefill", seq_len=1024, batch=1)
    chip = evaluate("marca-multicore", "mamba-2.8b", MODEL, phase="prefill", seq_len=1024, batch=1)
    split = chip.layer_split
    assert split.strategy == "tensor" and split.devices == 32 and chip.cores == 32
    assert chip.result.offchip_bytes * 32 == pytest.approx(one.result.offchip_bytes, rel=1e-9)  # unfused: each once
    assert chip.model_latency_s == pytest.approx(split.layers_s + split.interconnect_s)
    assert split.interconnect_share < 1e-5  # Geens et al.'s network is unbounded
    assert 0.95 < chip.model_latency_s / one.model_latency_s < 1.2
    assert chip.totals()["area_mm2"] == pytest.approx(32 * core_area(), rel=1e-9)
    rows = compare_rows(["marca-original", "marca-multicore"], "mamba-2.8b", MODEL, phase="prefill", seq_lens=[1024],
                        batch=1, baseline="marca-original")
    assert [list(r) for r in rows][0] == [list(r) for r in rows][1]  # the same columns for both designs
    assert rows[0]["offchip_bytes"] == pytest.approx(rows[1]["offchip_bytes"], rel=1e-9)
    assert (rows[0]["devices"], rows[1]["devices"], rows[1]["parallel"]) == (1, 32, "tensor")


def core_area() -> float:
    from mambalaya.cost.area import total_area_mm2

    return total_area_mm2(core_design(load_arch("marca-multicore")))


def test_a_multi_core_chip_is_refused_where_it_would_be_costed_as_one_array_or_placed_otherwise():
    chip = load_arch("marca-multicore")
    layer = build_layer(MODEL, phase="prefill", seq_len=64, batch=1, bits=32)
    with pytest.raises(SpecError, match="marca-multicore is a multi-core design"):
        layer_latency(chip, layer, named_mapping("unfused", layer, None, arch=chip))
    with pytest.raises(SpecError, match="not 'expert'"):
        evaluate(chip, "mamba-2.8b", MODEL, phase="prefill", seq_len=64, batch=1, parallel="expert")
    with pytest.raises(SpecError, match="several such chips"):
        evaluate(chip, "mamba-2.8b", MODEL, phase="prefill", seq_len=64, batch=1, devices=2)
    data = arch_to_dict(chip)
    data["system"] = {"link_bandwidth_bytes_per_s": 450e9, "link_latency_s": 3e-6}
    with pytest.raises(MambalayaError, match="cores"):
        arch_from_dict(data)
    data = arch_to_dict(chip)
    data["cores"]["count"] = 1
    with pytest.raises(MambalayaError, match="cores.count"):
        arch_from_dict(data)


def test_layers_pipelined_over_the_cores_stream_at_the_share_of_the_stages_busy_at_once():
    """GPipe over the 32 cores: one batch keeps one core busy at a time, at the chip's whole
    bandwidth; 32 micro-batches keep all 32 busy, each at 1/32 of it; the stages' layers are each
    core's own (no shared traffic), the boundaries cross the network."""
    from mambalaya.cost.cores import streaming_cores

    chip = load_arch("marca-multicore")
    assert streaming_cores("pipeline", 32, None) == 1 and streaming_cores("pipeline", 32, 8) == 8
    assert streaming_cores("pipeline", 32, 64) == 32 and streaming_cores("tensor", 32, None) == 32
    assert core_design(chip, 1).memory.offchip_bandwidth_bytes_per_s == chip.memory.offchip_bandwidth_bytes_per_s
    one = evaluate(chip, "mamba-2.8b", MODEL, phase="prefill", seq_len=256, batch=32, parallel="pipeline")
    many = evaluate(chip, "mamba-2.8b", MODEL, phase="prefill", seq_len=256, batch=32, parallel="pipeline",
                    micro_batches=32)
    assert one.pipeline.devices == many.pipeline.devices == 32 and many.pipeline.micro_batches == 32
    assert one.arch.memory.offchip_bandwidth_bytes_per_s == 32 * many.arch.memory.offchip_bandwidth_bytes_per_s
    assert one.layer_parts == 1 and one.cores == 32  # a core runs whole layers: a layer's bytes are its own
    assert many.model_latency_s < one.model_latency_s  # the stages overlap


def test_best_weighs_every_placement_and_a_sweep_point_runs_the_chip():
    best = evaluate("marca-multicore", "mamba-2.8b", MODEL, phase="prefill", seq_len=1024, batch=1, parallel="best")
    assert {s for s, _ in best.strategies_s} == {"tensor", "sequence", "pipeline"}
    point = {"arch": "marca-multicore", "model": "mamba-2.8b", "phase": "prefill", "seq_len": 1024, "batch": 1,
             "mapping": "default"}
    [result] = evaluate_chunk([point])
    assert result.error is None, result.error
    chip = evaluate("marca-multicore", "mamba-2.8b", MODEL, phase="prefill", seq_len=1024, batch=1)
    assert result.outputs["model_latency_s"] == chip.model_latency_s
    assert result.outputs["devices"] == 32 and result.outputs["offchip_bytes"] == chip.result.offchip_bytes * 32


def test_the_cli_names_cores_not_devices():
    shown = runner.invoke(app, ["evaluate", "--arch", "marca-multicore", "--model", "mamba-130m", "--seq-len", "256"])
    assert shown.exit_code == 0, shown.output
    assert "tensor parallel over 32 cores" in shown.output and "each core's part" in shown.output
    assert "32 cores of" in shown.output
    listed = runner.invoke(app, ["arch", "show", "marca-multicore"])
    assert listed.exit_code == 0 and "one of its 32 cores" in listed.output
    # a refusal points to what a chip takes: micro-batches with --parallel pipeline (it pointed to
    # --devices, which a multi-core chip refuses), a pipeline of more cores than layers to cores.count
    base = ["evaluate", "--arch", "marca-multicore", "--model", "mamba-130m", "-L", "256", "-B", "4"]
    r = runner.invoke(app, [*base, "--micro-batches", "2"])
    assert r.exit_code == 1 and "use it with --parallel pipeline (its 32 cores as the stages)" in " ".join(r.stderr.split())
    r = runner.invoke(app, [*base, "--parallel", "pipeline"])
    assert r.exit_code == 1 and "at most 24 cores: --set cores.count" in " ".join(r.stderr.split())
    assert runner.invoke(app, [*base, "--parallel", "pipeline", "--micro-batches", "2", "--set", "cores.count=24"]).exit_code == 0


def test_a_finite_network_pays_for_bringing_every_core_the_tensors_all_read():
    """With the network at 1 GB/s per core, each core's layer waits for the (cores-1)/cores of
    each whole tensor it receives from the others, and the network's energy counts every core's."""
    from mambalaya.cost.cores import multicast_cost

    data = arch_to_dict(load_arch("marca-multicore"))
    data["cores"].update(noc_bandwidth_bytes_per_s=1.0e9, noc_energy_pj_per_bit=1.0)
    slow = arch_from_dict(data)
    free = evaluate("marca-multicore", "mamba-130m", PRESETS["mamba-130m"], phase="prefill", seq_len=256, batch=1)
    ev = evaluate(slow, "mamba-130m", PRESETS["mamba-130m"], phase="prefill", seq_len=256, batch=1)
    split = ev.layer_split
    layer = build_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=256, batch=1, bits=32)
    share = core_dram_share(ev.cascade, split_parts(layer, tensor_parallel_ranks(layer), 32), 32)
    received = 31 * sum(b for g in ev.result.groups for t, b in g.traffic.read_bytes.items() if t in share)
    seconds, joules = multicast_cost(ev.result, share, 32, core_design(slow).system)
    assert received > 0 and seconds == pytest.approx(received / 1e9) and joules == pytest.approx(32 * received * 8e-12)
    assert split.multicast[None] == (seconds, joules)
    assert ev.model_latency_s == pytest.approx(split.layers_s + split.interconnect_s)
    assert split.interconnect_s > 24 * seconds and ev.model_latency_s > free.model_latency_s


def test_a_chip_holds_one_copy_of_the_model_every_core_reads():
    """The cores share the chip's memory: the model (one copy) is checked against the chip's
    capacity under every placement, and refused naming it when over, however small each core's
    part; each core is costed with the chip's capacity (its part never exceeds the model)."""
    data = arch_to_dict(load_arch("marca-multicore"))
    data["memory"]["offchip_capacity_bytes"] = 16 * 1024**3  # mamba-2.8b at 32 bits: 11 GB of weights
    chip = arch_from_dict(data)
    assert core_design(chip).memory.offchip_capacity_bytes == 16 * 1024**3
    for placement in ("tensor", "sequence", "pipeline"):
        ev = evaluate(chip, "mamba-2.8b", MODEL, phase="prefill", seq_len=1024, batch=1, parallel=placement)
        assert ev.dram.capacity_bytes == 16 * 1024**3 and ev.dram.used_bytes > 11e9, placement
    data["memory"]["offchip_capacity_bytes"] = 8 * 1024**3
    with pytest.raises(MambalayaError, match="does not fit"):
        evaluate(arch_from_dict(data), "mamba-2.8b", MODEL, phase="prefill", seq_len=1024, batch=1)


def test_arch_show_derives_a_multi_core_chips_peaks_and_ridge_from_all_its_cores() -> None:
    """arch show printed one core's MAC/s beside the chip's bandwidth: a ridge of 2 ops/byte on
    marca-multicore, where each core at its share of the bandwidth, and so the chip, has 64."""
    from mambalaya.arch import arch_rows, core_design, load_arch

    spec = load_arch("marca-multicore")
    rows = {r["field"]: r["value"] for r in arch_rows(spec)}
    core = core_design(spec)
    assert rows["derived.ridge_point_ops_per_byte"] == pytest.approx(core.ridge_point_ops_per_byte) == pytest.approx(64)
    assert rows["derived.peak_macs_per_s"] == spec.cores.count * core.peak_macs_per_s


def test_a_chips_power_line_says_it_is_a_cores_against_its_share_of_the_budget() -> None:
    """--set power_budget_w=20 on marca-multicore printed "OVER the 0.625 W budget": a core's power
    against a core's share, labelled as the chip's."""
    out = CliRunner().invoke(app, ["evaluate", "--arch", "marca-multicore", "--model", "mamba-130m", "-L", "1024",
                                   "-B", "1", "--set", "power_budget_w=20"])
    assert out.exit_code == 0, out.output
    assert "average power of the busiest of the chip's 32 cores" in out.output
    assert "its 0.625 W share of the chip's 20 W budget" in out.output


def test_a_cores_buffer_fills_and_drains_are_its_share_of_the_traffic_whatever_was_costed_before() -> None:
    """A group's buffer accesses were memoised with their fill and drain: a core's call with its
    share of each tensor got the whole tensors' (costed first), so its latency counted 106 MB of
    buffer bytes where its rows and energy count 78 MB (3.6437 ms for 3.5007 on mamba-130m)."""
    from mambalaya.cost.buffer import group_buffer_accesses
    from mambalaya.cost.traffic import group_traffic, shared_traffic
    from mambalaya.fusion.mapping import FusionGroup
    from mambalaya.workloads import PRESETS, build_layer

    c = build_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=256, batch=1)
    g = FusionGroup("G", ("SS",))
    whole = group_buffer_accesses(c, g)
    share = {t: 1 / 32 for t in c.tensors}
    part = group_buffer_accesses(c, g, shared_traffic(group_traffic(c, g), share))
    assert part.fill_bytes == pytest.approx(whole.fill_bytes / 32) and part.einsum_read_bytes == whole.einsum_read_bytes


def test_under_sequence_placement_what_the_split_adds_is_each_cores_own() -> None:
    """A core's incoming state (HC_IN), halos and product start lack the position rank but are its
    own: they were read at a 1/cores share and multicast as if every core held them (4.72 MB a
    layer per core low on mamba2-130m, L 1024, batch 8, four cores)."""
    from mambalaya.cost.sequence_parallel import sequence_device_cascade
    from mambalaya.experiments.evaluate import core_share
    from mambalaya.workloads import PRESETS, build_layer

    spec = core_design(load_arch("marca-multicore"))  # a core: its system joins the chip's cores
    whole = build_layer(PRESETS["mamba2-130m"], phase="prefill", seq_len=1024, batch=8, scan="chunked")
    part = sequence_device_cascade(whole, 4)
    share = core_share(spec, whole, part, "sequence", 4)
    added = [t for t in part.tensors if t not in whole.tensors]
    assert added and not set(added) & set(share)
    assert share and all(t in whole.tensors and "I" not in whole.tensors[t].ranks for t in share)
