"""A GPU kernel's launch grid: a grid of fewer thread blocks than SMs runs its compute and
on-chip work on that many SMs and draws at most what they keep in flight; a grid that fills the
GPU costs what every evaluation costs."""

from __future__ import annotations

import pytest

from mambalaya.arch import load_arch, loads_arch, arch_to_yaml, with_settings
from mambalaya.arch.kernels import array_share, compute_hz, grid_shares, offchip_bytes_per_s, speed_of_light
from mambalaya.cost.latency import combine, group_cycles, group_totals, onchip_seconds
from mambalaya.cost.launch import Launch, block_reread_bytes, block_rereads, launched_group_seconds
from mambalaya.errors import SpecError
from mambalaya.experiments.validate import case_cascade, load_cases
from mambalaya.fusion.mapping import FusionGroup


@pytest.fixture(scope="module")
def delta_rule():
    """FLA's chunk-state kernel of the 8-head, 64K-token case: its Einsums as one group."""
    cases, name = load_cases()
    case = next(c for c in cases.cases if c.id == "gdn-fla-h8-L64k")
    part = case_cascade(case, name)
    return part, FusionGroup("h", ("DC", "CD", "ST", "KW", "HC"))


def test_a_grid_shares_the_sms_it_occupies() -> None:
    gpu = load_arch("gpu-h100")
    assert grid_shares(gpu, 1000) == (1.0, 1.0)
    compute, offchip = grid_shares(gpu, 16)
    assert compute == pytest.approx(16 / 132) and offchip == 1.0  # 16 x 570 GB/s is above 0.89 x 3.35 TB/s
    compute, offchip = grid_shares(gpu, 2)
    assert compute == pytest.approx(2 / 132)
    assert offchip == pytest.approx(2 * 570e9 / offchip_bytes_per_s(gpu))
    assert grid_shares(speed_of_light(gpu), 2) == (1.0, 1.0)  # the peak rates know no grid
    assert grid_shares(load_arch("mambalaya"), 2) == (1.0, 1.0)  # nor does an accelerator


def test_thread_blocks_are_the_product_of_each_ranks_tiles(delta_rule) -> None:
    part, _ = delta_rule
    assert Launch((("P", 32), ("G", 1))).thread_blocks(part) == 4 * 8
    assert Launch((("P", 48),)).thread_blocks(part) == 3  # ceil(128 / 48)
    with pytest.raises(SpecError, match="rank 'Z'"):
        Launch((("Z", 1),)).thread_blocks(part)
    with pytest.raises(SpecError, match="at least 1"):
        Launch((("P", 0),)).thread_blocks(part)


def test_a_grid_that_fills_the_gpu_costs_what_the_group_costs(delta_rule) -> None:
    part, group = delta_rule
    gpu = load_arch("gpu-h100")
    full = group_totals(gpu, part, group).latency
    assert launched_group_seconds(gpu, part, group, None) == full
    assert launched_group_seconds(gpu, part, group, Launch((("C", 1), ("G", 1)))) == pytest.approx(full)


def _launched_onchip_s(gpu, part, group, launch) -> float:
    """The on-chip seconds of a launched group: its staging levels carry its off-chip bytes and
    every re-read of its blocks, from DRAM or from the L2 (cost.launch's module doc)."""
    t = group_totals(gpu, part, group)
    again = block_rereads(gpu, part, group, launch)
    buffer_bytes = t.buffer.total_bytes if t.buffer is not None else 0.0
    return float(onchip_seconds(gpu, buffer_bytes, t.traffic.total_bytes + again.total_bytes))


def test_an_underfilled_grid_slows_its_compute_by_the_idle_share(delta_rule) -> None:
    """32 blocks (4 of 32 value channels x 8 heads) on 132 SMs: the compute and on-chip seconds
    over 32/132, the off-chip ones as before (32 SMs keep more than the HBM's bandwidth flowing)."""
    part, group = delta_rule
    gpu = load_arch("gpu-h100")
    t = group_totals(gpu, part, group)
    share = 32 / 132
    grid = Launch((("P", 32), ("G", 1)))
    expected, _ = combine(gpu, t.comp_latency / share, t.mem_latency, _launched_onchip_s(gpu, part, group, grid) / share,
                          t.steps, len(group.einsums))
    got = launched_group_seconds(gpu, part, group, grid)
    assert got == pytest.approx(expected) and got > t.latency


