"""AccelForge export (runs under 3.11) and traffic cross-check (needs a Python >= 3.12 with accelforge).

The cross-check tests locate an interpreter with ``accelforge`` and ``mambalaya`` importable
(``$MAMBALAYA_ACCELFORGE_PYTHON``, else ``/tmp/af312/bin/python``, else ``python3.12`` on PATH)
and are skipped, with the reason printed, only when none exists.
"""

from __future__ import annotations

import sys

import pytest
import yaml

from mambalaya.einsum import loads_cascade
from mambalaya.errors import MambalayaError, SpecError
from mambalaya.interop.accelforge import (
    translate,
    cross_check,
    cross_check_via,
    export_arch,
    export_workload,
    unfused_mapping_yaml,
    write_export,
)
from mambalaya.workloads import PRESETS, build_layer
from mambalaya.workloads.blocks.mamba1 import Mamba1Config
from mambalaya.workloads.blocks.mamba2 import Mamba2Config

TINY = Mamba1Config(d_model=8, d_state=4)
T = 4


def decode(config=PRESETS["mamba-130m"]):
    return build_layer(config, phase="decode", seq_len=1, batch=1)


def prefill(config=PRESETS["mamba-130m"], steps=T):
    return build_layer(config, phase="prefill", seq_len=steps, batch=1)


# ----------------------------------------------------------------------------- export (3.11)


def test_decode_workload_parses_and_names_everything():
    c = decode()
    text = export_workload(c)
    data = yaml.safe_load(text)
    einsums = data["workload"]["einsums"]
    assert [e["name"] for e in einsums] == [e.name for e in c.einsums]
    tensors = {ta["name"] for e in einsums for ta in e["tensor_accesses"]}
    assert tensors == set(c.tensors)  # every tensor, state in (H0, CS0) and out (H, CSN)
    for e in einsums:
        assert sum(bool(ta.get("output")) for ta in e["tensor_accesses"]) == 1
    # the scan reads the incoming state, not itself
    scan = next(e for e in einsums if e["name"] == "H")
    assert [ta["name"] for ta in scan["tensor_accesses"]] == ["AD", "H0", "BX", "H"]
    # every projection variable is bounded
    bounded = set(data["workload"]["iteration_space_shape"])
    assert {v for e in einsums for ta in e["tensor_accesses"] for v in ta["projection"].values()} <= bounded


def test_header_lists_approximations():
    text = export_workload(decode())
    header = "\n".join(ln for ln in text.splitlines() if ln.startswith("#"))
    for word in ("Approximations", "nonlinear", "duplicate access X[b,i,d]", "window", "auxiliary"):
        assert word in header


def test_unrolled_scan_has_one_einsum_per_step():
    c = prefill()
    data = yaml.safe_load(export_workload(c, unroll_scan=T))
    names = [e["name"] for e in data["workload"]["einsums"]]
    assert [n for n in names if n.startswith("H_")] == [f"H_{t}" for t in range(T)]
    assert "H" not in names
    steps = {e["name"]: e for e in data["workload"]["einsums"]}
    assert "H_0" not in [ta["name"] for ta in steps["H_1"]["tensor_accesses"] if ta.get("output")]
    assert "H_0" in [ta["name"] for ta in steps["H_1"]["tensor_accesses"]]  # H_t reads H_{t-1}
    ys = steps["YS"]
    assert {ta["name"] for ta in ys["tensor_accesses"]} >= {f"H_{t}" for t in range(T)}
    header = export_workload(c, unroll_scan=T).split("workload:")[0]
    assert f"scan unrolled into {T} steps" in header and "H_0, H_1, H_2, H_3" in header
    # the step tensors AccelForge sees are those of mambalaya's own unrolled cascade
    graph, _ = translate(c, T)
    assert graph.tensors.keys() == {ta["name"] for e in steps.values() for ta in e["tensor_accesses"]}


def test_recurrence_without_unroll_is_refused():
    with pytest.raises(SpecError, match="unroll_scan"):
        export_workload(prefill())
    with pytest.raises(SpecError, match="seq_len"):
        export_workload(prefill(), unroll_scan=T + 1)
    plain = loads_cascade(
        "name: plain\nranks: {I: 3}\ntensors:\n  X: {ranks: [I], role: input}\n  Y: {ranks: [I], role: output}\n"
        "einsums:\n  - Y[i] = X[i]*X[i]\n"
    )
    with pytest.raises(SpecError, match="no recurrence"):
        export_workload(plain, unroll_scan=3)


def test_arch_and_write_export(tmp_path):
    from mambalaya.arch import load_arch

    spec = load_arch("mambalaya")
    text = export_arch(spec)
    assert f"size: {spec.memory.onchip_buffer_bytes * 8}" in text
    assert f"throughput: {spec.memory.offchip_bandwidth_bytes_per_s * 8:g}" in text
    assert f"throughput: {spec.peak_macs_per_s:g}" in text
    paths = write_export(decode(TINY), spec, tmp_path)
    assert sorted(p.name for p in paths) == ["arch.yaml", "mapping_unfused.yaml", "workload.yaml"]
    assert "!Compute {einsum: XO" in (tmp_path / "mapping_unfused.yaml").read_text()
    assert unfused_mapping_yaml(translate(decode(TINY))[1]).count("!Nested") == len(decode(TINY).einsums)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="checks the error under 3.11")
