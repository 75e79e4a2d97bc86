"""Area per component and leakage power of a design, at its technology node.

From the spec's ``area`` section (logic at the reference node, SRAM per bit at the design node)
and ``technology`` section (the logic area factor and the leakage densities):

* **2D-array PEs**: ``array_rows x array_cols`` multiply-accumulate units at the design width
  (``bits_per_element``), ``area.mac_um2[width] x technology.area_scale`` each;
* **1D-mode lanes**: the PEs themselves (no area of their own) unless ``one_d_lanes`` asks for
  more lanes than PEs, the extra ones costing a PE each;
* **vector lanes**: ``area.elementwise_um2[width]`` each, scaled;
* **MFUs**: ``area.mfu_um2`` each, scaled;
* **PE registers**: ``memory.pe_local_bytes`` per PE and lane, ``area.register_um2_per_bit``, scaled;
* **on-chip buffer**: ``memory.onchip_buffer_bytes`` at ``area.sram_um2_per_bit`` (the design node's),
  and each staging level (``memory.levels``) at its capacity, the same way;
* **other**: ``area.overhead_fraction`` of the sum (control, interconnect).

Leakage: ``technology.logic_leakage_w_per_mm2`` over the logic (everything but the buffer) plus
``technology.sram_leakage_w_per_mib`` over the buffer and the staging levels, drawn for the whole latency
(:mod:`mambalaya.cost.energy` charges it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mambalaya.errors import SpecError

UM2_PER_MM2 = 1e6


@dataclass(frozen=True)
class ComponentArea:
    component: str
    count: float
    unit_um2: float  # at the design node
    area_mm2: float
    inputs: str  # the fields the figure comes from

    @property
    def is_sram(self) -> bool:
        return self.component == "on-chip buffer" or self.component.startswith("staging level ")


def component_areas(arch: Any) -> list[ComponentArea]:
    """Each component's area on ``arch`` (which needs an ``area`` section), then ``other``."""
    area = arch.area
    if area is None:
        raise SpecError(f"arch {arch.name!r} has no area section: area needs per-component areas (see the README's area model)")
    scale = arch.technology.area_scale if arch.technology is not None else 1.0
    c, m, width = arch.compute, arch.memory, arch.bits_per_element
    rows: list[ComponentArea] = []

    def add(name: str, count: float, unit_um2: float, inputs: str) -> None:
        rows.append(ComponentArea(name, count, unit_um2, count * unit_um2 / UM2_PER_MM2, inputs))

    mac = _per_width(area.mac_um2, width, "mac_um2", arch) * scale
    add("2D-array PEs", c.pe_count, mac, f"compute.array_rows x array_cols x area.mac_um2.{width} x technology.area_scale")
    extra_lanes = max(0, c.one_d_lanes_effective - c.pe_count) if c.one_d_mode else 0
    add("1D-mode lanes beyond the PEs", extra_lanes, mac, "compute.one_d_lanes - PEs (the PEs are lanes in 1D mode)")
    if c.vector_lanes:
        add("vector lanes", c.vector_lanes, _per_width(area.elementwise_um2, width, "elementwise_um2", arch) * scale,
            f"compute.vector_lanes x area.elementwise_um2.{width} x technology.area_scale")
    add("MFUs", c.mfu_units, area.mfu_um2 * scale, "compute.mfu_units x area.mfu_um2 x technology.area_scale")
    if m.pe_local_bytes is not None:
        holders = c.pe_count + extra_lanes + c.vector_lanes
        add("PE registers", holders, 8 * m.pe_local_bytes * area.register_um2_per_bit * scale,
            "(PEs + lanes) x memory.pe_local_bytes x 8 x area.register_um2_per_bit x technology.area_scale")
    for name, level in m.levels.items():
        add(f"staging level {name}", 1, 8 * level.capacity_bytes * area.sram_um2_per_bit,
            f"memory.levels.{name}.capacity_bytes x 8 x area.sram_um2_per_bit")
    add("on-chip buffer", 1, 8 * m.onchip_buffer_bytes * area.sram_um2_per_bit,
        "memory.onchip_buffer_bytes x 8 x area.sram_um2_per_bit")
    parts = sum(r.area_mm2 for r in rows)
    other = area.overhead_fraction * parts
    rows.append(ComponentArea("other", 1, other * UM2_PER_MM2, other, "area.overhead_fraction x the components' sum"))
    return rows


def total_area_mm2(arch: Any) -> float:
    return sum(r.area_mm2 for r in component_areas(arch))


def leakage_w(arch: Any) -> float:
    """Static power of ``arch`` (0 without a technology section, or without an area model)."""
    tech = arch.technology
    if tech is None or arch.area is None:
        return 0.0
    rows = component_areas(arch)
    logic = sum(r.area_mm2 for r in rows if not r.is_sram)
    return tech.logic_leakage_w_per_mm2 * logic + tech.sram_leakage_w_per_mib * sram_bytes(arch) / 2**20


def sram_bytes(arch: Any) -> int:
    """The design's SRAM: the on-chip buffer and every staging level."""
    return arch.memory.onchip_buffer_bytes + sum(level.capacity_bytes for level in arch.memory.levels.values())


def area_rows(arch: Any) -> list[dict[str, Any]]:
    """The per-component table (``component``, ``count``, ``unit_um2``, ``area_mm2``, ``share``,
    ``inputs``) with a total row."""
    rows = component_areas(arch)
    total = sum(r.area_mm2 for r in rows)
    out = [{"component": r.component, "count": r.count, "unit_um2": r.unit_um2, "area_mm2": r.area_mm2,
            "share": r.area_mm2 / total if total else 0.0, "inputs": r.inputs} for r in rows]
    out.append({"component": "total", "count": "", "unit_um2": "", "area_mm2": total, "share": 1.0 if total else 0.0,
                "inputs": f"at {arch.technology.node_nm:g} nm" if arch.technology is not None else "at the reference node"})
    return out


def _per_width(table: dict[int, float], width: int, field: str, arch: Any) -> float:
    if width not in table:
        raise SpecError(
            f"arch {arch.name!r}: area.{field} has no entry for {width}-bit units, the design width (bits_per_element) "
            f"(entries: {', '.join(str(w) for w in sorted(table)) or 'none'}); add area.{field}.{width} with its source"
        )
    return table[width]


__all__ = ["ComponentArea", "area_rows", "component_areas", "leakage_w", "sram_bytes", "total_area_mm2"]
