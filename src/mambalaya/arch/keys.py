"""Value keys of spec sections, for memos shared by equal specs: two designs, or two sweep
points, with equal sections share every result that depends on those sections alone."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


_SPEC_KEYS: dict[int, tuple[BaseModel, str]] = {}
_SPEC_KEYS_KEPT = 4096


def spec_key(spec: BaseModel) -> str:
    """A value key of a (frozen) spec section, for memos shared by equal specs: two designs, or
    two sweep points, with equal ``compute`` sections share every compute-only result. Computed
    once per object (held, so its ``id`` is not reused while it is kept; at most 4096 kept)."""
    return _kept_key(_SPEC_KEYS, spec, f"{type(spec).__name__}:", None)


#: Arch fields the latency model never reads: two specs that differ only in these share every
#: latency-only result (a sensitivity setting or a sweep point that moves the node, an energy or
#: an area costs no new search).
NOT_LATENCY_FIELDS = frozenset({"name", "description", "energy", "technology", "area", "power_budget_w", "sources"})
_LATENCY_KEYS: dict[int, tuple[BaseModel, str]] = {}


def latency_key(spec: BaseModel) -> str:
    """A value key of the fields of an arch spec the latency model reads (see :data:`NOT_LATENCY_FIELDS`)."""
    return _kept_key(_LATENCY_KEYS, spec, "latency:", set(NOT_LATENCY_FIELDS))


#: Arch fields a group's dynamic energy never reads (:func:`mambalaya.cost.energy.group_dynamic_pj`):
#: names, the power budget, and the off-chip bandwidth (energy counts bytes, not seconds). Two
#: sweep points that differ only in these share every group's dynamic energy.
NOT_DYNAMIC_ENERGY_FIELDS: dict[str, Any] = {"name": True, "description": True, "sources": True, "power_budget_w": True,
                                             "memory": {"offchip_bandwidth_bytes_per_s"}}
_DYNAMIC_ENERGY_KEYS: dict[int, tuple[BaseModel, str]] = {}


def dynamic_energy_key(spec: BaseModel) -> str:
    """A value key of the fields of an arch spec a group's dynamic energy may read (every field
    but :data:`NOT_DYNAMIC_ENERGY_FIELDS`)."""
    return _kept_key(_DYNAMIC_ENERGY_KEYS, spec, "dynamic-energy:", NOT_DYNAMIC_ENERGY_FIELDS)


def _kept_key(kept: dict[int, tuple[BaseModel, str]], spec: BaseModel, prefix: str, exclude: Any) -> str:
    """``prefix`` and the spec's fields but ``exclude`` as JSON, computed once per object (held,
    so its ``id`` is not reused while it is kept; at most 4096 kept)."""
    hit = kept.get(id(spec))
    if hit is None or hit[0] is not spec:
        if len(kept) >= _SPEC_KEYS_KEPT:
            kept.clear()
        hit = (spec, prefix + spec.model_dump_json(exclude=exclude))
        kept[id(spec)] = hit
    return hit[1]
