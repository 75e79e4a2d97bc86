"""Whether a model fits in a design's off-chip memory (DRAM/HBM): ``memory.offchip_capacity_bytes``
against what one device must hold while the model runs.

What must be held (:class:`MemoryNeed`):

* the **weights**: every parameter of the model (:meth:`model_parameters` of its config; a
  mixture of experts holds every expert, not only the routed ones) at the width the precision
  policy gives weights (the design's ``bits_per_element`` under both shipped policies);
* the **states** carried from one position to the next, at ``batch``: each recurrent layer's
  SSM (or delta-rule) state and conv window;
* the **KV cache** of every attention layer, at ``batch`` and ``seq_len`` cached positions.

States and KV cache are counted from a decode step's cascade of each layer type
(:func:`state_bytes`): its incoming state tensors are exactly what a model at that context
carries, at their own widths (a float32 SSM state under ``reference-kernels``). Activations
are not counted: they are a layer's at a time, small beside these at any batch the designs run.

:func:`check_fits` refuses a model that needs more than the capacity (a :class:`CapacityError`
naming the need, the capacity and the devices whose joined capacity would hold it), and
otherwise says how much is used and left (:class:`DramUse`). A model over one device's capacity
runs pipeline parallel over several (:mod:`mambalaya.experiments.devices`, each device checked
against its stage's need). This module computes only; the evaluation
(:mod:`mambalaya.experiments.evaluate`) gathers the inputs and calls it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.ir import Role
from mambalaya.errors import MambalayaError

#: The rank every attention layer's KV cache holds its cached positions in
#: (:func:`mambalaya.workloads.blocks.attention.kv_cache_tensors`).
CACHED_POSITIONS_RANK = "M"


class CapacityError(MambalayaError):
    """A model does not fit in a design's off-chip memory."""


@dataclass(frozen=True)
class MemoryNeed:
    """The bytes one device holds to run a model at a batch and a context length."""

    parameters: int
    weight_bits: int
    state_bytes: float  # recurrent and conv states of every layer, at the batch
    kv_cache_bytes: float  # every attention layer's cache, at the batch and the context
    batch: int
    seq_len: int

    @property
    def weight_bytes(self) -> float:
        return self.parameters * self.weight_bits / 8

    @property
    def total_bytes(self) -> float:
        return self.weight_bytes + self.state_bytes + self.kv_cache_bytes

    def parts_text(self) -> str:
        """``weights 2.744 GB = 1,372,178,432 parameters x 16 bits; recurrent and conv states ...;
        KV cache ...; at batch 64 and 2,048 positions``."""
        return (f"weights {byte_size(self.weight_bytes)} = {self.parameters:,} parameters x {self.weight_bits} bits; "
                f"recurrent and conv states {byte_size(self.state_bytes)}; KV cache {byte_size(self.kv_cache_bytes)}; "
                f"at batch {self.batch:,} and {self.seq_len:,} positions")


@dataclass(frozen=True)
class DramUse:
    """How much of a design's off-chip memory a model uses (``capacity_bytes`` None: the spec
    gives no capacity, so nothing was checked)."""

    need: MemoryNeed
    capacity_bytes: int | None

    @property
    def used_bytes(self) -> float:
        return self.need.total_bytes

    @property
    def left_bytes(self) -> float | None:
        return None if self.capacity_bytes is None else self.capacity_bytes - self.used_bytes

    @property
    def devices_needed(self) -> int | None:
        """The fewest such devices whose joined capacity holds the model (None: not checked)."""
        return None if self.capacity_bytes is None else devices_to_hold(self.used_bytes, self.capacity_bytes)

    def text(self) -> str:
        """One line for a report: used and left, or why nothing was checked."""
        if self.capacity_bytes is None:
            return (f"DRAM: the model needs {byte_size(self.used_bytes)} ({self.need.parts_text()}); the spec gives no "
                    "memory.offchip_capacity_bytes, so whether it fits is not checked")
        share = self.used_bytes / self.capacity_bytes
        return (f"DRAM: {byte_size(self.used_bytes)} of {byte_size(self.capacity_bytes)} used ({share:.1%}: "
                f"{self.need.parts_text()}); {byte_size(self.left_bytes or 0.0)} left")


