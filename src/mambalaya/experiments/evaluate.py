"""Evaluate one model layer on one architecture, and compare designs across sequence lengths."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mambalaya.arch import ArchSpec, load_arch
from mambalaya.einsum.cascade import Cascade
from mambalaya.fusion.mapping import Mapping, check_mapping, load_mapping
from mambalaya.model.latency import LayerLatency, layer_latency
from mambalaya.model.search import NAMED_MAPPINGS, SearchStats, named_mapping
from mambalaya.workloads import ModelConfig, build_layer


@dataclass(frozen=True)
class Evaluation:
    arch: ArchSpec
    model: str
    config: ModelConfig
    phase: str
    seq_len: int
    batch: int
    cascade: Cascade
    mapping: Mapping
    result: LayerLatency
    search: SearchStats

    def totals(self) -> dict[str, Any]:
        r = self.result
        return {
            "latency_s": r.latency_s,
            "model_latency_s": r.model_latency_s,
            "offchip_bytes": r.offchip_bytes,
            "compute_util": r.compute_util,
            "mem_util": r.mem_util,
            "comp_s": r.comp_s,
            "groups": len(r.groups),
            "n_layers": r.n_layers,
            "tokens_per_s": r.tokens_per_s,
        }


def resolve_mapping(name: str | None, cascade: Cascade, arch: ArchSpec, stats: SearchStats | None = None) -> Mapping:
    """The design's own mapping (``None``), a named mapping built for ``arch``, or a mapping file."""
    name = name or arch.mappings.default
    buffer = arch.memory.onchip_buffer_bytes
    if name in NAMED_MAPPINGS:
        return named_mapping(name, cascade, None if name == "ideal" else buffer, stats, arch=arch)
    mapping = load_mapping(name)
    if mapping.buffer_bytes is None:
        from dataclasses import replace

        mapping = replace(mapping, buffer_bytes=buffer)
    return check_mapping(cascade, mapping)


def evaluate(
    arch: ArchSpec | str,
    model_name: str,
    config: ModelConfig,
    *,
    phase: str,
    seq_len: int,
    batch: int,
    mapping: str | None = None,
    scan: str | None = None,
) -> Evaluation:
    """One layer of ``config`` on ``arch`` under its mapping; element width from the arch.
    ``scan`` picks Mamba-2's scan form (default: chunked in prefill, recurrent in decode)."""
    spec = load_arch(arch) if isinstance(arch, str) else arch
    cascade = build_layer(config, phase=phase, seq_len=seq_len, batch=batch, bits=spec.bits_per_element,
                          name=f"{model_name}-{phase}", scan=scan)
    stats = SearchStats()
    m = resolve_mapping(mapping, cascade, spec, stats)
    result = layer_latency(spec, cascade, m, n_layers=config.n_layers)
    return Evaluation(spec, model_name, config, phase, cascade.size("I"), batch, cascade, m, result, stats)


def compare_rows(
    archs: list[str],
    model_name: str,
    config: ModelConfig,
    *,
    phase: str,
    seq_lens: list[int],
    batch: int,
    baseline: str,
    mapping_overrides: dict[str, str] | None = None,
    scan: str | None = None,
) -> list[dict[str, Any]]:
    """Latency of each design at each sequence length, with the speedup over ``baseline``."""
    if baseline not in archs:
        archs = [baseline] + archs
    rows = []
    for L in seq_lens:
        evals = {a: evaluate(a, model_name, config, phase=phase, seq_len=L, batch=batch,
                             mapping=(mapping_overrides or {}).get(a), scan=scan) for a in archs}
        base = evals[baseline].result.latency_s
        for a, ev in evals.items():
            r = ev.result
            rows.append(
                {
                    "seq_len": L if phase == "prefill" else 1,
                    "arch": a,
                    "mapping": ev.mapping.name,
                    "layer_latency_s": r.latency_s,
                    "model_latency_s": r.model_latency_s,
                    "offchip_bytes": r.offchip_bytes,
                    "compute_util": r.compute_util,
                    "mem_util": r.mem_util,
                    "speedup_vs_" + baseline: base / r.latency_s,
                }
            )
        if phase == "decode":
            break  # one generation step does not depend on L
    return rows
