"""A sweep point's energy from its groups (model.energy.layer_energy_totals) against the
per-Einsum energy every other command reports, and the store keeping every output a point has."""

from __future__ import annotations

import math

import pytest

from mambalaya.errors import MambalayaError

from mambalaya.arch import arch_from_dict, arch_to_dict, load_arch, with_settings
from mambalaya.experiments.store import OUTPUT_COLUMNS, TEXT_OUTPUT_COLUMNS, ResultStore
from mambalaya.experiments.sweep import evaluate_point, run_sweep, load_sweep_spec
from mambalaya.cost.energy import group_dynamic_pj, layer_energy, layer_energy_totals
from mambalaya.cost.latency import layer_latency
from mambalaya.search.mappings import named_mapping
from mambalaya.workloads import PRESETS, build_layer


def _staged_with_energy():
    """gpu-h100's staging levels (L2, shared memory) with mambalaya's energy, technology and
    area sections: no shipped design has both, and the staging energy must be counted too."""
    data = arch_to_dict(load_arch("gpu-h100"))
    donor = arch_to_dict(load_arch("mambalaya"))
    for section in ("energy", "technology", "area"):
        data[section] = donor.get(section)
    data["memory"]["pe_local_bytes"] = donor["memory"]["pe_local_bytes"]  # the registers its energy charges
    return arch_from_dict(data, source="test: staged design with energy")


DESIGNS = ["mambalaya", "marca-ideal", "geens-ideal", "marca-original", "staged"]


@pytest.mark.parametrize("design", DESIGNS)
@pytest.mark.parametrize("model, scan", [("mamba-130m", None), ("mamba2-130m", "chunked")])
def test_the_totals_equal_the_per_einsum_energy(design: str, model: str, scan: str | None) -> None:
    """At two bandwidths and two buffers: the layer's energy, average power and throttled
    latency from the groups' dynamic energies plus the leakage over the latency equal those
    summed over the per-Einsum rows (to the order of summation), with and without the rows
    costed; the staged design's staging energy is in both."""
    base = _staged_with_energy() if design == "staged" else load_arch(design)
    cascade = build_layer(PRESETS[model], phase="prefill", seq_len=512, batch=2, scan=scan)
    for settings in ([], ["memory.offchip_bandwidth_bytes_per_s=0.5e12"], ["memory.onchip_buffer_bytes=3MiB"],
                     ["power_budget_w=2"]):
        arch = with_settings(base, settings)
        mapping = named_mapping(arch.mappings.default, cascade, arch.memory.onchip_buffer_bytes, arch=arch)
        rows = layer_latency(arch, cascade, mapping)
        full = layer_energy(arch, cascade, rows)
        assert full.layer_j > 0
        if design == "staged":
            assert sum(e.staging_pj for e in full.einsums) > 0
        for result in (rows, layer_latency(arch, cascade, mapping, per_einsum=False)):
            totals = layer_energy_totals(arch, cascade, mapping, result)
            for figure in ("layer_j", "per_token_j", "average_power_w", "throttled_latency_s", "edp_js"):
                assert math.isclose(getattr(totals, figure), getattr(full, figure), rel_tol=1e-12), (settings, figure)


def test_a_groups_dynamic_energy_is_shared_across_bandwidths_but_not_buffers() -> None:
    """The memo's key leaves out only what dynamic energy never reads: a point at another
    off-chip bandwidth reuses a group's energy; one at another buffer size (whose energy per
    bit differs) or another node's energy scale does not."""
    cascade = build_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=512, batch=2)
    arch = load_arch("mambalaya")
    group = named_mapping("optimal", cascade, arch.memory.onchip_buffer_bytes, arch=arch).groups[0]
    first = group_dynamic_pj(arch, cascade, group)
    faster = with_settings(arch, ["memory.offchip_bandwidth_bytes_per_s=9e12"])
    assert group_dynamic_pj(faster, cascade, group) == first
    memo = cascade.__dict__["_group_dynamic_pj_memo"]
    assert len(memo) == 1
    for other in (["memory.onchip_buffer_bytes=96MiB"], ["technology.energy_scale=0.5"]):
        assert group_dynamic_pj(with_settings(arch, other), cascade, group) != first, other
    assert len(memo) == 3


def test_the_store_keeps_every_output_of_a_point(tmp_path) -> None:
    """Every output a point computes is in the store's table (energy and power included, as
    columns; any other in the outputs' JSON), equal to the point's own."""
    spec_path = tmp_path / "s.yaml"
    spec_path.write_text("""
name: kept
chunk_size: 2
grid:
  arch: [mambalaya, gpu-h100]
  model: [mamba-130m]
  phase: [prefill]
  seq_len: [512]
  batch: [2]
  power_budget_w: [1]
""")
    spec = load_sweep_spec(spec_path)
    summary = run_sweep(spec, workers=1)
    assert summary.failed == 0
    with ResultStore(spec.store, create=False) as st:
        df = st.dataframe().set_index("arch")
    assert {"layer_energy_j", "average_power_w", "over_power_budget", "throttled_latency_s",
            "mapping_used"} <= set(OUTPUT_COLUMNS + TEXT_OUTPUT_COLUMNS)
    for point in spec.points():
        out = evaluate_point(point)
        row = df.loc[point["arch"]]
        for name, value in out.items():
            assert name in df.columns, name
            if isinstance(value, str):
                assert row[name] == value, name
            else:
                assert float(row[name]) == float(value), name
    assert df.loc["mambalaya", "over_power_budget"] == 1
    assert math.isnan(df.loc["gpu-h100", "layer_energy_j"])  # no energy section: empty, not zero


