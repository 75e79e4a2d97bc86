"""Staging levels: on-chip memories between DRAM and the on-chip buffer (a GPU's L2 in front of
its shared memory, an accelerator's global buffer in front of per-core scratchpads).

The hierarchy of a design, outermost first::

    DRAM (memory.offchip_*) -> memory.levels[0] -> ... -> memory.levels[-1]
        -> the on-chip buffer (memory.onchip_*: where a fused group's tiles live)
        -> per-PE storage (memory.pe_local_*: where register-carried intermediates live)

A staging level holds no tile of its own: every byte a group reads from DRAM passes through it
inward (written into it, read out of it toward the next level), every byte it writes to DRAM
outward. So a staging level moves each off-chip byte once across its inner port, which is what
its bandwidth bounds (the figure datasheets and microbenchmarks give: an L2's read bandwidth
toward the SMs), and costs one write and one read of energy per byte at its capacity
(``energy.buffer_*_pj_per_bit`` scaled to its size, as the buffer's are). The model does not
let a staging level catch reuse between groups (a GPU's L2 hits): every group's off-chip bytes
are DRAM bytes, an upper bound on traffic for a design whose outer level could hold them.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mambalaya.arch.quantities import BYTES_PER_CYCLE_RANGE, MAX_INT, parse_byte_count
from mambalaya.specio import FieldProblem

_CONFIG = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)
PositiveInt = Annotated[int, Field(gt=0, le=MAX_INT)]
_NAME = re.compile(r"[a-z][a-z0-9_]*")
RESERVED_LEVEL_NAMES = frozenset({"dram", "offchip", "buffer", "onchip", "registers", "pe_local"})


class StagingLevel(BaseModel):
    """One on-chip level between DRAM and the on-chip buffer (see the module doc)."""

    model_config = _CONFIG

    capacity_bytes: PositiveInt = Field(
        description="Capacity of the level in bytes ('50MiB'); larger than the level inside it, smaller than the one outside."
    )
    banks: PositiveInt | None = Field(
        None, description="Banks (or slices) of the level; with bank_port_bytes it sets the bandwidth, banks x port bytes per cycle."
    )
    bank_port_bytes: PositiveInt | None = Field(None, description="Bytes one bank moves per cycle toward the inner level.")
    bandwidth_bytes_per_cycle: Annotated[float, Field(gt=0), BYTES_PER_CYCLE_RANGE.validator()] | None = Field(
        None, description="Bytes per cycle across the level's inner port; or banks and bank_port_bytes, never "
                          "both (one would be silently unread). " + BYTES_PER_CYCLE_RANGE.note
    )

    @field_validator("capacity_bytes", mode="before")
    @classmethod
    def _bytes(cls, value: Any) -> Any:
        return parse_byte_count(value)

    @model_validator(mode="after")
    def _bounded(self) -> "StagingLevel":
        if (self.banks is None) != (self.bank_port_bytes is None):
            missing = "bank_port_bytes" if self.bank_port_bytes is None else "banks"
            raise FieldProblem(missing, "is missing: a level's bandwidth is banks x port bytes per cycle, so give both "
                                        "(or bandwidth_bytes_per_cycle)")
        if self.bandwidth_bytes_per_cycle is not None and self.banks is not None:
            raise FieldProblem("bandwidth_bytes_per_cycle",
                               f"= {self.bandwidth_bytes_per_cycle:g} is given beside banks = {self.banks} and "
                               f"bank_port_bytes = {self.bank_port_bytes} ({self.banks * self.bank_port_bytes:,} B/cycle): "
                               "a level's bandwidth is one or the other, and the figure would leave the banks unread "
                               "(a --set or sweep of them would change nothing); give one (null the other)")
        if self.bandwidth_bytes_per_cycle is None and self.banks is None:
            raise FieldProblem("bandwidth_bytes_per_cycle",
                               "is missing, and so are banks and bank_port_bytes: no level is unbounded, give its "
                               "bandwidth or its organisation (with a source)")
        return self

    @property
    def bytes_per_cycle(self) -> float:
        """The level's bandwidth: the given figure, or banks x port bytes."""
        if self.bandwidth_bytes_per_cycle is not None:
            return self.bandwidth_bytes_per_cycle
        assert self.banks is not None and self.bank_port_bytes is not None
        return float(self.banks * self.bank_port_bytes)


def check_level_names(levels: dict[str, StagingLevel]) -> None:
    """Each level's name is a lower-case identifier that names no other level of the hierarchy."""
    for name in levels:
        if not _NAME.fullmatch(name) or name in RESERVED_LEVEL_NAMES:
            raise FieldProblem(f"levels.{name}", "is not a level name: use a lower-case identifier (l2, smem, ...) other than "
                                                 + ", ".join(sorted(RESERVED_LEVEL_NAMES)))


def check_capacities(levels: dict[str, StagingLevel], buffer_bytes: int, offchip_bytes: int | None) -> None:
    """Every level is larger than the one inside it: DRAM > levels (outermost first) > the buffer."""
    inner_name, inner = "onchip_buffer_bytes", buffer_bytes
    for name, level in reversed(list(levels.items())):
        if level.capacity_bytes <= inner:
            raise FieldProblem(f"levels.{name}.capacity_bytes",
                               f"({level.capacity_bytes} bytes) is not larger than the level inside it ({inner_name}, "
                               f"{inner} bytes): a level must be larger than the one inside it")
        inner_name, inner = f"levels.{name}.capacity_bytes", level.capacity_bytes
    if offchip_bytes is not None and offchip_bytes <= inner:
        raise FieldProblem("offchip_capacity_bytes",
                           f"({offchip_bytes} bytes) is not larger than the level it feeds ({inner_name}, {inner} bytes): "
                           "a level must be larger than the one inside it")
