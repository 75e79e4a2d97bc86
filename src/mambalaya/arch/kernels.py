"""What kernels on a GPU reach of its peak rates: the ``kernels`` section of an arch spec.

A GPU spec's rates are datasheet peaks; a measured kernel reaches a fraction of them and
never finishes faster than a launch allows. This section names those facts as assumptions,
each with its source and range in the spec's ``sources``. They are applied wherever the spec
is evaluated (every group is one kernel), and left out of a speed-of-light figure
(:func:`speed_of_light`), which is the peak rates alone.

A kernel whose grid has fewer thread blocks than the GPU has SMs runs on that many SMs only
(``sm_count``): its compute and on-chip work at their share of the peak, its off-chip traffic
at most at what those SMs can keep in flight (``sm_offchip_bytes_per_s``, Little's law):
:func:`grid_shares`. A group without a launch grid is taken to fill the GPU.

An elementwise recurrence on the vector lanes (the selective scan's state ``H = AD * H[i-1] +
BX``) runs on a GPU as a block-parallel scan: each step waits on loads, warp shuffles and block
barriers, so such a kernel runs far below the lanes' peak. ``scan_sm_cycles_per_step`` is what
it takes per element-step, in SM-cycles (:func:`scan_seconds_per_step`): fitted once on a
declared subset of measurements (``mambalaya validate`` shows the fit and its error on the rest).

A kernel that drives the tensor cores with the synchronous warp-level instruction of an earlier
generation (``mma.sync``, which FlashAttention-2 issues on every GPU since Ampere) runs its
array contractions at ``sync_mma_fraction`` of the array's peak on a GPU whose peak needs a newer
instruction (Hopper's asynchronous ``wgmma``): :func:`array_share`. The kernels section says
what the GPU's instructions reach; which one a kernel issues is the kernel's (a validation case
says so, with its source).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mambalaya.arch.quantities import KERNEL_FLOOR_RANGE, KERNEL_FRACTION_RANGE

_CONFIG = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)
#: No GPU has more SMs than this (an H100 die has 144; a bound, so a typo is refused).
MAX_SM_COUNT = 100_000
#: One SM keeps far less than this flowing (an SM's whole shared memory over a nanosecond).
MAX_SM_OFFCHIP_BYTES_PER_S = 1e15
#: No scan step takes an SM this many cycles (a million: a step per millisecond).
MAX_SCAN_SM_CYCLES_PER_STEP = 1e6


class KernelSpec(BaseModel):
    """Floors and achievable fractions of peak for kernels on a GPU."""

    model_config = _CONFIG

    min_kernel_s: Annotated[float, KERNEL_FLOOR_RANGE.validator()] = Field(
        ge=0,
        description="Seconds no kernel (one fused group) finishes below: the launch and dispatch floor. "
                    + KERNEL_FLOOR_RANGE.note,
    )
    compute_fraction: Annotated[float, KERNEL_FRACTION_RANGE.validator()] = Field(
        gt=0, le=1, description="Fraction of the compute units' peak rates a kernel reaches (all units alike). "
                                + KERNEL_FRACTION_RANGE.note
    )
    offchip_fraction: Annotated[float, KERNEL_FRACTION_RANGE.validator()] = Field(
        gt=0, le=1, description="Fraction of the datasheet off-chip (HBM) bandwidth a kernel reaches. "
                                + KERNEL_FRACTION_RANGE.note
    )
    sm_count: int | None = Field(
        None, gt=0, le=MAX_SM_COUNT,
        description="Streaming multiprocessors a kernel's thread blocks spread over: a grid of fewer blocks runs "
                    "its compute and on-chip work on that many only (None: every grid fills the GPU).")
    sm_offchip_bytes_per_s: float | None = Field(
        None, gt=0, le=MAX_SM_OFFCHIP_BYTES_PER_S,
        description="Off-chip bytes per second one SM can keep flowing (in-flight bytes over the memory latency): "
                    "a grid of few blocks reaches at most its SMs' sum of it. Needs sm_count.")
    scan_sm_cycles_per_step: float | None = Field(
        None, gt=0, le=MAX_SCAN_SM_CYCLES_PER_STEP,
        description="SM-cycles a block-parallel scan kernel spends per element-step of an elementwise recurrence "
                    "on the lanes (with the work fused around it): such a group's compute takes at least its "
                    "recurrences' element-steps times this over the SMs (None: no scan floor). Needs sm_count.")

    sync_mma_fraction: Annotated[float, KERNEL_FRACTION_RANGE.validator()] | None = Field(
        None, gt=0, le=1,
        description="Fraction of the tensor cores' (the 2D array's) peak that the synchronous warp-level MMA "
                    "instruction of an earlier generation (mma.sync) reaches: a kernel issuing it runs its array "
                    "contractions at this fraction (None: that instruction reaches the peak, as on Ampere). "
                    + KERNEL_FRACTION_RANGE.note)

    @model_validator(mode="after")
    def _sm_fields_together(self) -> "KernelSpec":
        for name in ("sm_offchip_bytes_per_s", "scan_sm_cycles_per_step"):
            if getattr(self, name) is not None and self.sm_count is None:
                raise ValueError(f"{name} needs sm_count (the SMs a kernel's thread blocks spread over)")
        return self


def compute_hz(arch: Any) -> float:
    """The clock at which the compute units' cycles turn into seconds: the spec's clock, times
    the kernels' compute fraction where the spec has one."""
    k = getattr(arch, "kernels", None)
    return arch.clock_hz * (k.compute_fraction if k is not None else 1.0)


