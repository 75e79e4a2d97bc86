"""Geens et al.'s equal-area comparison with MARCA, on their own setup.

Their claim (arXiv 2504.17333, abstract): "a fusion-aware hardware architecture can achieve
1.78x higher performance than the state-of-the-art MARCA accelerator, within the same area
budget". Their artifact (RobinGeens/PACT-AE) sets it up as follows, and so does this module:

* one area budget, MARCA's 222 mm^2 (``scripts/util.py``, ``generate_accelerator``), split
  between SRAM and PEs; MARCA is the 80% SRAM / 20% PE point (24 MiB and 8192 PEs), so the
  whole area would hold 30 MiB of SRAM or 40,960 PEs (``util.py`` lines 25-26) and a split
  with memory share ``m`` has ``m x 30 MiB`` of SRAM and ``ceil((1 - m) x 40960)`` PEs;
* the PEs form one array whose shape is the most square factor pair of the count (snapped to
  a power of two within 5%) with sides less than 3 apart in ratio;
* DRAM bandwidth scales with the square root of the area (the chip's perimeter:
  ``compute_dram_bandwidth``), 2048 bit/cycle at 1 GHz (256 GB/s) at the full area;
* their Mamba1-2.7B (d_state 64, 64 layers), batch 1, W32A32, prefill at L = 64 and 1024
  (``scripts/sweep_contour.py``), every split running their memory-aware fused schedule.

Here the fused schedule is ``ssm-ri`` (their Fuse-All group) with the tiles our search picks to
fit each split's SRAM, which stands in for their "Mem-Aware" split of the channel rank D.
The ratio is the MARCA point's latency over the best split's, per length. The base design is
``marca-original``; what is not in their setup (its buffer bandwidth, its costs of nonlinear
functions) is that spec's, with its sources.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from mambalaya.arch import load_arch, with_settings
from mambalaya.arch.spec import ArchSpec

#: MARCA's area in Geens et al.'s artifact (scripts/util.py, generate_accelerator's docstring).
MARCA_AREA_MM2 = 222.0
#: MARCA's split: 80% of the area SRAM (24 MiB), 20% PEs (8192): util.py lines 21-26. The PE share
#: is its own constant, as there (``NB_PE / 0.2``): ``1 - 0.8`` is 0.19999999999999996 in floating
#: point, which made the full area 40960.00000000001 PEs and ten of the nineteen splits' arrays one
#: PE larger than the artifact's (their 5% split 119 x 327 for its 152 x 256).
MARCA_MEMORY_SHARE = 0.8
MARCA_PE_SHARE = 0.2
MARCA_SRAM_BYTES = 24 * 2**20
MARCA_PES = 8192
#: The memory shares their sweep covers (sweep_contour.py: 1/20 to 19/20).
MEMORY_SHARES: tuple[float, ...] = tuple(round(k / 20, 2) for k in range(1, 20))
#: Area fractions of 222 mm^2 their sweep covers (sweep_contour.py, area_reduction_sweep).
AREA_FRACTIONS: tuple[float, ...] = (0.125, 0.5, 1.0, 1.25)


def array_shape(pes: int) -> tuple[int, int]:
    """(rows, cols) of an array of about ``pes`` PEs, as the artifact shapes it: a count within 5%
    of a power of two becomes that power; then the most square factor pair whose long side is
    less than 3 times the short one (the square root on both sides if there is none)."""
    if pes < 1:
        raise ValueError(f"an array needs at least one PE (got {pes})")
    count = pes
    for offset in range(1, math.ceil(0.05 * pes)):
        near = [n for n in (pes - offset, pes + offset) if n > 0 and n & (n - 1) == 0]
        if near:
            count = near[0]
            break
    for rows in range(math.isqrt(count), 0, -1):
        if count % rows == 0 and (count // rows) / rows < 3:
            return rows, count // rows
    side = math.isqrt(count)
    return side, side


def split_design(base: ArchSpec, memory_share: float, area_fraction: float = 1.0) -> ArchSpec:
    """``base`` rebuilt on ``area_fraction`` of MARCA's area with ``memory_share`` of it SRAM."""
    if not 0 < memory_share < 1:
        raise ValueError(f"memory_share must lie strictly between 0 and 1 (got {memory_share})")
    if area_fraction <= 0:
        raise ValueError(f"area_fraction must be positive (got {area_fraction})")
    full_sram = MARCA_SRAM_BYTES / MARCA_MEMORY_SHARE
    full_pes = MARCA_PES / MARCA_PE_SHARE  # 40960.0 exactly, as util.py's NB_PE_FULL_AREA
    sram = int(area_fraction * full_sram * memory_share)
    rows, cols = array_shape(math.ceil(area_fraction * full_pes * (1 - memory_share)))
    dram = base.memory.offchip_bandwidth_bytes_per_s * math.sqrt(area_fraction)
    settings = [f"compute.array_rows={rows}", f"compute.array_cols={cols}",
                f"memory.onchip_buffer_bytes={sram}", f"memory.offchip_bandwidth_bytes_per_s={dram!r}"]
    return with_settings(base, settings, option="equal-area split")


