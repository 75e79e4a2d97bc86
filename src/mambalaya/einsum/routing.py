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

A causal attention prefill in FlashAttention's blocked form (``softmax="blocked"``, key ranks
``TB`` blocks of ``TQ`` keys, the key mask over ``[I, TB, TQ]``) skips the key blocks the mask
hides whole, as block-skipping kernels do: a query at position ``i`` (a prefill starts at 0)
sees the ``floor(i / TQ) + 1`` blocks whose first key is at or before it, so

* an Einsum over both ``I`` and ``TB`` (scores, block max and sum, the running statistics and
  output) does ``sum_i (floor(i/TQ) + 1) / (I * TB)`` of its dense operations (about one half);
* a tensor with both ranks that such an Einsum writes, and the key mask itself, move that share
  of their elements.

Skipping is counted per query row: a kernel whose query tiles hold ``Br`` rows also computes the
blocks its tile's later rows need, up to ``Br / TQ`` blocks more per tile on the diagonal; per
row is the least work, so a speed of light stays a bound. The eager forms (three-pass, online per
key) compute every pair, as eager attention does. A decode step sees every key: nothing skipped.
"""

from __future__ import annotations

from fractions import Fraction

from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.ir import Role, rank_of_variable

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
        for name in routed_einsums(cascade):
            einsums[name] = pairs
            einsum = cascade.einsum(name)
            if EXPERT_RANK in cascade.tensors[name].ranks:
                scales[name] = pairs
            for t in einsum.input_tensors:
                spec = cascade.tensors[t]
                if spec.role == Role.WEIGHT and EXPERT_RANK in spec.ranks:
                    scales[t] = weights
    _add_skipped_key_blocks(cascade, einsums, scales)
    plan = (einsums, scales)
    cascade.__dict__["_routing_plan"] = plan
    return plan


#: The blocked softmax's ranks: queries, key blocks, keys in a block.
QUERY_RANK, KEY_BLOCK_RANK, BLOCK_KEY_RANK = "I", "TB", "TQ"


def computed_key_blocks(queries: int, blocks: int, block: int) -> Fraction:
    """The share of (query, key block) pairs a causal prefill computes: a query at position ``i``
    sees the blocks whose first key is at or before it, ``min(blocks, floor(i/block) + 1)``."""
    full = queries // block  # whole blocks of queries
    if blocks > full:  # every query's blocks exist (a prefill: blocks = ceil(queries / block)): closed form
        seen = block * full * (full + 1) // 2 + (queries - full * block) * (full + 1)
    else:
        seen = sum(min(blocks, i // block + 1) for i in range(queries))
    return Fraction(seen, queries * blocks)


def _add_skipped_key_blocks(cascade: Cascade, einsums: dict[str, Fraction], scales: dict[str, Fraction]) -> None:
    """The blocked softmax's skipped key blocks (the module doc): a prefill (no cached rank
    ``M``) that is causal (no ``causal: 0`` parameter) with a key mask over ``[I, TB, TQ]``."""
    ranks = cascade.ranks
    if not {QUERY_RANK, KEY_BLOCK_RANK, BLOCK_KEY_RANK} <= set(ranks) or "M" in ranks or not cascade.params.get("causal", 1):
        return
    masks = [t for t, spec in cascade.tensors.items()
             if spec.ranks == (QUERY_RANK, KEY_BLOCK_RANK, BLOCK_KEY_RANK) and cascade.producer(t) is None]
    if not masks:
        return
    share = computed_key_blocks(cascade.size(QUERY_RANK), cascade.size(KEY_BLOCK_RANK), cascade.size(BLOCK_KEY_RANK))
    both = {QUERY_RANK, KEY_BLOCK_RANK}
    for e in cascade.einsums:
        if both <= {rank_of_variable(v) for v in e.iteration_variables}:
            einsums[e.name] = share
            if both <= set(cascade.tensors[e.name].ranks):
                scales[e.name] = share
    for t in masks:
        scales[t] = share


def einsum_scale(cascade: Cascade, einsum: str) -> Fraction:
    """The fraction of an Einsum's dense operations that run."""
    return _plan(cascade)[0].get(einsum, Fraction(1))


def tensor_scale(cascade: Cascade, tensor: str) -> Fraction:
    """The fraction of a tensor's dense elements that a pass moves."""
    return _plan(cascade)[1].get(tensor, Fraction(1))


def scaled_ops(cascade: Cascade, einsum: str, ops: dict[str, int]) -> dict[str, int]:
    scale = einsum_scale(cascade, einsum)
    if scale == 1:
        return ops
    return {k: int(round(v * scale)) for k, v in ops.items()}


__all__ = ["BLOCK_KEY_RANK", "EXPERT_RANK", "KEY_BLOCK_RANK", "LOAD_PARAM", "QUERY_RANK", "computed_key_blocks",
           "einsum_scale", "routed_einsums", "scaled_ops", "tensor_scale"]