def offchip_bytes_per_s(arch: Any) -> float:
    """The off-chip bandwidth a group reaches: the spec's, times the kernels' fraction."""
    k = getattr(arch, "kernels", None)
    return arch.memory.offchip_bandwidth_bytes_per_s * (k.offchip_fraction if k is not None else 1.0)


def min_group_s(arch: Any) -> float:
    """Seconds no group finishes below (0 without a kernels section)."""
    k = getattr(arch, "kernels", None)
    return k.min_kernel_s if k is not None else 0.0


def grid_shares(arch: Any, thread_blocks: int) -> tuple[float, float]:
    """(compute share, off-chip share) of a kernel of ``thread_blocks`` blocks: the share of the
    SMs it occupies (at most 1), and the share of the reachable off-chip bandwidth its SMs can
    draw (at most 1). Both 1 on a spec without ``sm_count``."""
    k = getattr(arch, "kernels", None)
    if k is None or k.sm_count is None:
        return 1.0, 1.0
    busy = min(thread_blocks, k.sm_count)
    compute = busy / k.sm_count
    if k.sm_offchip_bytes_per_s is None:
        return compute, 1.0
    return compute, min(1.0, busy * k.sm_offchip_bytes_per_s / offchip_bytes_per_s(arch))


def array_share(arch: Any, sync_mma: bool) -> float:
    """The share of the array's peak a kernel's contractions run at: ``sync_mma_fraction`` for a
    kernel issuing the synchronous MMA instruction (``sync_mma``) on a spec that has one, else 1."""
    k = getattr(arch, "kernels", None)
    if not sync_mma or k is None or k.sync_mma_fraction is None:
        return 1.0
    return k.sync_mma_fraction


def scan_seconds_per_step(arch: Any) -> float:
    """Seconds a block-parallel scan kernel takes per element-step of an elementwise recurrence,
    the whole GPU working on it: ``scan_sm_cycles_per_step`` over the SMs at the clock (0 where
    the spec has none). The fitted cycles are measured ones, so the clock is not derated."""
    k = getattr(arch, "kernels", None)
    if k is None or k.scan_sm_cycles_per_step is None:
        return 0.0
    return k.scan_sm_cycles_per_step / (k.sm_count * arch.clock_hz)


def speed_of_light(arch: Any) -> Any:
    """The spec at its peak rates alone: without its kernels section (no floors, no fractions of
    peak) and without a bound on its on-chip buffer's bandwidth. The model's on-chip traffic is an
    upper bound (it keeps in the buffer what a fused kernel keeps in registers: a FlashAttention
    kernel's score tile and running output, docs/architectures.md), so a time set by it is no
    bound; the compute peaks, the off-chip bandwidth and the staging levels' (which every off-chip
    byte passes) are."""
    memory = arch.memory.model_copy(update={"onchip_bandwidth_bytes_per_cycle": None, "onchip_banks": None,
                                            "onchip_bank_port_bytes": None})
    return arch.model_copy(update={"kernels": None, "memory": memory, "name": f"{arch.name} (speed of light)"})


__all__ = ["KernelSpec", "array_share", "compute_hz", "grid_shares", "min_group_s", "offchip_bytes_per_s", "scan_seconds_per_step",
           "speed_of_light"]