def test_cross_check_in_311_says_why():
    with pytest.raises(MambalayaError, match="Python >= 3.12"):
        cross_check(decode(TINY))


# ----------------------------------------------------------------------------- cross-check (3.12)


@pytest.fixture
def py312(accelforge_worker):
    """The shared AccelForge worker (tests/conftest.py); skipped, saying why, without Python >= 3.12."""
    return accelforge_worker


@pytest.mark.parametrize("config", [TINY, PRESETS["mamba-130m"]], ids=["tiny", "mamba-130m"])
def test_unfused_decode_matches_accelforge_to_the_bit(py312, config):
    c = decode(config)
    rows = cross_check_via(py312, c)["rows"]
    assert {r["tensor"] for r in rows} == set(c.tensors)
    for r in rows:
        assert r["accelforge_bits"] == r["ours_bits"], r


@pytest.mark.parametrize("config,state_io", [(TINY, False), (TINY, True), (PRESETS["mamba-130m"], False)],
                         ids=["tiny", "tiny-state", "mamba-130m"])
def test_unfused_unrolled_scan_matches_accelforge_to_the_bit(py312, config, state_io):
    """Both tools cost mambalaya's unrolled cascade (one Einsum per step): every tensor, each
    step's state H_t included, agrees to the bit. Against the recurrent cascade our unfused
    mapping moves exactly (T-1) x B*E*N states fewer: the recurrent scan Einsum carries the state
    on chip from one position to the next, while each unrolled step writes H_t off chip and the
    next step reads it back."""
    c = build_layer(config, phase="prefill", seq_len=T, batch=1, state_io=state_io)
    result = cross_check_via(py312, c, unroll_scan=T)
    rows = {r["tensor"]: r for r in result["rows"]}
    assert set(rows) == set(translate(c, T)[0].tensors)
    assert {f"H_{t}" for t in range(T)} <= set(rows)
    for r in rows.values():
        assert r["accelforge_bits"] == r["ours_bits"], r
    carried = (T - 1) * c.size("B") * c.size("E") * c.size("N") * c.tensors["H"].bits
    assert sum(r["ours_bits"] for r in rows.values()) - result["ours_recurrent_bits"] == carried


MAMBA2_TINY = Mamba2Config(d_model=8, headdim=4, d_state=2, ngroups=2, chunk_size=4, d_conv=3)
#: The chunked form at its smallest that still has both of its recurrences and a pass between
#: chunks: 2 chunks of 2 positions (AccelForge's time grows with the unrolled Einsums).
MAMBA2_TINY_CHUNKS = MAMBA2_TINY.model_copy(update={"chunk_size": 2})


@pytest.mark.parametrize("config,phase,seq_len,scan,unroll", [
    (MAMBA2_TINY, "decode", 1, "recurrent", None),
    (MAMBA2_TINY, "prefill", T, "recurrent", T),
    # the chunked form (two recurrences: the cumulative decay over Q, the state over chunks) is
    # checked to the bit under mixed widths, test_mixed_precision_matches_accelforge_to_the_bit
], ids=["decode", "recurrent-unrolled"])
def test_unfused_mamba2_matches_accelforge_to_the_bit(py312, config, phase, seq_len, scan, unroll):
    c = build_layer(config, phase=phase, seq_len=seq_len, batch=1, scan=scan)
    rows = cross_check_via(py312, c, unroll_scan=unroll)["rows"]
    assert {r["tensor"] for r in rows} == set(translate(c, unroll)[0].tensors)
    for r in rows:
        assert r["accelforge_bits"] == r["ours_bits"], r


def test_export_carries_per_tensor_widths():
    """Under a mixed policy the workload's 'All' width is the most common one and every access
    to a tensor of another width carries its own bits_per_value."""
    c = build_layer(TINY, phase="prefill", seq_len=T, batch=1, state_io=True, precision="reference-kernels")
    data = yaml.safe_load(export_workload(c, unroll_scan=T))
    assert data["workload"]["bits_per_value"] == {"All": 16}
    graph = translate(c, T)[0]
    for e in data["workload"]["einsums"]:
        for ta in e["tensor_accesses"]:
            bits = graph.tensors[ta["name"]].bits
            assert ta.get("bits_per_value", 16) == bits, (e["name"], ta["name"])
    assert any(ta.get("bits_per_value") == 32 for e in data["workload"]["einsums"] for ta in e["tensor_accesses"])


