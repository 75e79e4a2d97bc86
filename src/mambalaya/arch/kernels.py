"""What kernels on a GPU reach of its peak rates: the ``kernels`` section of an arch spec.

A GPU spec's rates are datasheet peaks; a measured kernel reaches a fraction of them and
never finishes faster than a launch allows. This section names those facts as assumptions,
each with its source and range in the spec's ``sources``. They are applied wherever the spec
is evaluated (every group is one kernel), and left out of a speed-of-light figure
(:func:`speed_of_light`), which is the peak rates alone.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from mambalaya.arch.quantities import KERNEL_FLOOR_RANGE, KERNEL_FRACTION_RANGE

_CONFIG = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)


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


def speed_of_light(arch: Any) -> Any:
    """The spec without its kernels section: peak rates, no floors."""
    if getattr(arch, "kernels", None) is None:
        return arch
    return arch.model_copy(update={"kernels": None, "name": f"{arch.name} (speed of light)"})


__all__ = ["KernelSpec", "compute_hz", "min_group_s", "offchip_bytes_per_s", "speed_of_light"]
