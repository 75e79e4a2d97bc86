"""Groupings that are not contiguous in the cascade's order: every partition of a cascade into
connected convex groups, searched exactly by a dynamic programme over its downsets.

A group runs as one loop nest, so no path may leave it and come back (through an off-chip tensor
another group writes): the group is **convex** in the Einsums' dependency graph. The groups of a
grouping run one after another in some topological order, so the Einsums done before each group
form a **downset** (a set closed under predecessors), and a group is the difference of two
downsets, ``D2 - D1`` with ``D1`` inside ``D2``; every convex set is one. The best grouping is then
a shortest path over the downsets, from the empty set to the whole cascade,
``best[D2] = min over D1 of best[D1] + cost(D2 - D1)``: exact, since a group's cost depends on
its Einsums alone, as in the contiguous search (:func:`mambalaya.search.mappings.optimal`).

The space is the groups that are **connected**: their Einsums linked by the tensors one writes
and another reads, or by a tensor two of them read. A group of two parts that share no tensor
saves no traffic over the parts run apart; the model would grant it only the overlap of one
part's compute with the other's memory, a scheduling effect this search leaves out (the parts
are searched as groups of their own). The contiguous segments are such groups, so the result is
never worse than the contiguous search's.

The space grows quickly with the cascade's width (the recurrent Mamba-2 layer has 819 downsets
and 10,584 connected convex groups, the chunked one 5,007 downsets and 103,636 groups). By
default :func:`convex_space` gives up beyond :data:`DOWNSET_LIMIT` downsets or
:data:`CONVEX_GROUP_LIMIT` groups, and the ``optimal`` search keeps to contiguous groups and
says so; ``widest=True`` (the ``optimal-convex`` mapping) takes spaces up to the ``WIDEST_*``
limits. The downsets are enumerated in Python, the pairs and groups with numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from mambalaya.einsum.cascade import Cascade

#: The space ``optimal`` searches convexly by default: at most this many downsets and connected
#: convex groups (the Mamba-1 layer: 99 downsets and 855 groups in prefill, 192 and 1,272 in
#: decode). A wider cascade is searched over contiguous groups unless asked for
#: (``optimal-convex``).
DOWNSET_LIMIT = 2000
CONVEX_GROUP_LIMIT = 1500

#: The widest space ``optimal-convex`` takes on: downsets, (downset, downset) pairs one inside
#: the other, and connected convex groups. The chunked Mamba-2 layer, the widest shipped, has
#: 5,007 downsets, 368,305 pairs that differ by a connected convex group and 103,636 such
#: groups. Masks are 63-bit integers, so a cascade of more than 63 Einsums is searched over
#: contiguous groups (whose space holds its masks as Python integers).
WIDEST_DOWNSETS = 20_000
WIDEST_PAIRS = 4_000_000
WIDEST_GROUPS = 1_000_000
MAX_EINSUMS = 63


@dataclass(frozen=True, eq=False)
class ConvexSpace:
    """The downsets of a cascade (bit masks over its Einsums in cascade order, by size: the
    empty set first, the whole cascade last), its connected convex groups (by size, then mask)
    and every pair of downsets ``D1`` inside ``D2`` whose difference is one of them (``src``,
    ``dst`` index the downsets, ``group`` the groups; by ``dst``, then ``src``)."""

    names: tuple[str, ...]
    downsets: np.ndarray
    masks: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    group: np.ndarray

    def einsums(self, mask: int) -> list[str]:
        """The group's Einsums, in the space's order (the cascade's, or the contiguous search's,
        :func:`search_order`: both topological)."""
        return [n for i, n in enumerate(self.names) if mask >> i & 1]

    @cached_property
    def groups(self) -> dict[int, tuple[tuple[int, int], ...]]:
        """Group mask -> the (D1, D2) pairs it joins, D2 - D1 = group."""
        out: dict[int, list[tuple[int, int]]] = {int(m): [] for m in self.masks}
        d = self.downsets.tolist()
        for a, b, g in zip(self.src.tolist(), self.dst.tolist(), self.group.tolist()):
            out[int(self.masks[g])].append((d[a], d[b]))
        return {m: tuple(p) for m, p in out.items()}

    @cached_property
    def levels(self) -> np.ndarray:
        """Each downset's size."""
        return _popcount(self.downsets)

    @cached_property
    def by_src(self) -> np.ndarray:
        """The pairs in order of ``src`` (then ``dst``)."""
        return np.lexsort((self.dst, self.src))

    @cached_property
    def upward_levels(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """Per size of ``dst`` (the smallest first, empty ones left out): its pairs' ``src``,
        ``group``, the positions among them where a new ``dst`` starts, and those ``dst``. A
        shortest-path pass from the empty downset reduces each level's pairs at those starts."""
        dst_level = self.levels[self.dst]
        cuts = np.searchsorted(dst_level, np.arange(1, int(self.levels[-1]) + 2))
        return [_level(self.src[lo:hi], self.group[lo:hi], self.dst[lo:hi])
                for lo, hi in zip(cuts[:-1].tolist(), cuts[1:].tolist()) if lo < hi]

    @cached_property
    def downward_levels(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """Per size of ``src`` (the largest first, empty ones left out): its pairs' ``dst``,
        ``group``, the positions among them where a new ``src`` starts, and those ``src``; for
        a shortest-path pass from the whole cascade down."""
        order = self.by_src
        src = self.src[order]
        cuts = np.searchsorted(self.levels[src], np.arange(0, int(self.levels[-1]) + 1))
        return [_level(self.dst[order[lo:hi]], self.group[order[lo:hi]], src[lo:hi])
                for lo, hi in reversed(list(zip(cuts[:-1].tolist(), cuts[1:].tolist()))) if lo < hi]


def _level(other: np.ndarray, group: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, ...]:
    """One level's pairs (see :attr:`ConvexSpace.upward_levels`), ``end`` in runs."""
    starts = np.flatnonzero(np.concatenate([[True], end[1:] != end[:-1]]))
    return other, group, starts, end[starts]


_SPACES: dict[tuple, ConvexSpace | None] = {}


def convex_space(cascade: Cascade, *, widest: bool = False) -> ConvexSpace | None:
    """The cascade's downsets and connected convex groups, or None beyond the limits (the
    default search's, or with ``widest`` those of ``optimal-convex``). Memoised per dependency
    structure (every length and batch of a layer shares it)."""
    names = tuple(e.name for e in cascade.einsums)
    if len(names) > MAX_EINSUMS:
        return None
    bit = {n: 1 << i for i, n in enumerate(names)}
    preds = tuple(sum(bit[t] for t in set(e.input_tensors) if t in bit and t != e.name) for e in cascade.einsums)
    links = _links(cascade, names, bit)
    limits = (WIDEST_DOWNSETS, WIDEST_PAIRS, WIDEST_GROUPS) if widest else (DOWNSET_LIMIT, None, CONVEX_GROUP_LIMIT)
    key = (names, preds, links, limits)
    if key not in _SPACES:
        _SPACES[key] = _convex_space(names, preds, links, *limits)
    return _SPACES[key]


_CONTIGUOUS: dict[tuple[str, ...], ConvexSpace] = {}


def search_order(cascade: Cascade) -> tuple[str, ...]:
    """The order whose contiguous segments the contiguous search costs: the cascade's, but each
    *selecting sink* placed right after the last Einsum it reads from. A selecting sink is no
    recurrence, reads only tensors Einsums of the cascade make, indexes some dimension of every
    read with a constant (one position: the final states ``HN[b,e,n] = H[b,L-1,e,n]`` and the
    convolution's ``CSN``), and no Einsum reads it. Where a layer lists it (its final states
    last), a segment could hold it with its source only by also holding everything between; next
    to its source, a segment holding both keeps the source's tensor on chip, not written whole
    for one position of it. Any order the search uses is topological, so each segment runs as
    listed."""
    memo = cascade.structure_memo.setdefault("search_order", {})
    if "order" not in memo:
        order = [e.name for e in cascade.einsums]
        for e in cascade.einsums:
            if not _selecting_sink(cascade, e):
                continue
            order.remove(e.name)
            last = max(order.index(cascade.producer(t).name) for t in e.input_tensors)  # type: ignore[union-attr]
            order.insert(last + 1, e.name)
        memo["order"] = tuple(order)
    return memo["order"]


def _selecting_sink(cascade: Cascade, e) -> bool:
    if cascade.recurrence(e) is not None or not e.inputs or cascade.consumers(e.name):
        return False
    if any(cascade.producer(a.tensor) is None or a.tensor == e.name for a in e.inputs):
        return False
    return all(any(not idx.terms for idx in a.indices) for a in e.inputs)


def contiguous_space(cascade: Cascade) -> ConvexSpace | None:
    """The contiguous segments of the search order (:func:`search_order`) as a space the lazy search
    (:func:`~mambalaya.search.convex_search.lazily_costed`) runs over: the prefixes are the
    downsets (prefix ``k`` is index ``k``), every segment ``names[a:b]`` is a group, connected or
    not, joining prefix ``a`` to prefix ``b`` (one pair each). What the contiguous search
    (:func:`mambalaya.search.mappings.optimal`) searches. Beyond :data:`MAX_EINSUMS` Einsums its
    masks are Python integers (an object array: the same operations, each on a whole integer)."""
    names = search_order(cascade)
    n = len(names)
    if names not in _CONTIGUOUS:  # memoised per order of Einsums (every length and batch of a layer)
        segments = sorted(((a, b) for a in range(n) for b in range(a + 1, n + 1)),
                          key=lambda s: (s[1] - s[0], ((1 << s[1]) - 1) ^ ((1 << s[0]) - 1)))  # by size, then mask
        number = {s: g for g, s in enumerate(segments)}
        pairs = sorted(segments, key=lambda s: (s[1], s[0]))  # by dst, then src
        wide = object if n > MAX_EINSUMS else np.int64
        _CONTIGUOUS[names] = ConvexSpace(
            names, np.array([(1 << k) - 1 for k in range(n + 1)], dtype=wide),
            np.array([((1 << b) - 1) ^ ((1 << a) - 1) for a, b in segments], dtype=wide),
            np.array([a for a, _ in pairs], dtype=np.int64), np.array([b for _, b in pairs], dtype=np.int64),
            np.array([number[s] for s in pairs], dtype=np.int64))
    return _CONTIGUOUS[names]


def _convex_space(names: tuple[str, ...], preds: tuple[int, ...], links: tuple[int, ...], downset_limit: int,
                  pair_limit: int | None, group_limit: int) -> ConvexSpace | None:
    listed = _downsets(list(preds), downset_limit)
    if listed is None:
        return None
    downsets = np.array(listed, dtype=np.int64)
    src_parts, dst_parts = [], []
    pairs = 0
    for j in range(1, len(downsets)):  # every D1 inside D2 = downsets[j] (a subset comes earlier)
        inside = np.flatnonzero(downsets[:j] & ~downsets[j] == 0)
        src_parts.append(inside)
        dst_parts.append(np.full(inside.size, j, dtype=np.int64))
        pairs += inside.size
        if pair_limit is not None and pairs > pair_limit:
            return None
    src, dst = np.concatenate(src_parts), np.concatenate(dst_parts)
    diff = downsets[dst] & ~downsets[src]
    unique, group = np.unique(diff, return_inverse=True)
    keep = _connected(unique, links)
    if keep.sum() > group_limit:
        return None
    # groups by size, then mask; pairs of connected groups only
    sizes = _popcount(unique[keep])
    order = np.lexsort((unique[keep], sizes))
    masks = unique[keep][order]
    renumber = np.full(unique.size, -1, dtype=np.int64)
    renumber[np.flatnonzero(keep)[order]] = np.arange(masks.size)
    group = renumber[group.reshape(-1)]
    ok = group >= 0
    return ConvexSpace(names, downsets, masks, src[ok], dst[ok], group[ok])


def _downsets(preds: list[int], limit: int) -> list[int] | None:
    """Every set of Einsums closed under predecessors, by size (None beyond the limit)."""
    seen = {0}
    frontier = [0]
    while frontier:
        grown = []
        for d in frontier:
            for i, p in enumerate(preds):
                if not d >> i & 1 and p & ~d == 0:
                    e = d | 1 << i
                    if e not in seen:
                        seen.add(e)
                        grown.append(e)
                        if len(seen) > limit:
                            return None
        frontier = grown
    return sorted(seen, key=lambda d: (bin(d).count("1"), d))


def _links(cascade: Cascade, names: tuple[str, ...], bit: dict[str, int]) -> tuple[int, ...]:
    """Per Einsum, the Einsums it shares a tensor with (one writes what the other reads, or
    both read it)."""
    readers: dict[str, int] = {}
    for e in cascade.einsums:
        for t in e.input_tensors:
            if t != e.name:
                readers[t] = readers.get(t, 0) | bit[e.name]
    links = [0] * len(names)
    for i, e in enumerate(cascade.einsums):
        for t in e.input_tensors:
            if t != e.name:
                links[i] |= readers[t] | bit.get(t, 0)
        links[i] |= readers.get(e.name, 0)
        links[i] &= ~bit[e.name]
    return tuple(links)


def _connected(masks: np.ndarray, links: tuple[int, ...]) -> np.ndarray:
    """Whether each mask's Einsums are connected by ``links``: a search from each mask's lowest
    Einsum, grown over all masks at once until none grows."""
    seen = masks & -masks
    todo = np.arange(masks.size)
    while todo.size:
        s, g = seen[todo], masks[todo]
        grown = s.copy()
        for i, near in enumerate(links):
            grown |= np.where(s >> i & 1 == 1, near, 0)
        grown &= g
        changed = grown != s
        seen[todo] = grown
        todo = todo[changed]
    return seen == masks


def _popcount(values: np.ndarray) -> np.ndarray:
    counts = np.zeros(values.shape, dtype=np.int64)
    v = values.copy()
    while v.any():
        counts += (v & 1).astype(np.int64)
        v >>= 1
    return counts
