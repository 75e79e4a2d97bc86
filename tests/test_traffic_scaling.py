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
    cascade = build_layer(PRESETS["mamba2-130m"], phase="prefill", seq_len=9000, batch=1, scan="chunked")
    names = [e.name for e in cascade.einsums]
    for lo, hi in ((0, len(names)), (names.index("CB"), names.index("YD") + 1)):
        for c_tile, q_tile in ((1, 1), (3, 7), (8, 64), (1, 256)):
            group = FusionGroup("g", tuple(names[lo:hi]), (Loop("B", 1), Loop("C", c_tile), Loop("Q", q_tile)))
            monkeypatch.setattr(traffic, "COMPRESS_REGULAR_TILES", True)
            fast = traffic._group_traffic(cascade, group)
            monkeypatch.setattr(traffic, "COMPRESS_REGULAR_TILES", False)
            slow = traffic._group_traffic(cascade, group)
            assert fast.read_bytes == slow.read_bytes, (group, fast.read_bytes, slow.read_bytes)