def test_every_reread_crosses_the_l2s_port(chunk_scan, monkeypatch) -> None:
    """TileLang's chunk-scan grid launches a chunk's heads first: they run together, so their
    re-reads of the chunk's C·B scores and C (one group, every head reads them) come from the L2,
    not DRAM, but each still crosses the L2's SM-facing port: the staging level's seconds count
    the group's off-chip bytes plus every re-read, and at the H100's 5120 B/clk they bind the
    kernel (it was memory-bound at its DRAM bytes alone). Where the L2 holds nothing and one SM
    runs at a time, the re-reads come from DRAM (but along the fastest rank, whose blocks follow
    each other with none between); the total is the same."""
    from mambalaya.cost import launch as launch_module
    from mambalaya.cost.traffic import untiled_traffic

    part, group = chunk_scan
    gpu = load_arch("gpu-h100")
    tilelang = Launch((("R", 1), ("G", 1), ("P", 64), ("Q", 64), ("B", 1), ("C", 1)))
    again = block_rereads(gpu, part, group, tilelang)
    reads, _ = untiled_traffic(part, group.einsums)
    heads = part.size("R") * part.size("G")
    shared = reads["CB"] + reads["CM"]
    assert again.cache_bytes >= shared * (heads - 1) and again.dram_bytes == block_reread_bytes(gpu, part, group, tilelang)
    t = group_totals(gpu, part, group)
    l2_bytes_per_s = gpu.memory.levels["l2"].bytes_per_cycle * gpu.clock_hz
    staged = (t.traffic.total_bytes + again.total_bytes) / l2_bytes_per_s
    assert staged > t.mem_latency  # the port binds, not the DRAM
    got = launched_group_seconds(gpu, part, group, tilelang)
    assert got >= staged and got == pytest.approx(max(staged, t.comp_latency, t.mem_latency
                                                      + again.dram_bytes / offchip_bytes_per_s(gpu)), rel=0.05)
    wider = with_settings(gpu, ["memory.levels.l2.bandwidth_bytes_per_cycle=10240"], option="test")
    assert launched_group_seconds(wider, part, group, tilelang) < got
    assert launched_group_seconds(gpu, part, group, None) == t.latency  # no grid: each input read once
    monkeypatch.setattr(launch_module, "cache_bytes", lambda arch: 0)
    one_sm = gpu.model_copy(update={"kernels": gpu.kernels.model_copy(update={"sm_count": 1})})
    cold = block_rereads(one_sm, part, group, tilelang)
    assert cold.total_bytes == pytest.approx(again.total_bytes) and cold.dram_bytes > 10 * again.dram_bytes


@pytest.fixture(scope="module")
def attention():
    """FlashAttention-2's forward of the 16-head, head-dim-128, 2K-key case: the blocked softmax's
    Einsums as one group (its score and value products on the tensor cores)."""
    cases, name = load_cases()
    case = next(c for c in cases.cases if c.id == "fa2-fwd-d128-L2k")
    part = case_cascade(case, name)
    return part, FusionGroup("fa", tuple(e.name for e in part.einsums))


def test_a_kernel_issuing_the_synchronous_mma_runs_its_contractions_at_the_specs_share(attention) -> None:
    """On the H100 a kernel issuing mma.sync (FlashAttention-2's) runs its tensor-core cycles at
    kernels.sync_mma_fraction of the peak: its compute seconds are the array's cycles over that
    share (the lanes' and the special-function units' as before), its off-chip and on-chip ones
    unchanged. On the A100, whose peak that instruction reaches, on a spec without the field, and
    for the speed of light (the peak rates), nothing changes."""
    part, group = attention
    gpu = load_arch("gpu-h100")
    share = gpu.kernels.sync_mma_fraction
    assert share == pytest.approx(2 / 3, abs=1e-3) and array_share(gpu, True) == share
    assert array_share(gpu, False) == 1.0
    cycles, _ = group_cycles(gpu, part, group)
    assert cycles.array_2d > max(cycles.vector, cycles.mfu)  # the array binds this group
    t = group_totals(gpu, part, group)
    expected, _ = combine(gpu, cycles.array_2d / share / compute_hz(gpu), t.mem_latency, t.onchip_latency, t.steps,
                          len(group.einsums))
    slow = launched_group_seconds(gpu, part, group, None, sync_mma=True)
    assert slow == pytest.approx(float(expected)) and slow > t.latency * 1.4
    a100 = load_arch("gpu-a100")
    assert a100.kernels.sync_mma_fraction is None and array_share(a100, True) == 1.0
    assert launched_group_seconds(a100, part, group, None, sync_mma=True) == group_totals(a100, part, group).latency
    peak = speed_of_light(gpu)
    assert launched_group_seconds(peak, part, group, None, sync_mma=True) == group_totals(peak, part, group).latency
    grid = Launch((("G", 1),))  # one block per head: 16 blocks on 132 SMs, slowed by both
    busy, drawn = grid_shares(gpu, grid.thread_blocks(part))
    expected, _ = combine(gpu, cycles.array_2d / share / compute_hz(gpu) / busy,
                          (t.mem_latency + block_reread_bytes(gpu, part, group, grid) / offchip_bytes_per_s(gpu)) / drawn,
                          _launched_onchip_s(gpu, part, group, grid) / busy, t.steps, len(group.einsums))
    assert launched_group_seconds(gpu, part, group, grid, sync_mma=True) == pytest.approx(float(expected))


