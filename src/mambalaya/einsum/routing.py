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
not scaled (factor 1).
"""

from __future__ import annotations

from fractions import Fraction

from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.ir import Role

EXPERT_RANK = "X"


def _plan(cascade: Cascade) -> tuple[frozenset[str], dict[str, Fraction]]:
    memo = cascade.__dict__.get("_routing_plan")
    if memo is not None:
        return memo
    params = cascade.params
    routed: set[str] = set()
    scales: dict[str, Fraction] = {}
    if "moe_experts" in params:
        n = int(params["moe_experts"])
        pairs = Fraction(int(params["moe_top_k"]), n)
        weights = Fraction(int(params["moe_experts_read"]), n)
        for key, members in cascade.regions.items():
            if key == "experts" or key.endswith("_experts"):
                routed.update(members)
        for name in routed:
            einsum = cascade.einsum(name)
            if EXPERT_RANK in cascade.tensors[name].ranks:
                scales[name] = pairs
            for t in einsum.input_tensors:
                spec = cascade.tensors[t]
                if spec.role == Role.WEIGHT and EXPERT_RANK in spec.ranks:
                    scales[t] = weights
    plan = (frozenset(routed), scales)
    cascade.__dict__["_routing_plan"] = plan
    return plan


def einsum_scale(cascade: Cascade, einsum: str) -> Fraction:
    """The fraction of an Einsum's dense operations that run."""
    routed, _ = _plan(cascade)
    if einsum not in routed:
        return Fraction(1)
    return Fraction(int(cascade.params["moe_top_k"]), int(cascade.params["moe_experts"]))


def tensor_scale(cascade: Cascade, tensor: str) -> Fraction:
    """The fraction of a tensor's dense elements that a pass moves."""
    return _plan(cascade)[1].get(tensor, Fraction(1))


def scaled_ops(cascade: Cascade, einsum: str, ops: dict[str, int]) -> dict[str, int]:
    scale = einsum_scale(cascade, einsum)
    if scale == 1:
        return ops
    return {k: int(round(v * scale)) for k, v in ops.items()}


__all__ = ["EXPERT_RANK", "einsum_scale", "scaled_ops", "tensor_scale"]