@pytest.mark.parametrize("config,phase,seq_len,unroll,state_io", [
    (TINY, "prefill", T, T, True),
    (MAMBA2_TINY_CHUNKS, "prefill", T, T, False),  # the chunked form with incoming state cannot unroll
], ids=["mamba1-unrolled-state", "mamba2-chunked-unrolled"])
def test_mixed_precision_matches_accelforge_to_the_bit(py312, config, phase, seq_len, unroll, state_io):
    """Under reference-kernels (float32 scan tensors, 16-bit elsewhere) both tools still agree
    on every tensor to the bit."""
    c = build_layer(config, phase=phase, seq_len=seq_len, batch=1, state_io=state_io, precision="reference-kernels")
    rows = cross_check_via(py312, c, unroll_scan=unroll)["rows"]
    assert any(translate(c, unroll)[0].tensors[r["tensor"]].bits == 32 and r["ours_bits"] for r in rows)
    for r in rows:  # a masked tensor (the chunked form's LM, LD) moves its live share in ours
        assert r["accelforge_bits"] * r["live_share"] == r["ours_bits"], r


RMSNORM_GEMM = """
name: rmsnorm-gemm
params: {d_model: 8, eps: 1.0e-05}
ranks: {B: 1, I: 4, D: d_model, E: 2*d_model}
tensors:
  X:  {ranks: [B, I, D], role: input, bits: 16}
  WN: {ranks: [D], role: weight}
  W:  {ranks: [D, E], role: weight}
  SS: {ranks: [B, I], role: intermediate}
  XN: {ranks: [B, I, D], role: intermediate}
  Y:  {ranks: [B, I, E], role: output}
einsums:
  - SS[b,i] = X[b,i,d]*X[b,i,d]
  - XN[b,i,d] = X[b,i,d]*rsqrt(SS[b,i]/D + eps)*WN[d]
  - Y[b,i,e] = XN[b,i,d]*W[d,e]
"""


def test_fused_mapper_vs_our_optimal_on_a_norm_and_gemm(py312):
    """AccelForge's mapper (objective: DRAM bits, 50 MiB buffer) vs our optimal search on an
    RMSNorm feeding a GEMM (about 15 s of AccelForge mapping). Both keep SS and XN on chip and
    read each weight once; the one difference: AccelForge's mapping reads X in both SS and XN
    (2x), our single group once. The same comparison on a whole Mamba decode step (about
    4 minutes of AccelForge mapping) is ``benchmarks/bench_accelforge.py --tiny --check``."""
    c = loads_cascade(RMSNORM_GEMM)
    rows = {r["tensor"]: r for r in cross_check_via(py312, c, "mapper", buffer_bytes=50 * 2**20)["rows"]}
    assert set(rows) == {"X", "WN", "W", "Y"}
    differing = {t: (r["ours_bits"], r["accelforge_bits"]) for t, r in rows.items() if r["ours_bits"] != r["accelforge_bits"]}
    assert differing == {"X": (512.0, 1024.0)}


def test_the_export_takes_the_designs_widths_unless_told_otherwise(tmp_path):
    """export accelforge --arch marca-original (a 32-bit design under the uniform policy) wrote a
    16-bit workload, and mambalaya's reference-kernels widths never reached it: the workload now
    takes the design's width and policy, as evaluate does; --bits and --precision still override."""
    from typer.testing import CliRunner

    from mambalaya.cli import app

    def widths(*options):
        out = tmp_path / "_".join(options).replace("-", "") or "default"
        r = CliRunner().invoke(app, ["export", "accelforge", "-o", str(out), *options])
        assert r.exit_code == 0, r.output
        doc = yaml.safe_load((out / "workload.yaml").read_text().split("\nworkload:", 1)[1].join(["workload:", ""]))
        per = [ta.get("bits_per_value") for e in doc["workload"]["einsums"] for ta in e["tensor_accesses"]]
        return doc["workload"]["bits_per_value"]["All"], {w for w in per if w is not None}

    assert widths("--arch", "marca-original")[0] == 32
    default, per_tensor = widths("--arch", "mambalaya")
    assert default == 16 and 32 in per_tensor  # reference-kernels: the float32 state and statistics
    assert widths("--arch", "marca-original", "--bits", "8", "--precision", "uniform") == (8, set())
    assert widths("--set", "bits_per_element=8")[0] == 8
    # the help says so (it printed the crosscheck's defaults, uniform at 16 bits, which the export never used)
    helped = " ".join(CliRunner().invoke(app, ["export", "accelforge", "--help"]).output.replace("│", " ").split())
    assert "Default: the design's bits_per_element" in helped and "Default: the design's own policy" in helped
    assert "[default: 16]" not in helped
    # settings the export carries nowhere, or that an option also sets, changed no file
    run = CliRunner().invoke
    for extra, words in ((["--set", "compute.mfu_units=16"], "carries only"),
                         (["--set", "precision=uniform", "--precision", "reference-kernels"], "both set"),
                         (["--set", "bits_per_element=8", "--bits", "16"], "both set"),
                         # (one core's array and buffer were written beside the chip's DRAM bandwidth)
                         (["--arch", "marca-multicore"], "multi-core design")):
        r = run(app, ["export", "accelforge", "-o", str(tmp_path / "x"), *extra])
        assert r.exit_code == 1 and words in " ".join(r.output.split()), extra