def test_the_sync_mma_fraction_is_a_checked_fraction() -> None:
    text = arch_to_yaml(load_arch("gpu-h100"))
    assert "sync_mma_fraction: 0.667" in text
    for bad in ("0", "1.5", "-0.3"):
        with pytest.raises(SpecError, match="sync_mma_fraction"):
            loads_arch(text.replace("sync_mma_fraction: 0.667", f"sync_mma_fraction: {bad}"))


def test_sm_fields_are_checked() -> None:
    text = arch_to_yaml(load_arch("gpu-h100"))
    with pytest.raises(SpecError, match="sm_offchip_bytes_per_s needs sm_count"):
        loads_arch(text.replace("  sm_count: 132\n", ""))
    with pytest.raises(SpecError, match="sm_count"):
        loads_arch(text.replace("sm_count: 132", "sm_count: 0"))


def test_a_scan_kernel_takes_its_fitted_cycles_per_element_step() -> None:
    """A GPU group with an elementwise recurrence computes no faster than its element-steps at
    kernels.scan_sm_cycles_per_step over the SMs (cost.latency.scan_floor_s); the speed of light
    and a spec without the field have no such floor; a recurrence that contracts a state (the
    delta rule's HC) or a group without one is not floored."""
    from mambalaya.cost.latency import scan_floor_s, scan_steps
    from mambalaya.workloads import PRESETS, build_layer

    gpu = load_arch("gpu-a100-pcie")
    c = build_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=2048, batch=1)
    scan = ("AD", "BX", "H", "YS")
    steps = c.size("B") * c.size("I") * c.size("E") * c.size("N")
    assert scan_steps(c, c.einsum("H")) == steps and scan_steps(c, c.einsum("YS")) == 0.0
    floor = steps * gpu.kernels.scan_sm_cycles_per_step / (gpu.kernels.sm_count * gpu.clock_hz)
    assert scan_floor_s(gpu, c, scan) == pytest.approx(floor, rel=1e-12)
    t = group_totals(gpu, c, FusionGroup("s", scan))
    assert t.comp_latency == pytest.approx(floor, rel=1e-12) and t.latency >= floor
    assert scan_floor_s(speed_of_light(gpu), c, scan) == 0.0
    assert scan_floor_s(gpu, c, ("XI", "Z")) == 0.0
    unset = gpu.model_copy(update={"kernels": gpu.kernels.model_copy(update={"scan_sm_cycles_per_step": None})})
    assert scan_floor_s(unset, c, scan) == 0.0
    assert group_totals(unset, c, FusionGroup("s", scan)).comp_latency < floor
    cases, name = load_cases()
    gdn = case_cascade(next(x for x in cases.cases if x.id == "gdn-fla-h8-L64k"), name)
    assert scan_steps(gdn, gdn.einsum("HC")) == 0.0  # its update contracts the state (KW . HC)


def test_the_scan_rate_needs_the_sm_count() -> None:
    text = arch_to_yaml(load_arch("gpu-a100-pcie")).replace("  sm_offchip_bytes_per_s: 410000000000.0\n", "")
    assert "scan_sm_cycles_per_step" in text
    with pytest.raises(SpecError, match="scan_sm_cycles_per_step needs sm_count"):
        loads_arch(text.replace("  sm_count: 108\n", ""))
    with pytest.raises(SpecError, match="scan_sm_cycles_per_step"):
        loads_arch(text.replace("scan_sm_cycles_per_step: 0.585", "scan_sm_cycles_per_step: -1"))


