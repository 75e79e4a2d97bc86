"""The per-tile traffic sums count regular tiles once: equal to evaluating every tile."""

from __future__ import annotations

import pytest

from mambalaya.fusion.mapping import FusionGroup, Loop
from mambalaya.cost import traffic
from mambalaya.workloads import PRESETS, build_layer


def _groups(cascade):
    names = [e.name for e in cascade.einsums]
    # windows (the conv), shifted reads (the scan), reductions over other ranks, state in and out
    for lo, hi in ((4, 8), (3, 9), (12, 17), (0, len(names))):
        for tile in (1, 3, 7, 64, 100):
            for halo in ("retain", "recompute"):
                yield FusionGroup("g", tuple(names[lo:hi]), (Loop("B", 1), Loop("I", tile)), halo)


@pytest.mark.parametrize("state_io", [False, True])
@pytest.mark.parametrize("model", ["mamba-130m", "mamba2-130m"])
def test_compressed_tile_sums_equal_every_tile(model: str, state_io: bool, monkeypatch) -> None:
    scan = "recurrent" if model.startswith("mamba2") else None
    cascade = build_layer(PRESETS[model], phase="prefill", seq_len=1000, batch=2, state_io=state_io, scan=scan)
    for group in _groups(cascade):
        monkeypatch.setattr(traffic, "COMPRESS_REGULAR_TILES", True)
        fast = traffic._group_traffic(cascade, group)
        monkeypatch.setattr(traffic, "COMPRESS_REGULAR_TILES", False)
        slow = traffic._group_traffic(cascade, group)
        assert fast.read_bytes == slow.read_bytes, (group, fast.read_bytes, slow.read_bytes)
        assert fast.write_bytes == slow.write_bytes


def test_chunked_two_rank_sums_equal_every_tile(monkeypatch) -> None:
    """Mamba-2's chunked scan reads the I-indexed tensors at c*Q+q: dimensions that depend on
    two fused ranks (C and Q), whose regular tiles are counted once per rank. L is not a
    multiple of Q, so the last chunk's boxes are clipped."""
    from mambalaya.workloads.blocks.mamba2 import mamba2_layer

    # (the block: a model's layer refuses a length the chunk does not divide, its post-scan Einsums
    # counting the padded rows; the clipped boxes of the scan's reads are what is tested here)
    cascade = mamba2_layer(PRESETS["mamba2-130m"], phase="prefill", seq_len=9000, batch=1, scan="chunked")
    names = [e.name for e in cascade.einsums]
    for lo, hi in ((0, len(names)), (names.index("CB"), names.index("YD") + 1)):
        for c_tile, q_tile in ((1, 1), (3, 7), (8, 64), (1, 256)):
            group = FusionGroup("g", tuple(names[lo:hi]), (Loop("B", 1), Loop("C", c_tile), Loop("Q", q_tile)))
            monkeypatch.setattr(traffic, "COMPRESS_REGULAR_TILES", True)
            fast = traffic._group_traffic(cascade, group)
            monkeypatch.setattr(traffic, "COMPRESS_REGULAR_TILES", False)
            slow = traffic._group_traffic(cascade, group)
            assert fast.read_bytes == slow.read_bytes, (group, fast.read_bytes, slow.read_bytes)


def test_cascade_check_reads_what_the_traffic_model_reads() -> None:
    """One rule for a tensor's reads: ``cascade check``'s per-Einsum bytes (einsum.stats) and the
    cost model's untiled traffic take the bounding box of an Einsum's accesses to each tensor.
    They once differed on a cascade's own files: two reads of one tensor counted as the larger
    (A[2j] + A[2j+1]: 16 bytes, not 32), a stride past 2^16 positions as the rank. Checked on
    every form of every shipped layer and on those files."""
    from mambalaya.cost.traffic import untiled_traffic
    from mambalaya.einsum.cascade_file import loads_cascade
    from mambalaya.einsum.stats import einsum_reads
    from mambalaya.workloads.shipped import shipped_layers

    def check(c) -> int:
        for e in c.einsums:
            model, _ = untiled_traffic(c, (e.name,))
            stats = {t: n * c.tensors[t].stored_bytes_per_element for t, n in einsum_reads(c, e).items()
                     if n and c.tensors[t].stored_bytes_per_element}  # (a declared mask moves nothing)
            assert stats == pytest.approx({t: b for t, b in model.items() if b}), (c.name, e.name)
        return len(c.einsums)

    assert sum(check(layer.cascade) for layer in shipped_layers(seq_len=64, batch=2)) > 2000
    head = "ranks: {I: 16, J: 8, K: 100000, B: 2, D: 4}\ntensors:\n"
    files = {"pool": ("A: {ranks: [I], role: input}\n  Y: {ranks: [J], role: output}", "Y[j] = A[2*j] + A[2*j+1]", 32),
             "rows": ("X: {ranks: [B, I, D], role: input}\n  Y: {ranks: [B, D], role: output}",
                      "Y[b,d] = X[b,0,d] + X[b,15,d] + X[b,7,d]", 2 * 16 * 4 * 2),
             "stride": ("A: {ranks: [K], role: input}\n  Y: {ranks: [K], role: output}", "Y[k] = A[2*k]", 200000)}
    for name, (tensors, einsum, read) in files.items():
        c = loads_cascade(f"{head}  {tensors}\neinsums:\n  - {einsum}\n", source=name)
        check(c)
        assert sum(einsum_reads(c, c.einsums[0]).values()) * 2 == read, name
