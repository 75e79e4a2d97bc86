"""Groupings that are not contiguous in the cascade's order: every partition of a cascade into
connected convex groups, searched exactly by a dynamic programme over its downsets.

A group runs as one loop nest, so no path may leave it and come back (through an off-chip tensor
another group writes): the group is **convex** in the Einsums' dependency graph. The groups of a
grouping run one after another in some topological order, so the Einsums done before each group
form a **downset** (a set closed under predecessors), and a group is the difference of two
downsets, ``D2 - D1`` with ``D1`` inside ``D2``; every convex set is one. The best grouping is then
a shortest path over the downsets, from the empty set to the whole cascade,
``best[D2] = min over D1 of best[D1] + cost(D2 - D1)``: exact, since a group's cost depends on
its Einsums alone, as in the contiguous search (:func:`mambalaya.model.search.optimal`).

The space is the groups that are **connected**: their Einsums linked by the tensors one writes
and another reads, or by a tensor two of them read. A group of two parts that share no tensor
saves no traffic over the parts run apart; the model would grant it only the overlap of one
part's compute with the other's memory, a scheduling effect this search leaves out (the parts
are searched as groups of their own). The contiguous segments are such groups, so the result is
never worse than the contiguous search's.

The space grows quickly with the cascade's width (the recurrent Mamba-2 layer has 819 downsets
and 10,584 connected convex groups, the chunked one 5,007 downsets), so :func:`convex_space`
gives up beyond :data:`DOWNSET_LIMIT` downsets or :data:`CONVEX_GROUP_LIMIT` groups, and the
caller searches contiguous groups instead and says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from mambalaya.einsum.cascade import Cascade

#: Largest number of downsets, and of connected convex groups, the convex search takes on (the
#: Mamba-1 layer: 99 downsets and 855 groups in prefill, 192 and 1,272 in decode).
DOWNSET_LIMIT = 2000
CONVEX_GROUP_LIMIT = 1500


@dataclass(frozen=True)
class ConvexSpace:
    """The downsets of a cascade (bit masks over its Einsums in cascade order, by size: the
    empty set first, the whole cascade last) and its connected convex groups, each with the
    pairs of downsets it joins."""

    names: tuple[str, ...]
    downsets: tuple[int, ...]
    groups: dict[int, tuple[tuple[int, int], ...]]  # group mask -> (D1, D2) with D2 - D1 = group

    def einsums(self, mask: int) -> list[str]:
        """The group's Einsums, in cascade order."""
        return [n for i, n in enumerate(self.names) if mask >> i & 1]


_SPACES: dict[tuple, ConvexSpace | None] = {}


def convex_space(cascade: Cascade) -> ConvexSpace | None:
    """The cascade's downsets and connected convex groups, or None beyond the limits.
    Memoised per dependency structure (every length and batch of a layer shares it)."""
    names = tuple(e.name for e in cascade.einsums)
    bit = {n: 1 << i for i, n in enumerate(names)}
    preds = tuple(sum(bit[t] for t in set(e.input_tensors) if t in bit and t != e.name) for e in cascade.einsums)
    links = _links(cascade, names, bit)
    key = (names, preds, links, DOWNSET_LIMIT, CONVEX_GROUP_LIMIT)
    if key not in _SPACES:
        _SPACES[key] = _convex_space(names, preds, links)
    return _SPACES[key]


def _convex_space(names: tuple[str, ...], preds: tuple[int, ...], links: tuple[int, ...]) -> ConvexSpace | None:
    downsets = _downsets(list(preds))
    if downsets is None:
        return None
    groups: dict[int, list[tuple[int, int]]] = {}
    for d2 in downsets:
        for d1 in downsets:
            if d1 & ~d2 or d1 == d2:
                continue
            g = d2 & ~d1
            if g in groups:
                groups[g].append((d1, d2))
            elif _connected(g, links):
                if len(groups) >= CONVEX_GROUP_LIMIT:
                    return None
                groups[g] = [(d1, d2)]
    return ConvexSpace(names, tuple(downsets), {g: tuple(p) for g, p in groups.items()})


def _downsets(preds: list[int]) -> list[int] | None:
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
                        if len(seen) > DOWNSET_LIMIT:
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


def _connected(mask: int, links: tuple[int, ...]) -> bool:
    first = mask & -mask
    seen, stack = first, [first.bit_length() - 1]
    while stack:
        near = links[stack.pop()] & mask & ~seen
        while near:
            b = near & -near
            near ^= b
            seen |= b
            stack.append(b.bit_length() - 1)
    return seen == mask
