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
carries, at their own widths (a float32 SSM state under ``reference-kernels``).

A layer's **activations** (its inputs, outputs and the intermediates its mapping writes off
chip) are one layer's at a time, but far from small: at batch 64 and L = 2048 an unfused
Mamba-1.4B layer holds its float32 ``H``, ``AD`` and ``BX`` at 34 GB each.
:func:`activation_peak` finds the most of them live at once under a mapping, and
:meth:`DramUse.with_activations` reports them beside the model's need. They are reported, not
refused: the evaluation takes a layer's off-chip tensors to stream through DRAM whole, as a
design running the batch or the sequence in pieces would (its weights re-read per piece, which
is not modelled), and says so where they exceed what the capacity leaves.

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
from typing import Any

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
    #: the bits the layers' weights hold beyond ``parameters x weight_bits``: the weights the
    #: precision policy holds at another width (:func:`other_width_weight_bits`), named in
    #: ``other_width_weights``
    other_width_bits: float = 0.0
    other_width_weights: tuple[str, ...] = ()

    @property
    def weight_bytes(self) -> float:
        return (self.parameters * self.weight_bits + self.other_width_bits) / 8

    @property
    def total_bytes(self) -> float:
        return self.weight_bytes + self.state_bytes + self.kv_cache_bytes

    def parts_text(self) -> str:
        """``weights 2.744 GB = 1,372,178,432 parameters x 16 bits; recurrent and conv states ...;
        KV cache ...; at batch 64 and 2,048 positions``."""
        other = (f" ({', '.join(self.other_width_weights)} at the width the precision policy gives them: "
                 f"{'+' if self.other_width_bits >= 0 else '-'}{byte_size(abs(self.other_width_bits) / 8)})"
                 if self.other_width_weights else "")
        return (f"weights {byte_size(self.weight_bytes)} = {self.parameters:,} parameters x {self.weight_bits} bits"
                f"{other}; "
                f"recurrent and conv states {byte_size(self.state_bytes)}; KV cache {byte_size(self.kv_cache_bytes)}; "
                f"at batch {self.batch:,} and {self.seq_len:,} positions")


@dataclass(frozen=True)
class ActivationPeak:
    """The most bytes of a layer's activations off chip at once under its mapping: during group
    ``group``, the tensors then live (written by an earlier or this group and read by this or a
    later one; the layer's inputs from the start, its outputs to the end), largest first."""

    bytes: float
    group: str
    tensors: tuple[tuple[str, float], ...]

    def text(self) -> str:
        top = ", ".join(f"{t} {byte_size(b)}" for t, b in self.tensors[:3])
        more = f" and {len(self.tensors) - 3} more" if len(self.tensors) > 3 else ""
        return f"{byte_size(self.bytes)} during {self.group} ({top}{more})"


def activation_peak(cascade: Cascade, groups: Iterable[Any]) -> ActivationPeak:
    """The peak of a layer's off-chip activations under its mapping: ``groups`` in the order they
    run, each with ``group`` (its name) and ``traffic`` (its off-chip ``read_bytes`` and
    ``write_bytes`` per tensor, :class:`~mambalaya.cost.traffic.GroupTraffic`). Weights and
    states are left out (the model's need counts them). A tensor holds its whole size, or what
    its writer writes of it where that is less (a final state's one position of ``H``)."""
    groups = list(groups)
    held: dict[str, float] = {}
    span: dict[str, list[int]] = {}
    for k, g in enumerate(groups):
        for table, writes in ((g.traffic.write_bytes, True), (g.traffic.read_bytes, False)):
            for t, b in table.items():
                if cascade.tensors[t].role in (Role.WEIGHT, Role.STATE):
                    continue
                whole = cascade.elements(t) * cascade.tensors[t].stored_bytes_per_element
                if t not in held:
                    held[t], span[t] = (min(whole, b) if writes else whole), [k if writes else 0, k]
                elif writes:
                    held[t] = max(held[t], min(whole, b))
                span[t][1] = max(span[t][1], k)
    for t in held:
        if cascade.tensors[t].role == Role.OUTPUT:
            span[t][1] = len(groups) - 1
    if not groups:
        return ActivationPeak(0.0, "", ())
    live = [sorted(((held[t], t) for t in held if span[t][0] <= k <= span[t][1]), reverse=True)
            for k in range(len(groups))]
    k = max(range(len(groups)), key=lambda j: sum(b for b, _ in live[j]))
    return ActivationPeak(sum(b for b, _ in live[k]), groups[k].group, tuple((t, b) for b, t in live[k]))


