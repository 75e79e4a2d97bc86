"""What a mixture-of-experts cascade really computes and moves, against its dense form.

A MoE block (:mod:`mambalaya.workloads.blocks.moe`) is written densely, every expert on every token
with a routing weight that is zero for the experts a token did not pick, so that the executor
gives the model's values. Only ``top_k`` of the ``n_experts`` experts run per token, so the cost
model scales the dense form:

* an Einsum of the cascade's ``experts`` region (``FF_experts`` after chaining) does
  ``top_k/n_experts`` of its dense operations;
* a tensor such an Einsum writes that has the expert rank moves ``top_k/n_experts`` of its
  dense elements (the token-expert pairs that exist);
* an expert weight (a weight with the expert rank that those Einsums read) is read for the
  ``experts_read`` experts that receive tokens in the pass: ``experts_read/n_experts`` of it.

The three numbers are the cascade's parameters ``moe_top_k``, ``moe_experts`` and
``moe_experts_read`` (set by the builder from its routing assumption). A cascade without them is
not scaled (factor 1). One device's part of an expert-parallel layer also carries ``moe_load``
(:data:`LOAD_PARAM`): the pairs its experts compute over those its own tokens make, which
multiplies the first two shares.

A mask's dead work (:mod:`mambalaya.einsum.dead_work`: a causal prefill's masked scores and
softmax in every attention form, the chunked scans' masked in-chunk products) goes on top: an
Einsum with a frame runs the live share of its frame's cells, a tensor with a fact moves its
live share. :func:`einsum_scale` and :func:`tensor_scale` are the product of both; the operation
counts take the mask's share per operation (:mod:`mambalaya.einsum.stats`), the routed share on
the whole Einsum (:func:`scaled_ops`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.dead_work import dead_work, frame_dims, masked_variables, reads_aligned
from mambalaya.einsum.ir import Role
from mambalaya.errors import SpecError

#: The expert rank's name in the shipped MoE block (:mod:`mambalaya.workloads.blocks.moe` writes it
#: into its Einsums' text; tests index its arrays by it); the cost model finds a cascade's expert
#: rank by its role, :func:`expert_rank`, never by name.
EXPERT_RANK = "X"
#: The parameter of a device's part of an expert-parallel layer
#: (:mod:`mambalaya.cost.expert_parallel`): the token-expert pairs its experts compute, over the
#: pairs of its own tokens (1: as many as its tokens make; absent: 1).
LOAD_PARAM = "moe_load"


def routed_einsums(cascade: Cascade) -> frozenset[str]:
    """The Einsums of the cascade's experts region (``experts``, or ``<prefix>_experts`` once
    chained into a layer): those that run for ``top_k`` of the experts per token."""
    return frozenset(name for key, members in cascade.regions.items()
                     if key == "experts" or key.endswith("_experts") for name in members)


def expert_rank(cascade: Cascade) -> str | None:
    """The rank that indexes a MoE block's experts: the one rank of ``moe_experts`` positions that
    every Einsum of the experts region (:func:`routed_einsums`) iterates over and their weights
    have (a token rank of as many positions has no weight; None without an experts region or
    that parameter). Found by its role, not its name: a cascade file that called
    it ``Z`` once read every expert's weights whole while its operations were routed (2.4x the
    latency of a Granite 4 decode step). A region where no rank or several ranks qualify is refused."""
    memo = cascade.__dict__.get("_expert_rank", False)
    if memo is not False:
        return memo
    routed = routed_einsums(cascade)
    found = None
    if routed and "moe_experts" in cascade.params:
        n = int(cascade.params["moe_experts"])
        every = set.intersection(*(set(cascade.iteration_ranks(cascade.einsum(e))) for e in routed))
        weights = {r for e in routed for t in cascade.einsum(e).input_tensors if cascade.tensors[t].role == Role.WEIGHT
                   for r in cascade.tensors[t].ranks}  # (each expert's own weights: no token rank has them)
        candidates = [r for r in cascade.ranks if r in every and r in weights and cascade.size(r) == n]
        if len(candidates) != 1:
            raise SpecError(f"cascade {cascade.name}: its experts region ({', '.join(sorted(routed))}) needs one rank "
                            f"of moe_experts = {n} positions that every one of its Einsums iterates over (the expert "
                            f"rank); found {', '.join(candidates) or 'none'}")
        found = candidates[0]
    cascade.__dict__["_expert_rank"] = found
    return found


def _plan(cascade: Cascade) -> tuple[dict[str, Fraction], dict[str, Fraction]]:
    """Per Einsum, the share of its dense operations that run; per tensor, the share of its
    dense elements a pass moves (only those below 1)."""
    memo = cascade.__dict__.get("_routing_plan")
    if memo is not None:
        return memo
    params = cascade.params
    einsums: dict[str, Fraction] = {}
    scales: dict[str, Fraction] = {}
    if "moe_experts" in params:
        n = int(params["moe_experts"])
        pairs = Fraction(int(params["moe_top_k"]), n) * Fraction(params.get(LOAD_PARAM, 1))
        weights = Fraction(int(params["moe_experts_read"]), n)
        experts = expert_rank(cascade)
        for name in routed_einsums(cascade):
            einsums[name] = pairs
            einsum = cascade.einsum(name)
            if experts in cascade.tensors[name].ranks:
                scales[name] = pairs
            for t in einsum.input_tensors:
                spec = cascade.tensors[t]
                if spec.role == Role.WEIGHT and experts in spec.ranks:
                    scales[t] = weights
    plan = (einsums, scales)
    cascade.__dict__["_routing_plan"] = plan
    return plan


def computed_key_blocks(queries: int, blocks: int, block: int) -> Fraction:
    """The share of (query, key block) pairs a causal prefill computes: a query at position ``i``
    sees the blocks whose first key is at or before it, ``min(blocks, floor(i/block) + 1)``
    (the closed form of a causal key-block mask's live share, :class:`~mambalaya.einsum.dead_work.Band`)."""
    full = queries // block  # whole blocks of queries
    if blocks > full:  # every query's blocks exist (a prefill: blocks = ceil(queries / block)): closed form
        seen = block * full * (full + 1) // 2 + (queries - full * block) * (full + 1)
    else:
        seen = sum(min(blocks, i // block + 1) for i in range(queries))
    return Fraction(seen, queries * blocks)


def routed_scale(cascade: Cascade, einsum: str) -> Fraction:
    """The fraction of an Einsum's dense operations its routing runs (a MoE expert's share)."""
    return _plan(cascade)[0].get(einsum, Fraction(1))


def einsum_scale(cascade: Cascade, einsum: str) -> Fraction:
    """The fraction of an Einsum's dense iteration space that runs: the routed share times the
    live share of its mask frame (:func:`~mambalaya.einsum.dead_work.masked_variables`)."""
    masked = masked_variables(cascade, einsum)
    return routed_scale(cascade, einsum) * (masked[1] if masked else 1)


def operand_scale(cascade: Cascade, einsum: str, accesses) -> Fraction:
    """The fraction of an operand's dense reads (its ``accesses`` in ``einsum``) that the
    Einsum makes: the routed share, times the mask frame's live share when the accesses read
    both frame variables (:func:`~mambalaya.einsum.dead_work.frame_dims`; an operand that lacks
    one, ``ACS[q]`` beside ``LM[q,s]``, is read whole)."""
    routed = routed_scale(cascade, einsum)
    masked = masked_variables(cascade, einsum)
    if masked is None or frame_dims(cascade, einsum, accesses) is None:
        return routed
    return routed * masked[1]


def work_text(cascade: Cascade, einsum: str) -> str:
    """What share of an Einsum's dense work runs, and why, for a table: ``routed 2/8`` (a MoE
    expert's pairs), ``mask q,s live 129/256`` (a mask's frame and its live share), or empty."""
    parts = []
    routed = routed_scale(cascade, einsum)
    if routed != 1:
        parts.append(f"routed {routed}")
    masked = masked_variables(cascade, einsum)
    if masked is not None:
        frame = dead_work(cascade).frames[einsum][0]
        parts.append(f"mask {','.join(v for v in (frame.row, frame.col) if v)} live {masked[1]}")
    return "; ".join(parts)


def tensor_scale(cascade: Cascade, tensor: str) -> Fraction:
    """The fraction of a tensor's dense elements that a pass writes (and moves when read
    whole): routed, and live under a mask."""
    return _plan(cascade)[1].get(tensor, Fraction(1)) * dead_work(cascade).tensor_shares.get(tensor, Fraction(1))


def read_scale(cascade: Cascade, tensor: str, accesses) -> Fraction:
    """The fraction of the elements ``accesses`` reach of ``tensor`` that a read moves: the
    routed share, times a masked tensor's live share when every access reads its fact's
    dimensions at plain variables (:func:`~mambalaya.einsum.dead_work.reads_aligned`). Any other
    read moves what it reaches: a carried value's dead cell (the online softmax's ``OR`` at the
    last key) is read from the cell it carries, one element for one."""
    share = dead_work(cascade).tensor_shares.get(tensor)
    routed = _plan(cascade)[1].get(tensor, Fraction(1))
    if share is None or not reads_aligned(cascade, tensor, accesses):
        return routed
    return routed * share


def scaled_ops(cascade: Cascade, einsum: str, ops: dict[str, int]) -> dict[str, int]:
    """``ops`` (already counted on a mask's live cells) times the routed share."""
    scale = routed_scale(cascade, einsum)
    if scale == 1:
        return ops
    return {k: int(round(v * scale)) for k, v in ops.items()}


def experts_reached(fractions: Sequence[float], tokens: int, top_k: int) -> int:
    """Experts a pass of ``tokens`` tokens, each choosing ``top_k`` distinct experts, reaches
    under a routing histogram (``fractions``: each expert's share of all the token-expert
    choices; a device's experts alone under expert parallelism): an expert's weights are read
    if it receives at least one choice, and each choice lands on expert ``e`` with probability
    ``fractions[e]``, independently, so the expected count is
    ``sum(1 - (1 - f)^(tokens * top_k))``, rounded (an assumption: a measured histogram is a
    long-run average). Held between two bounds the choices set: at most the experts with a
    non-zero fraction and the choices these experts receive, ``tokens * top_k * sum(fractions)``;
    at least those choices over ``tokens``, since a token sends one expert at most one choice
    (the independent draws alone would let six hot experts of a top-6 router reach four). A
    fraction of 1e-9 is not a whole expert read (once every non-zero fraction was, so a
    measured histogram, which has no exact zeros, read every expert)."""
    assignments = tokens * top_k
    expected = sum(1.0 - (1.0 - f) ** assignments for f in fractions if f > 0)
    received = assignments * sum(fractions)
    upper = min(sum(1 for f in fractions if f > 0), math.ceil(received - 1e-6))
    lower = math.ceil(received / tokens - 1e-6) if tokens else 0
    return max(1, min(upper, max(lower, round(expected))))


__all__ = ["experts_reached", "EXPERT_RANK", "expert_rank", "LOAD_PARAM", "computed_key_blocks", "einsum_scale", "operand_scale", "read_scale", "routed_einsums",
           "routed_scale", "work_text",
           "scaled_ops", "tensor_scale"]
