"""The latency model against hand-computed cases, and its monotonicity properties."""

from __future__ import annotations

import pytest

from mambalaya.arch import load_arch, shipped_archs
from mambalaya.einsum import loads_cascade
from mambalaya.experiments.evaluate import evaluate
from mambalaya.fusion.mapping import check_mapping, unfused_mapping
from mambalaya.cost.latency import latency_rows, layer_latency
from mambalaya.search.mappings import named_mapping
from mambalaya.cost.traffic import mapping_traffic
from mambalaya.workloads.blocks.mamba1 import PRESETS, mamba1_layer

MAMBALAYA = load_arch("mambalaya")


def with_changes(spec, **changes):
    """A copy of an arch spec with dotted fields replaced (validated again)."""
    data = spec.model_dump()
    for path, value in changes.items():
        node = data
        *parents, leaf = path.split("__")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return type(spec).model_validate(data)


def test_large_gemm_is_compute_bound_at_full_utilisation() -> None:
    c = loads_cascade("""
ranks: {M: 8192, K: 8192, N: 8192}
tensors:
  A: {ranks: [M, K], role: input}
  W: {ranks: [K, N], role: weight}
  Y: {ranks: [M, N], role: output}
einsums:
  - Y[m,n] = A[m,k]*W[k,n]
""")
    r = layer_latency(MAMBALAYA, c, check_mapping(c, unfused_mapping(c)))
    macs = 8192**3
    expected = macs / (256 * 256) / 1.75e9
    assert r.latency_s == pytest.approx(expected, rel=1e-12)
    assert r.compute_util == pytest.approx(1.0) and r.compute_util <= 1.0
    assert r.mem_util < 1.0


def test_unfused_elementwise_einsum_takes_bytes_over_bandwidth() -> None:
    c = loads_cascade("""
ranks: {B: 64, I: 4096, E: 4096}
tensors:
  P: {ranks: [B, I, E], role: input}
  Q: {ranks: [B, I, E], role: input}
  Y: {ranks: [B, I, E], role: output}
einsums:
  - Y[b,i,e] = P[b,i,e]*Q[b,i,e]
""")
    r = layer_latency(MAMBALAYA, c, check_mapping(c, unfused_mapping(c)))
    n = 64 * 4096 * 4096
    assert r.latency_s == pytest.approx(3 * n * 2 / 2039e9, rel=1e-12)
    assert r.mem_util == pytest.approx(1.0)
    row = latency_rows(r)[0]
    assert row["final_latency"] == row["mem_latency"] == pytest.approx(r.latency_s)


def test_table_columns_and_total_row() -> None:
    ev = evaluate("mambalaya", "mamba-130m", PRESETS["mamba-130m"], phase="prefill", seq_len=512, batch=4)
    rows = latency_rows(ev.result)
    assert list(rows[0]) == ["einsum", "fusion_group", "total_traffic", "final_latency", "mem_latency",
                             "comp_latency", "group_compute_util", "group_mem_util", "spatial_mapping", "spatial_util",
                             "buffer_read_write_bytes", "onchip_latency", "group_bound"]
    total = rows[-1]
    assert total["einsum"] == "total"
    assert total["final_latency"] == pytest.approx(sum(r["final_latency"] for r in rows[:-1]))
    assert total["total_traffic"] == pytest.approx(sum(r["total_traffic"] for r in rows[:-1]))
    assert total["total_traffic"] == pytest.approx(mapping_traffic(ev.cascade, ev.mapping).offchip_bytes)
    for r in rows:
        assert 0 <= r["group_compute_util"] <= 1 + 1e-9 and 0 <= r["group_mem_util"] <= 1 + 1e-9
    # the group_ columns are the group's: one value per group, whatever each Einsum's own demand
    for g in {r["fusion_group"] for r in rows[:-1]}:
        members = [r for r in rows[:-1] if r["fusion_group"] == g]
        assert len({(r["group_compute_util"], r["group_mem_util"], r["group_bound"].split(" (")[0]) for r in members}) == 1


@pytest.mark.parametrize("arch", shipped_archs())
@pytest.mark.parametrize("model", ["mamba-130m", "mamba-1.4b", "mamba-2.8b"])
def test_decode_never_reaches_the_compute_roof(arch, model) -> None:
    ev = evaluate(arch, model, PRESETS[model], phase="decode", seq_len=1, batch=64)
    assert ev.result.compute_util < 0.9
    assert ev.result.mem_util > ev.result.compute_util


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_fused_traffic_never_exceeds_unfused(phase) -> None:
    c = mamba1_layer(PRESETS["mamba-790m"], batch=64, seq_len=4096, phase=phase)
    unfused = mapping_traffic(c, named_mapping("unfused", c, None)).offchip_bytes
    for name in ("ssm-ri", "stitched", "optimal", "ideal"):
        m = named_mapping(name, c, MAMBALAYA.memory.onchip_buffer_bytes, arch=MAMBALAYA)
        assert mapping_traffic(c, m).offchip_bytes <= unfused, name


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_latency_never_increases_with_more_bandwidth_or_pes(phase) -> None:
    c = mamba1_layer(PRESETS["mamba-1.4b"], batch=64, seq_len=2048, phase=phase)
    for name in ("unfused", "ssm-ri", "stitched", "optimal"):
        m = named_mapping(name, c, MAMBALAYA.memory.onchip_buffer_bytes, arch=MAMBALAYA)
        base = layer_latency(MAMBALAYA, c, m).latency_s
        more_bw = with_changes(MAMBALAYA, memory__offchip_bandwidth_bytes_per_s=4e12)
        more_pe = with_changes(MAMBALAYA, compute__array_rows=512)
        more_mfu = with_changes(MAMBALAYA, compute__mfu_units=4096)
        for spec in (more_bw, more_pe, more_mfu):
            assert layer_latency(spec, c, m).latency_s <= base * (1 + 1e-12), (name, spec)


