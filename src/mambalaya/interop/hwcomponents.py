"""A cross-check of the specs' technology and area values against HWComponents (the Accelergy
plug-ins that AccelForge installs, in the Python >= 3.12 environment ``.venv-af``).

:func:`hwcomponents_figures` runs one short script there and returns what HWComponents says of
the components a spec prices: the Stillmaker-Baas factors from the reference node to 7 nm
(``hwcomponents.scaling``), and the area, energy and leakage of a 16-bit MAC in the Aladdin
tables (``hwcomponents_library``). :func:`cross_check_rows` sets them beside a spec's values.
CACTI (``hwcomponents_cacti``) is not run here: its shipped binary needs a newer C library than
many machines have; the specs' SRAM values were taken from it rebuilt from its source, each
figure in the spec's ``sources``.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

_SCRIPT = r"""
import json
from hwcomponents.scaling import tech_node_area, tech_node_energy
from hwcomponents_library import AladdinIntMAC
out = {"area_scale_45_7": tech_node_area(7e-9, 45e-9), "energy_scale_45_7": tech_node_energy(7e-9, 45e-9)}
for nm in (45, 7):
    mac = AladdinIntMAC(tech_node=nm * 1e-9, adder_width=32, multiplier_width=16)
    out[f"mac16_{nm}"] = {"area_um2": mac.area * 1e12, "energy_pj": mac.mac().energy * 1e12,
                          "leak_w_per_mm2": mac.leak_power / (mac.area * 1e6)}
print(json.dumps(out))
"""


def hwcomponents_figures(python: str, timeout_s: float = 300) -> dict[str, Any]:
    """HWComponents' figures (see the module doc), computed by ``python`` (which must import
    hwcomponents and hwcomponents_library)."""
    done = subprocess.run([python, "-c", _SCRIPT], capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"hwcomponents failed in {python}: {done.stderr.strip()[-400:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def cross_check_rows(spec: Any, figures: dict[str, Any]) -> list[dict[str, Any]]:
    """Each spec value beside HWComponents' figure for the same thing, with the difference."""
    tech, area = spec.technology, spec.area
    width = spec.bits_per_element
    pairs = [
        ("technology.area_scale (45 -> 7 nm)", tech.area_scale, figures["area_scale_45_7"]),
        ("technology.energy_scale (45 -> 7 nm, 0.8 V)", tech.energy_scale, figures["energy_scale_45_7"]),
        (f"area.mac_um2.{width} at 45 nm (Aladdin: a 16-bit integer MAC)", area.mac_um2[width], figures["mac16_45"]["area_um2"]),
        ("technology.logic_leakage_w_per_mm2 (Aladdin MAC at 7 nm)", tech.logic_leakage_w_per_mm2,
         figures["mac16_7"]["leak_w_per_mm2"]),
        (f"energy.mac_pj.{width} at 45 nm (Aladdin: a 16-bit integer MAC)", spec.energy.mac_pj[width],
         figures["mac16_45"]["energy_pj"]),
    ]
    return [{"value": name, "spec": ours, "hwcomponents": theirs, "difference": (ours - theirs) / theirs}
            for name, ours, theirs in pairs]


__all__ = ["cross_check_rows", "hwcomponents_figures"]
