"""Value keys of spec sections, for memos shared by equal specs: two designs, or two sweep
points, with equal sections share every result that depends on those sections alone."""

from __future__ import annotations

from pydantic import BaseModel


_SPEC_KEYS: dict[int, tuple[BaseModel, str]] = {}
_SPEC_KEYS_KEPT = 4096


def spec_key(spec: BaseModel) -> str:
    """A value key of a (frozen) spec section, for memos shared by equal specs: two designs, or
    two sweep points, with equal ``compute`` sections share every compute-only result. Computed
    once per object (held, so its ``id`` is not reused while it is kept; at most 4096 kept)."""
    hit = _SPEC_KEYS.get(id(spec))
    if hit is None or hit[0] is not spec:
        if len(_SPEC_KEYS) >= _SPEC_KEYS_KEPT:
            _SPEC_KEYS.clear()
        hit = (spec, f"{type(spec).__name__}:{spec.model_dump_json()}")
        _SPEC_KEYS[id(spec)] = hit
    return hit[1]


#: Arch fields the latency model never reads: two specs that differ only in these share every
#: latency-only result (a sensitivity setting or a sweep point that moves the node, an energy or
#: an area costs no new search).
NOT_LATENCY_FIELDS = frozenset({"name", "description", "energy", "technology", "area", "power_budget_w", "sources"})
_LATENCY_KEYS: dict[int, tuple[BaseModel, str]] = {}


def latency_key(spec: BaseModel) -> str:
    """A value key of the fields of an arch spec the latency model reads (see :data:`NOT_LATENCY_FIELDS`)."""
    hit = _LATENCY_KEYS.get(id(spec))
    if hit is None or hit[0] is not spec:
        if len(_LATENCY_KEYS) >= _SPEC_KEYS_KEPT:
            _LATENCY_KEYS.clear()
        hit = (spec, "latency:" + spec.model_dump_json(exclude=set(NOT_LATENCY_FIELDS)))
        _LATENCY_KEYS[id(spec)] = hit
    return hit[1]