def byte_size(n: float) -> str:
    """Bytes in decimal units, as memory datasheets give them (``80 GB``, ``258.3 MB``)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n:.4g} B"


def is_kv_cache(cascade: Cascade, tensor: str) -> bool:
    """Whether a state tensor of a decode step is an attention layer's KV cache: it holds cached
    positions (:data:`CACHED_POSITIONS_RANK`) where the tensor it initialises has the step's own
    positions ``I`` (the form :func:`~mambalaya.workloads.blocks.attention.kv_cache_tensors` declares)."""
    spec = cascade.tensors[tensor]
    if CACHED_POSITIONS_RANK not in spec.ranks:
        return False
    return any(t.initial == tensor and tuple(CACHED_POSITIONS_RANK if r == "I" else r for r in t.ranks) == spec.ranks
               for t in cascade.tensors.values())


def state_bytes(decode_step: Cascade) -> tuple[float, float]:
    """(recurrent and conv state bytes, KV cache bytes) of one layer: the incoming state tensors
    of its decode step, each its elements times its width."""
    recurrent = kv = 0.0
    for name in decode_step.external_tensors():
        spec = decode_step.tensors[name]
        if spec.role != Role.STATE:
            continue
        size = math.prod(decode_step.shape(name)) * spec.bits / 8
        if is_kv_cache(decode_step, name):
            kv += size
        else:
            recurrent += size
    return recurrent, kv


def memory_need(parameters: int, weight_bits: int, layer_states: Iterable[tuple[int, tuple[float, float]]], *,
                batch: int, seq_len: int) -> MemoryNeed:
    """A model's :class:`MemoryNeed` from its parameter count, the width of its weights and, per
    layer type, (layers of that type, :func:`state_bytes` of one)."""
    recurrent = kv = 0.0
    for count, (layer_recurrent, layer_kv) in layer_states:
        recurrent += count * layer_recurrent
        kv += count * layer_kv
    return MemoryNeed(parameters, weight_bits, recurrent, kv, batch, seq_len)


def devices_to_hold(need_bytes: float, capacity_bytes: int) -> int:
    """The fewest devices of ``capacity_bytes`` each whose joined capacity holds ``need_bytes``."""
    return max(1, math.ceil(need_bytes / capacity_bytes))


def check_fits(need: MemoryNeed, capacity_bytes: int | None, *, model: str, arch: str,
               across: str | None = None) -> DramUse:
    """``need`` against a design's off-chip capacity: the use, or a :class:`CapacityError`
    naming the need, the capacity, the devices whose joined capacity would hold it and
    ``across``, the caller's word on running it over several (None: not checked)."""
    if capacity_bytes is not None and need.total_bytes > capacity_bytes:
        devices = devices_to_hold(need.total_bytes, capacity_bytes)
        remedy = ("The weights alone are over the capacity, so no batch or length on one device fits: use a "
                  "smaller model" if need.weight_bytes > capacity_bytes else "Use a smaller batch or sequence length")
        raise CapacityError(
            f"{model} does not fit in the off-chip memory of {arch}: it needs {byte_size(need.total_bytes)} "
            f"({need.parts_text()}), over memory.offchip_capacity_bytes = {byte_size(capacity_bytes)} "
            f"({capacity_bytes:,} bytes); the joined capacity of {devices:,} such devices would hold it "
            f"(ceil({need.total_bytes:,.0f} / {capacity_bytes:,}))" + (f"; {across}" if across else "")
            + f". {remedy}, several devices, or a design with more memory (--set memory.offchip_capacity_bytes=...)")
    return DramUse(need, capacity_bytes)


__all__ = ["CACHED_POSITIONS_RANK", "CapacityError", "DramUse", "MemoryNeed", "byte_size", "check_fits",
           "devices_to_hold", "is_kv_cache", "memory_need", "state_bytes"]
