"""A declared mask (a band of the indices: the causal masks ``LM``, ``CM``, ``KM``, ``AMK``, the
delta rule's ``SL`` and ``EYE``) is made by every kernel where it is used, so it moves and holds
no byte: off chip, in the buffer, against the device's capacity, in a launched kernel's re-reads
and in the tiled executor's count. Checked on every form of every shipped layer, where doubling
a mask's declared width must change no byte anywhere (it once counted, 70% of an attention
prefill's off-chip bytes at 64K and a 137 GB "activation peak" at 256K)."""

from __future__ import annotations

import dataclasses

import pytest

from mambalaya.arch import load_arch
from mambalaya.cost.capacity import activation_peak
from mambalaya.cost.energy import layer_energy
from mambalaya.cost.latency import layer_latency
from mambalaya.cost.launch import Launch, block_rereads
from mambalaya.cost.traffic import mapping_traffic
from mambalaya.search.mappings import ideal, named_mapping
from mambalaya.workloads.shipped import shipped_layers


def _masks(c) -> list[str]:
    return [t for t, spec in c.tensors.items() if spec.mask is not None]


def _wider_masks(c):
    tensors = {t: dataclasses.replace(spec, bits=2 * spec.bits) if spec.mask is not None else spec
               for t, spec in c.tensors.items()}
    return dataclasses.replace(c, tensors=tensors)


ARCH = load_arch("mambalaya")


def _bytes(c, mapping) -> tuple[float, float, float, float, float]:
    """Off-chip, buffer, activation-peak bytes, latency and energy of ``mapping`` on the mambalaya
    design (a mask's width once set the width its Einsum's arithmetic and registers were charged at)."""
    result = layer_latency(ARCH, c, mapping)
    buffer = sum(g.buffer.read_bytes + g.buffer.write_bytes for g in result.groups if g.buffer is not None)
    energy = layer_energy(ARCH, c, result).total_pj
    return result.offchip_bytes, buffer, activation_peak(c, result.groups).bytes, result.latency_s, energy


@pytest.mark.slow
def test_no_mask_of_any_shipped_layer_moves_or_holds_a_byte() -> None:
    checked = 0
    for layer in shipped_layers(seq_len=64, batch=2):
        c = layer.cascade
        masks = _masks(c)
        if not masks:
            continue
        wide = _wider_masks(c)
        for t in masks:
            assert c.nbytes(t) == 0 and c.tensors[t].bits in (16, 32, 64), (c.name, t)
        for make in (lambda x: named_mapping("unfused", x, None), ideal):
            mapping = make(c)
            traffic = mapping_traffic(c, mapping)
            assert all(traffic.by_tensor.get(t, (0.0, 0.0)) == (0.0, 0.0) for t in masks), c.name
            peak = activation_peak(c, layer_latency(ARCH, c, mapping).groups)
            assert not any(t in masks and b for t, b in peak.tensors), (c.name, peak.tensors)
            assert _bytes(c, mapping) == _bytes(wide, make(wide)), c.name
        checked += 1
    assert checked >= 20  # the chunked scans and the attention forms of every family


def test_a_launched_kernel_re_reads_no_mask() -> None:
    """The SSD chunk scan's blocks (one per head and query tile) re-read the chunk's scores from
    the L2 or DRAM, but not its causal mask ``LM``, which each block makes from its positions."""
    from mambalaya.experiments.validate import case_cascade, case_kernels, load_cases
    from mambalaya.fusion.mapping import FusionGroup

    cases, name = load_cases()
    case = next(c for c in cases.cases if c.id == "chunk-scan-triton-L4k")
    part = case_cascade(case, name)
    (kernel,) = case_kernels(case, part, name)
    group = FusionGroup("K", kernel.einsums)
    arch = load_arch(case.arch)
    assert "LM" in _masks(part)
    for launch in kernel.launches():
        assert isinstance(launch, Launch)
        assert block_rereads(arch, part, group, launch) == block_rereads(arch, _wider_masks(part), group, launch)