def test_every_recurrence_of_every_shipped_form_is_floored_by_its_algebra() -> None:
    """The scan floor is a rule about Einsums, proved on every shipped form (workloads.shipped:
    every family, layer type, phase, scan and softmax form): a recurrence is a scan kernel's
    steps exactly when it is elementwise (reduces nothing, contracts no state) and some step
    waits on another. Listed by name, so a new form shows up here: floored are the selective
    scans (Mamba-1/2 recurrent H), the cumulative sums (ACS), the SSD's state passing over more
    than one chunk (HC) and the online softmax's running statistics (MR, LR; OR and AOR where the
    per-key form makes them elementwise); not floored are the recurrences that contract a state
    (the delta rule's H and HC, the forward substitution TI, the blocked softmax's P.V update OR
    and AOR) and those with one step (a decode step's H, the SSD's HC over one chunk)."""
    from mambalaya.cost.latency import scan_steps
    from mambalaya.workloads.shipped import shipped_layers

    floored: set[str] = set()
    contracting: set[str] = set()
    one_step: set[str] = set()
    for layer in shipped_layers():
        c = layer.cascade
        for e in c.einsums:
            along = c.recurrence(e)
            if along is None:
                continue
            contracts = bool(e.reduced_variables or c.contracted_state_ranks(e))
            waits = c.size(along[0]) > along[1]
            assert (scan_steps(c, e) > 0) == (not contracts and waits), (layer.preset, layer.phase, e.name)
            (contracting if contracts else floored if waits else one_step).add(e.name)
            if e.name == "H" and layer.phase == "decode":
                assert not waits  # one update per decode step: no scan
    assert floored == {"ACS", "ALR", "AMR", "AOR", "H", "HC", "LR", "MR", "OR"}
    assert contracting == {"AOR", "H", "HC", "OR", "TI"}
    assert one_step == {"H", "HC"}


def test_evaluate_prints_the_scan_floors_inputs() -> None:
    """Every number traceable: on a GPU spec the scan floor's rate, SMs, clock and each
    recurrence's element-steps are printed; on a GPU spec without the rate, a note; on an
    accelerator nothing."""
    from typer.testing import CliRunner

    from mambalaya.cli import app

    runner = CliRunner()
    gpu = runner.invoke(app, ["evaluate", "--arch", "gpu-a100-pcie", "--model", "mamba-130m", "-B", "1", "-L", "2048"])
    assert gpu.exit_code == 0, gpu.output
    steps = 1 * 2048 * 1536 * 16
    said = " ".join(gpu.output.split())
    assert ("scan_sm_cycles_per_step 0.585 SM-cycles per element-step, the shipped specs' value fitted by validate "
            "being 0.585; 108 SMs at 1.41 GHz" in said and f"H {steps:,} element-steps" in said)
    accel = runner.invoke(app, ["evaluate", "--arch", "mambalaya", "--model", "mamba-130m", "-B", "1", "-L", "2048"])
    assert accel.exit_code == 0 and "scan kernels" not in accel.output and "scan_sm_cycles_per_step" not in accel.output
    # a GPU spec without the rate is not silently at the lanes' peak: it says so
    unset = runner.invoke(app, ["evaluate", "--arch", "gpu-a100-pcie", "--model", "mamba-130m", "-B", "1", "-L", "2048",
                                "--set", "kernels.scan_sm_cycles_per_step=null"])
    assert unset.exit_code == 0 and "has no scan_sm_cycles_per_step, so its scans (H) run at the lanes' peak" in unset.output


@pytest.fixture(scope="module")
def chunk_scan():
    """The SSD chunk-scan kernel of the TileLang benchmark at L 32K (8 sequences, 80 heads of 64,
    chunk 256): its Einsums as one group."""
    cases, name = load_cases()
    case = next(c for c in cases.cases if c.id == "chunk-scan-triton-L32k")
    part = case_cascade(case, name)
    return part, FusionGroup("scan", tuple(e.name for e in part.einsums))