def test_the_speedup_map_matches_points_on_their_inputs_only() -> None:
    """Outputs that differ between designs (a hybrid model's attention share, the mapping used,
    the energy) do not keep a point from its baseline's: only the named inputs match them."""
    import pandas as pd

    from mambalaya.report.sweep_figures import speedup_table

    rows = [{"status": "ok", "arch": arch, "model": "m", "seq_len": L, "buffer": b, "latency_s": t, "model_latency_s": 24 * t,
             "attention_share": share, "mapping_used": used, "layer_energy_j": t * 3}
            for arch, scale, share, used in (("base", 2.0, 0.5, "unfused"), ("mine", 1.0, 0.25, "optimal"))
            for L in (1, 2) for b in (8, 16) for t in (scale * L * b,)]
    table = speedup_table(pd.DataFrame(rows), x="seq_len", y="buffer", baseline="base", design="mine",
                          inputs=["arch", "model", "seq_len", "buffer"])
    assert table.shape == (2, 2) and (abs(table - 2.0) < 1e-12).all().all()


def test_a_sweep_spec_reads_numbers_with_exponents_as_numbers(tmp_path) -> None:
    """YAML 1.1 reads 1e-3 and 2.039e12 as text; a sweep spec, like --set, reads them as numbers
    (a bandwidth swept as [1e12, 2.039e12] is one type, and power_budget_w takes 1e-3)."""
    path = tmp_path / "n.yaml"
    path.write_text("grid:\n  arch: [mambalaya]\n  model: [mamba-130m]\n  power_budget_w: [1e-3, 700]\n"
                    "  memory.offchip_bandwidth_bytes_per_s: [1e12, 2.039e12, 4.0e+12, 8TB/s]\n"
                    "fixed:\n  clock_hz: 1.5e9\n")
    points = load_sweep_spec(path).points()
    assert {p["power_budget_w"] for p in points} == {1e-3, 700}
    assert {p["memory.offchip_bandwidth_bytes_per_s"] for p in points} == {1e12, 2.039e12, 4e12, "8TB/s"}
    assert {p["clock_hz"] for p in points} == {1.5e9}


def test_a_mamba2_prefill_point_runs_the_faster_scan_form_as_every_command_does() -> None:
    """A sweep point ran the chunked form always (4-7% slow on every geens-ideal Mamba-2 prefill,
    and a failed point at a length the chunk does not divide), where evaluate, compare, reproduce
    and sensitivity run the faster form. Now it runs the same (and names it, ``scan_used``)."""
    from mambalaya.experiments.evaluate import evaluate_best_scan, scan_form
    from mambalaya.experiments.sweep import evaluate_point
    from mambalaya.workloads import resolve_model

    config = resolve_model("mamba2-130m")
    for arch, seq_len in (("geens-ideal", 1024), ("mambalaya", 1024), ("mambalaya", 1000)):
        point = {"arch": arch, "model": "mamba2-130m", "phase": "prefill", "seq_len": seq_len, "batch": 8,
                 "mapping": "default"}
        out = evaluate_point(point)
        ev = evaluate_best_scan(arch, "mamba2-130m", config, phase="prefill", seq_len=seq_len, batch=8)
        assert out["scan_used"] == scan_form(ev.cascade), (arch, seq_len)
        assert out["latency_s"] == ev.result.latency_s and out["offchip_bytes"] == ev.result.offchip_bytes
    assert out["scan_used"] == "recurrent"  # L 1000: the chunked form pads, so the recurrent runs


def test_the_speedup_map_reads_what_compare_reads_and_orders_its_axes_by_value() -> None:
    """The map took one device's layer latency (11.1x where the model's, links included, is 2.97x
    on two devices), refused two designs given as files (their hashes never matched), dropped
    points leaving the axis at the design's own value, sorted 10 TB/s before 900 GB/s, and took a
    design over itself."""
    import pandas as pd

    from mambalaya.report.sweep_figures import DESIGNS_OWN, speedup_table

    rows = [{"status": "ok", "arch": arch, "model": "m", "bw": bw, "devices": n, "precision": prec,
             "files_sha256": f"{arch}-hash", "latency_s": 1.0, "model_latency_s": (4.0 if arch == "base" else 1.0) * n}
            for arch in ("base", "mine") for bw in ("900 GB/s", "10 TB/s", "2 TB/s") for n in (1, 2)
            for prec in (None, "uniform")]
    table = speedup_table(pd.DataFrame(rows), x="bw", y="precision", baseline="base", design="mine",
                          inputs=["arch", "model", "bw", "devices", "precision"])  # (the CLI leaves out files_sha256)
    assert list(table.columns) == ["900 GB/s", "2 TB/s", "10 TB/s"] and set(table.index) == {DESIGNS_OWN, "uniform"}
    assert (abs(table - 4.0) < 1e-12).all().all()
    with pytest.raises(MambalayaError, match="--design and --baseline both name 'base'"):
        speedup_table(pd.DataFrame(rows), x="bw", y="devices", baseline="base", design="base", inputs=["arch", "bw", "devices"])