@dataclass(frozen=True)
class DramUse:
    """How much of a design's off-chip memory a model uses (``capacity_bytes`` None: the spec
    gives no capacity, so nothing was checked), and, once a layer is mapped, the peak of its
    activations (``activations``, reported beside the need: see the module doc)."""

    need: MemoryNeed
    capacity_bytes: int | None
    activations: ActivationPeak | None = None

    def with_activations(self, peak: ActivationPeak) -> "DramUse":
        """This use with a mapped layer's activation peak (the larger, if one is already held)."""
        if self.activations is not None and self.activations.bytes >= peak.bytes:
            return self
        return DramUse(self.need, self.capacity_bytes, peak)

    @property
    def activations_fit(self) -> bool | None:
        """Whether the model's need and its layer's activation peak fit together (None: not known)."""
        if self.capacity_bytes is None or self.activations is None:
            return None
        return self.used_bytes + self.activations.bytes <= self.capacity_bytes

    def activations_text(self) -> str:
        """The activation clause of :meth:`text` (empty before a layer is mapped)."""
        a = self.activations
        if a is None:
            return ""
        text = f"; the layer's activations as mapped peak at {a.text()}"
        if self.activations_fit is False:
            room = (self.capacity_bytes or 0) - self.used_bytes
            pieces = f" (about {math.ceil(a.bytes / room):,} pieces)" if room > 0 else ""
            text += (f", over what the capacity leaves: the numbers take them to stream through DRAM whole, as a "
                     f"design running the batch or the sequence in pieces{pieces} would, re-reading its weights per "
                     "piece (not modelled)")
        return text

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
                    "memory.offchip_capacity_bytes, so whether it fits is not checked" + self.activations_text())
        share = self.used_bytes / self.capacity_bytes
        beside = "" if self.activations_fit is not True else \
            f", {byte_size(self.left_after_activations_bytes or 0.0)} beside the layer's activations"
        return (f"DRAM: {byte_size(self.used_bytes)} of {byte_size(self.capacity_bytes)} used ({share:.1%}: "
                f"{self.need.parts_text()}); {byte_size(self.left_bytes or 0.0)} left{beside}{self.activations_text()}")

    @property
    def left_after_activations_bytes(self) -> float | None:
        """What the capacity leaves once the model's need and the layer's activation peak are in
        (negative when they do not fit; None: not known)."""
        if self.capacity_bytes is None or self.activations is None:
            return None
        return self.capacity_bytes - self.used_bytes - self.activations.bytes


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
        size = math.prod(decode_step.shape(name)) * spec.stored_bytes_per_element
        if is_kv_cache(decode_step, name):
            kv += size
        else:
            recurrent += size
    return recurrent, kv


def other_width_weight_bits(cascade: Cascade, weight_bits: int,
                            among: Iterable[str] | None = None) -> tuple[float, tuple[str, ...]]:
    """(the bits ``cascade``'s weights (those ``among``, when given) hold beyond their elements
    at ``weight_bits``, the weights held at another width): a precision policy may hold some
    weights wider or narrower than the rest (``reference-kernels``: Mamba's ``A`` and ``D`` at
    32 bits, as the traffic reads them; the memory check once counted them at 16)."""
    chosen = None if among is None else set(among)
    extra, names = 0.0, []
    for name, spec in cascade.tensors.items():
        if spec.role == Role.WEIGHT and spec.bits != weight_bits and (chosen is None or name in chosen):
            extra += math.prod(cascade.shape(name)) * (spec.bits - weight_bits)
            names.append(name)
    return extra, tuple(names)


def memory_need(parameters: int, weight_bits: int, layer_states: Iterable[tuple[int, tuple[float, float]]], *,
                batch: int, seq_len: int, other_width: Iterable[tuple[int, tuple[float, tuple[str, ...]]]] = ()
                ) -> MemoryNeed:
    """A model's :class:`MemoryNeed` from its parameter count, the width of its weights and, per
    layer type, (layers of that type, :func:`state_bytes` of one) and (layers of that type,
    :func:`other_width_weight_bits` of one)."""
    recurrent = kv = 0.0
    for count, (layer_recurrent, layer_kv) in layer_states:
        recurrent += count * layer_recurrent
        kv += count * layer_kv
    extra, names = 0.0, []
    for count, (layer_extra, layer_names) in other_width:
        extra += count * layer_extra
        names += [n for n in layer_names if n not in names]
    return MemoryNeed(parameters, weight_bits, recurrent, kv, batch, seq_len, extra, tuple(names))


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


__all__ = ["ActivationPeak", "CACHED_POSITIONS_RANK", "CapacityError", "DramUse", "MemoryNeed", "activation_peak",
           "byte_size", "check_fits", "devices_to_hold", "is_kv_cache", "memory_need", "other_width_weight_bits", "state_bytes"]