def test_blocks_reread_what_their_tile_does_not_index_unless_the_l2_holds_it(chunk_scan, monkeypatch) -> None:
    """mamba_ssm's chunk-scan grid launches a chunk's heads last (the slowest index): every head's
    blocks read the chunk's C·B scores and C again, and between two heads the grid reads far more
    than the L2 holds, so each re-read comes from DRAM: the extra bytes are those tensors' bytes
    times (heads - 1), and the few the mask and D add. TileLang's grid launches the heads first:
    a chunk's heads run together and read the scores once (only the mask's and D's, which no block
    rank indexes but Q and S, come again)."""
    from mambalaya.cost import launch as launch_module
    from mambalaya.cost.launch import block_reread_bytes, cache_bytes
    from mambalaya.cost.traffic import untiled_traffic

    part, group = chunk_scan
    gpu = load_arch("gpu-h100")
    assert cache_bytes(gpu) == 50 * 2**20 and cache_bytes(load_arch("mambalaya")) == 0
    reads, _ = untiled_traffic(part, group.einsums)
    heads = part.size("R") * part.size("G")
    assert heads == 80
    triton = Launch((("P", 64), ("Q", 64), ("B", 1), ("C", 1), ("R", 1), ("G", 1)))
    shared = reads["CB"] + reads["CM"]  # the scores and C: one group, every head reads them
    small = reads["LM"] + reads["DS"]  # the causal mask and D (160 bytes): re-read too, a few MB in all
    extra = block_reread_bytes(gpu, part, group, triton)
    assert shared * (heads - 1) <= extra <= shared * (heads - 1) + small * triton.thread_blocks(part)
    tilelang = Launch((("R", 1), ("G", 1), ("P", 64), ("Q", 64), ("B", 1), ("C", 1)))
    assert block_reread_bytes(gpu, part, group, tilelang) <= small * tilelang.thread_blocks(part)  # the mask's only
    assert launched_group_seconds(gpu, part, group, triton) > 2 * launched_group_seconds(gpu, part, group, tilelang)
    # blocks that run together share what they read, whatever the L2: TileLang's 80 heads of a
    # chunk are 80 consecutive blocks, fewer than the 132 SMs, so even without an L2 they read the
    # scores once; an unbounded L2 spares Triton's re-reads too
    monkeypatch.setattr(launch_module, "cache_bytes", lambda arch: 0)
    assert block_reread_bytes(gpu, part, group, tilelang) <= small * tilelang.thread_blocks(part)
    # on 64 SMs, the 80 heads launched between two Q tiles of a chunk no longer run together: the
    # incoming states (which every Q tile reads whole) come again from DRAM, per Q tile of 64
    fewer_sms = gpu.model_copy(update={"kernels": gpu.kernels.model_copy(update={"sm_count": 64})})
    q_tiles = part.size("Q") // 64
    again = block_reread_bytes(fewer_sms, part, group, tilelang)
    assert reads["HC"] * (q_tiles - 1) <= again <= reads["HC"] * (q_tiles - 1) + small * tilelang.thread_blocks(part)
    monkeypatch.setattr(launch_module, "cache_bytes", lambda arch: 10**18)
    assert block_reread_bytes(gpu, part, group, triton) == 0.0


def test_the_measured_order_of_two_chunk_scan_kernels_follows_their_grids() -> None:
    """The same Einsums at the same sizes, measured at 5.08 ms (TileLang) and 7.64 ms (mamba_ssm's
    Triton kernel) on one H800 at L 32K: the model predicts the Triton kernel slower by its grid's
    order alone (each head's blocks re-reading the chunk's scores from DRAM; Triton's within the
    band, TileLang's, which writes only its output, below it)."""
    from mambalaya.experiments.validate import validate_case

    cases, name = load_cases()
    results = {c.id: validate_case(c, cases.sources[c.source], name) for c in cases.cases
               if c.id in ("chunk-scan-triton-L32k", "chunk-scan-tilelang-L32k")}
    triton, tilelang = results["chunk-scan-triton-L32k"], results["chunk-scan-tilelang-L32k"]
    assert triton.predicted_s > 2 * tilelang.predicted_s and triton.measured_s > tilelang.measured_s
    assert triton.in_band and triton.speed_of_light_s == tilelang.speed_of_light_s
    # the report names the grid each prediction took and what its blocks read again on it
    (grid, reread), = triton.launched
    assert [rank for rank, _ in grid.tiles] == ["P", "Q", "B", "C", "R", "G"] and reread > 15e9
    assert tilelang.launched[0][1] < reread / 100
    from mambalaya.experiments.validate import Validation

    row = Validation("x", (triton,), (), ()).rows()[0]
    assert row["block_reread_bytes"] == reread and row["launched_grids"].startswith("P/")
