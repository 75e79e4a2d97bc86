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

    @model_validator(mode="after")
    def _sm_fields_together(self) -> "KernelSpec":
        if self.sm_offchip_bytes_per_s is not None and self.sm_count is None:
            raise ValueError("sm_offchip_bytes_per_s needs sm_count (the SMs a grid's blocks spread over)")
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


def speed_of_light(arch: Any) -> Any:
    """The spec without its kernels section: peak rates, no floors."""
    if getattr(arch, "kernels", None) is None:
        return arch
    return arch.model_copy(update={"kernels": None, "name": f"{arch.name} (speed of light)"})


__all__ = ["KernelSpec", "compute_hz", "grid_shares", "min_group_s", "offchip_bytes_per_s", "speed_of_light"]