#: The variant with the SRAM's bandwidth unbounded, as Geens et al.'s model leaves it (the other
#: variant bounds it at marca-original's).
UNBOUNDED_VARIANT = "buffer bandwidth unbounded (their model)"


def geens_equal_area_rows(seq_lens: tuple[int, ...] = (64, 1024), area_fraction: float = 1.0,
                          shares: tuple[float, ...] = MEMORY_SHARES) -> pd.DataFrame:
    """Every split of the area at each length: latency per token under the fused schedule, and
    the MARCA point's latency over it."""
    from mambalaya.experiments.claims import GEENS_AREA_SETUP
    from mambalaya.experiments.evaluate import evaluate
    from mambalaya.errors import MambalayaError
    from mambalaya.workloads.blocks.mamba1 import parse_config

    setup = GEENS_AREA_SETUP
    cfg = parse_config(dict(setup.model_config), source="Geens et al.'s Mamba1-2.7B")
    spec0 = load_arch("marca-original")
    variants = {f"buffer {spec0.memory.buffer_bandwidth_bytes_per_cycle:,.0f} B/cycle (marca-original)": spec0,
                UNBOUNDED_VARIANT: with_settings(
                    spec0, ["memory.onchip_banks=null", "memory.onchip_bank_port_bytes=null"], option="equal-area variant")}
    rows: list[dict[str, Any]] = []
    for (variant, base), L in ((v, L) for v in variants.items() for L in seq_lens):
        found: list[dict[str, Any]] = []
        for share in shares:
            spec = split_design(base, share, area_fraction)
            row = {"variant": variant, "seq_len": L, "area_mm2": MARCA_AREA_MM2 * area_fraction, "memory_share": share,
                   "array": f"{spec.compute.array_rows}x{spec.compute.array_cols}",
                   "pes": spec.compute.pe_count, "sram_mib": spec.memory.onchip_buffer_bytes / 2**20,
                   "dram_gb_per_s": spec.memory.offchip_bandwidth_bytes_per_s / 1e9}
            try:
                ev = evaluate(spec, "geens-mamba1-2.7b", cfg, phase="prefill", seq_len=L, batch=setup.batch,
                              mapping="ssm-ri")
                row.update(ms_per_token=ev.result.model_latency_s / L * 1e3, bound=ev.result.bound, error="")
            except MambalayaError as err:
                row.update(ms_per_token=float("nan"), bound="", error=str(err).split(";")[0][:160])
            found.append(row)
        marca = next((r["ms_per_token"] for r in found if abs(r["memory_share"] - MARCA_MEMORY_SHARE) < 1e-9),
                     float("nan"))
        for r in found:
            r["speedup_over_marca_point"] = marca / r["ms_per_token"]
        rows.extend(found)
    return pd.DataFrame(rows)


def best_splits(rows: pd.DataFrame) -> pd.DataFrame:
    """Per length: the MARCA point, the best split and their ratio (the claim's 1.78x)."""
    out = []
    for (variant, L), g in rows.groupby(["variant", "seq_len"], sort=False):
        ok = g.dropna(subset=["ms_per_token"])
        if ok.empty:
            continue
        best = ok.loc[ok.ms_per_token.idxmin()]
        marca = g[(g.memory_share - MARCA_MEMORY_SHARE).abs() < 1e-9].iloc[0]
        out.append({"variant": variant, "seq_len": int(L), "marca_point_ms_per_token": marca.ms_per_token,
                    "best_memory_share": best.memory_share, "best_array": best["array"], "best_sram_mib": best.sram_mib,
                    "best_ms_per_token": best.ms_per_token, "speedup": marca.ms_per_token / best.ms_per_token})
    return pd.DataFrame(out)


__all__ = ["AREA_FRACTIONS", "MARCA_AREA_MM2", "MEMORY_SHARES", "UNBOUNDED_VARIANT", "array_shape", "best_splits",
           "geens_equal_area_rows", "split_design"]