def test_latency_never_increases_with_a_bigger_buffer() -> None:
    """The best latency can only improve when the buffer grows (the search space grows). The
    search returns the least-traffic mapping within LATENCY_TIE_TOLERANCE of that best, so the
    returned latency never rises by more than the tolerance."""
    from mambalaya.search.mappings import LATENCY_TIE_TOLERANCE

    c = mamba1_layer(PRESETS["mamba-370m"], batch=16, seq_len=4096)
    previous = None
    for mib in (1, 4, 16, 64):
        spec = with_changes(MAMBALAYA, memory__onchip_buffer_bytes=mib * 2**20)
        m = named_mapping("optimal", c, spec.memory.onchip_buffer_bytes, arch=spec)
        lat = layer_latency(spec, c, m).latency_s
        if previous is not None:
            assert lat <= previous * (1 + LATENCY_TIE_TOLERANCE)
        previous = lat


@pytest.mark.parametrize("arch", ["mambalaya", "marca-ideal", "geens-ideal", "marca-original"])
@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_ideal_is_a_lower_bound_for_every_mapping(arch, phase) -> None:
    spec = load_arch(arch)
    c = mamba1_layer(PRESETS["mamba-370m"], batch=64, seq_len=2048, phase=phase, bits=spec.bits_per_element)
    ideal = layer_latency(spec, c, named_mapping("ideal", c, None)).latency_s
    for name in ("unfused", "ssm-ri", "stitched", "optimal"):
        m = named_mapping(name, c, spec.memory.onchip_buffer_bytes, arch=spec)
        assert ideal <= layer_latency(spec, c, m).latency_s * (1 + 1e-12), name


@pytest.mark.parametrize("onchip_bw", [None, 64])
@pytest.mark.parametrize("mapping", ["unfused", "optimal"])
def test_layer_totals_without_rows_equal_those_with_rows(onchip_bw, mapping: str) -> None:
    """Sweeps ask for the layer's totals only (``per_einsum=False``): the same floats as the
    full result, with and without an on-chip bandwidth (whose buffer bytes then count)."""
    arch = load_arch("mambalaya")
    arch = arch.model_copy(update={"memory": arch.memory.model_copy(update={"onchip_bandwidth_bytes_per_cycle": onchip_bw, "onchip_banks": None, "onchip_bank_port_bytes": None})})
    cascade = mamba1_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=512, batch=4)
    m = named_mapping(mapping, cascade, 1 << 20, arch=arch)
    full = layer_latency(arch, cascade, m, n_layers=24)
    totals = layer_latency(arch, cascade, m, n_layers=24, per_einsum=False)
    assert not totals.einsums and len(totals.groups) == len(full.groups)
    for name in ("latency_s", "model_latency_s", "offchip_bytes", "comp_s", "compute_util", "mem_util", "onchip_s",
                 "tokens_per_s", "bound"):
        assert getattr(totals, name) == getattr(full, name), name
    assert [g.traffic.footprint_bytes for g in totals.groups] == [g.traffic.footprint_bytes for g in full.groups]
    assert (onchip_bw is None) == (totals.onchip_s == 0.0)


def test_memoised_group_totals_and_checked_mappings_answer_for_the_group_and_mapping_asked() -> None:
    """Group totals are memoised per architecture and group, checked mappings per mapping: a
    group asked again under another name gets its own name (in its traffic too) and the same
    floats as a fresh cascade's; a mapping differing only in its description keeps its own;
    an illegal mapping is refused every time."""
    from dataclasses import replace

    from mambalaya.fusion.mapping import Mapping, MappingError
    from mambalaya.cost.latency import group_totals

    arch = load_arch("mambalaya")
    cascade = mamba1_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=512, batch=4)
    m = named_mapping("optimal", cascade, 1 << 20, arch=arch)
    g = m.groups[0]
    first = group_totals(arch, cascade, g)
    renamed = group_totals(arch, cascade, replace(g, name="X"))
    assert (renamed.group, renamed.traffic.group) == ("X", "X")
    assert (first.group, first.traffic.group) == (g.name, g.name)
    fresh = group_totals(arch, mamba1_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=512, batch=4), g)
    assert (renamed.latency, renamed.comp_latency, renamed.mem_latency) == (fresh.latency, fresh.comp_latency, fresh.mem_latency)

    again = check_mapping(cascade, replace(m, description="another description"))
    assert again.description == "another description" and again.groups == check_mapping(cascade, m).groups
    broken = Mapping("broken", m.groups[1:], m.buffer_bytes)
    for _ in range(2):
        with pytest.raises(MappingError, match="in no group"):
            check_mapping(cascade, broken)
    assert check_mapping(cascade, Mapping(m.name, list(m.groups), m.buffer_bytes)).groups == check_mapping(cascade, m).groups  # type: ignore[arg-type]
