"""Several devices joined by links: the ``system`` section of a design spec.

A design spec describes one device. Its optional ``system`` section says how several of them
are joined: the bandwidth each device sends at over its link (one direction), the latency of a
transfer, and, where a source gives it, the energy per bit moved. How many devices run a model
is the evaluation's choice (``evaluate --devices N``), not the design's: every other consumer of
a spec (compare, sweeps, the suites) runs one device, so no reader can take a device count from
a spec and report one device's numbers for it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from mambalaya.arch.quantities import BANDWIDTH_UNITS, OFFCHIP_BANDWIDTH_RANGE, PhysicalRange, parse_float_quantity

_CONFIG = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

#: The most devices a system may join (a bound, so a typo is refused; the largest NVLink domains
#: have 72 GPUs, clusters thousands).
MAX_DEVICES = 65_536
LINK_LATENCY_RANGE = PhysicalRange(
    0, 1e-2, "0 to 10 ms", "a link transfer's fixed cost is microseconds; 10 ms is far above any interconnect", "s")
LINK_ENERGY_RANGE = PhysicalRange(
    0, 1e3, "0 to 1000 pJ/bit", "an off-package link costs a few pJ per bit; 1000 is far above any", "pJ/bit")


class SystemSpec(BaseModel):
    """How several devices of this design are joined."""

    model_config = _CONFIG

    link_bandwidth_bytes_per_s: Annotated[float, OFFCHIP_BANDWIDTH_RANGE.validator()] = Field(
        gt=0, description="Bytes per second one device sends to another over its link, one direction. YAML may "
                          "say '450 GB/s'. " + OFFCHIP_BANDWIDTH_RANGE.note)
    link_latency_s: Annotated[float, LINK_LATENCY_RANGE.validator()] = Field(
        ge=0, description="Seconds a transfer takes before its first byte arrives. " + LINK_LATENCY_RANGE.note)
    collective_latency_s: Annotated[float, LINK_LATENCY_RANGE.validator()] = Field(
        0.0, ge=0, description="Seconds a collective (an all-reduce) costs before its steps: its launch and the devices' "
                               "synchronisation, paid once per call; 0 (the default): none beyond its steps. "
                               + LINK_LATENCY_RANGE.note)
    in_network_reduction: bool = Field(
        False, strict=True, description="Whether the switch joining the devices reduces data in flight (NVLink SHARP on "
                                        "the third-generation NVSwitch): an all-reduce then sends each device's bytes once "
                                        "and receives the sum once, in two steps.")
    link_energy_pj_per_bit: Annotated[float, LINK_ENERGY_RANGE.validator()] | None = Field(
        None, ge=0, description="Energy per bit a link moves; None: not modelled (no energy line for the links). "
                                + LINK_ENERGY_RANGE.note)
    max_devices: Annotated[int, Field(ge=2, le=MAX_DEVICES, strict=True)] | None = Field(
        None, description="The most devices these links join as described (one switch domain: an HGX H100 board's 8 "
                          "GPUs); beyond it another network joins them, which is not modelled, so more are refused. "
                          "None: no bound given.")
    unit: Literal["device", "core"] = Field(
        "device", description="What the links join: devices (chips), or the cores of one chip (a design's cores "
                              "section makes this system for its network on chip).")

    @field_validator("link_bandwidth_bytes_per_s", mode="before")
    @classmethod
    def _bandwidth(cls, value: Any) -> Any:
        return parse_float_quantity(value, BANDWIDTH_UNITS, "a bandwidth")

    def transfer_s(self, n_bytes: float) -> float:
        """Seconds to send ``n_bytes`` from one device to the next: the latency plus the bytes
        over the link's bandwidth."""
        return self.link_latency_s + n_bytes / self.link_bandwidth_bytes_per_s

    def transfer_j(self, n_bytes: float) -> float | None:
        """Joules to move ``n_bytes`` over a link (None where the spec gives no energy)."""
        if self.link_energy_pj_per_bit is None:
            return None
        return 8 * n_bytes * self.link_energy_pj_per_bit * 1e-12


#: The most cores a design may have (a bound, so a typo is refused).
MAX_CORES = 4096
class CoresSpec(BaseModel):
    """A multi-core design: ``count`` cores, each with the spec's compute section (its array and
    lanes) and on-chip memory (buffer, registers, staging levels), joined by a network on chip;
    the off-chip memory (its bandwidth and capacity) and the power budget are the chip's, shared
    by the cores."""

    model_config = _CONFIG

    count: int = Field(ge=2, le=MAX_CORES, description=f"Cores on the chip, 2 to {MAX_CORES:,}.")
    noc_bandwidth_bytes_per_s: Annotated[float, OFFCHIP_BANDWIDTH_RANGE.validator()] = Field(
        gt=0, description="Bytes per second one core sends to another over the network on chip, one direction. "
                          "YAML may say '64 GB/s'. " + OFFCHIP_BANDWIDTH_RANGE.note)
    noc_latency_s: Annotated[float, LINK_LATENCY_RANGE.validator()] = Field(
        0.0, ge=0, description="Seconds a transfer between cores takes before its first byte arrives. "
                               + LINK_LATENCY_RANGE.note)
    noc_energy_pj_per_bit: Annotated[float, LINK_ENERGY_RANGE.validator()] | None = Field(
        None, ge=0, description="Energy per bit the network on chip moves; None: not modelled. " + LINK_ENERGY_RANGE.note)
    placement: Literal["tensor", "sequence", "pipeline", "best"] = Field(
        "tensor", description="How a model's work is placed on the cores: tensor (each core a part of every layer's "
                              "heads and channels, Geens et al.'s inter-core split of the channels), sequence (a "
                              "prefill's positions), pipeline (the layers in order, Stream's layer pipelining), best "
                              "(the fastest).")

    @field_validator("noc_bandwidth_bytes_per_s", mode="before")
    @classmethod
    def _bandwidth(cls, value: Any) -> Any:
        return parse_float_quantity(value, BANDWIDTH_UNITS, "a bandwidth")

    def network(self) -> SystemSpec:
        """The network on chip as the system joining the cores (no collective cost beyond its
        steps, no in-network reduction)."""
        return SystemSpec(link_bandwidth_bytes_per_s=self.noc_bandwidth_bytes_per_s, link_latency_s=self.noc_latency_s,
                          link_energy_pj_per_bit=self.noc_energy_pj_per_bit, unit="core")


__all__ = ["CoresSpec", "MAX_CORES", "MAX_DEVICES", "SystemSpec"]
