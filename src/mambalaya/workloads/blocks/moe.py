"""A pre-norm mixture-of-experts block (RMSNorm, top-k router, gated expert MLPs, an optional
shared MLP, residual) as a cascade of extended Einsums, as transformers' Jamba
(``JambaSparseMoeBlock``) and Granite 4 (``GraniteMoeHybridMoE`` + ``GraniteMoeHybridMLP``) run it.

Ranks: ``B`` batch, ``I`` position (or ``C`` x ``Q`` chunks, as the chunked Mamba-2 mixer
writes them), ``D`` hidden, ``X`` experts, ``Y`` experts again (the router compares every
expert with every other), ``F`` an expert's intermediate size, ``V`` the shared MLP's.

* ``SS``, ``RS``, ``XN``: the RMSNorm before the feed-forward block
* ``LG[b,i,x] = XN[b,i,d]*WR[d,x]``: router logits; ``LM`` their max, ``LE = exp(LG - LM)``
* ``NB[b,i,x] = step(LG[b,i,y] - LG[b,i,x])``: how many experts score above expert ``x``
  (summed over ``y``); ``SEL[b,i,x] = step(topk - NB[b,i,x])`` is 1 for the ``topk`` best
* routing weights ``RW[b,i,x]``, zero for the experts not selected:
  - ``softmax-topk`` (Jamba, ``JambaTopKRouter``): the softmax over all experts, kept for the
    selected ones and not renormalised: ``LS = sum_x LE``, ``RW = LE*SEL/LS``;
  - ``topk-softmax`` (Granite 4, ``GraniteMoeHybridTopKRouter``): the softmax over the selected
    logits only: ``SE = LE*SEL``, ``LS = sum_x SE``, ``RW = SE/LS``. (The max of all logits is
    the max of the selected ones, so ``LM`` is the max of the softmax both routers take.)
* experts, every one on every token (the dense form): ``GT``/``UP[b,i,x,f] = XN[b,i,d]*W[x,d,f]``,
  ``HM = silu(GT)*UP``, ``EO[b,i,x,d] = HM[b,i,x,f]*WDN[x,f,d]``; the combine
  ``MO[b,i,d] = EO[b,i,x,d]*RW[b,i,x]`` adds exactly the selected experts' outputs, weighted
  (an unselected one is multiplied by an exact 0)
* the shared MLP (Granite 4): ``SG``, ``SU``, ``SH = silu(SG)*SU``, ``SO = SH x WSD``
* ``XO = X + MO*rm`` (``X + (MO + SO)*rm`` with the shared MLP; ``rm`` is Granite's
  ``residual_multiplier``, absent when 1)

What the IR needed: one unary function, ``step`` (Heaviside), for the two comparisons of the
top-k selection; the pairwise count is an ordinary reduction over a second expert rank ``Y``.
Ties between logits at the k-th place would select both (``torch.topk`` picks one); with
real-valued logits they have probability zero.

**Cost.** The executor runs the dense form and gives transformers' values. The cost model must
not charge the dense form's zero work: the Einsums of the ``experts`` region (``GT``, ``UP``,
``HM``, ``EO``, ``MO``) run for ``topk`` of the ``n_experts`` experts per token, so their
operations and the traffic of their per-expert tensors are ``topk/n_experts`` of the dense
form's, and an expert's weights are read once per pass if it receives any token
(:mod:`mambalaya.einsum.routing`). How many tokens each expert gets is the named assumption
``routing``:

* ``uniform`` (default): each expert receives ``tokens*topk/n_experts`` tokens; the experts whose
  weights a pass reads are ``min(n_experts, tokens*topk)`` -- the most that ``tokens*topk``
  choices can reach, what a load-balanced router reaches (assumption: no two tokens of a small
  decode batch pick the same expert; random independent choices would reach fewer, about
  ``n(1-(1-topk/n)^tokens)``);
* a histogram (``load_routing_histogram``: a YAML/JSON list of per-expert token fractions,
  non-negative, summing to 1, one per expert, none above ``1/topk`` (what a top-k router can
  produce; :func:`check_histogram`), e.g. measured on a dataset): the experts read are
  ``min(experts with a non-zero fraction, tokens*topk)``. The total work is the same
  (``tokens*topk`` token-expert pairs); load imbalance between experts is not modelled.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import BaseModel, BeforeValidator, Field, PositiveInt, model_validator

from mambalaya.specio import SPEC_MODEL_CONFIG, list_as_tuple

from mambalaya.errors import SpecError
from mambalaya.einsum.cascade import Cascade, build_cascade
from mambalaya.einsum.ir import Rank, Role, TensorSpec
from mambalaya.einsum.parse import parse_einsum
from mambalaya.workloads.checks import check_layer_args, validated_config

Router = Literal["softmax-topk", "topk-softmax"]
#: The region of the routed (per-expert) Einsums.
EXPERTS_REGION: tuple[str, ...] = ("GT", "UP", "HM", "EO", "MO")
Routing = Union[Literal["uniform"], Annotated[tuple[float, ...], BeforeValidator(list_as_tuple)]]


class MoEConfig(BaseModel):
    """One MoE feed-forward block: ``d_model`` [hidden_size], ``d_ff`` [intermediate_size, per
    expert], ``n_experts`` [num_experts / num_local_experts], ``top_k`` [num_experts_per_tok],
    ``router`` (how the routing weights are normalised), ``shared_d_ff``
    [shared_intermediate_size; None: no shared MLP], ``residual_multiplier``, ``norm_eps``
    [rms_norm_eps] and ``routing`` (the cost model's token-per-expert assumption)."""

    model_config = SPEC_MODEL_CONFIG

    d_model: PositiveInt
    d_ff: PositiveInt
    n_experts: PositiveInt
    top_k: PositiveInt
    router: Router
    shared_d_ff: PositiveInt | None = None
    residual_multiplier: float = Field(1.0, gt=0)
    norm_eps: float = Field(1e-6, gt=0)
    routing: Routing = "uniform"

    @model_validator(mode="after")
    def _fits(self) -> "MoEConfig":
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k = {self.top_k} exceeds n_experts = {self.n_experts}: a token cannot pick "
                             "more experts than there are")
        if self.routing != "uniform":
            check_histogram(list(self.routing), self.n_experts, self.top_k, "routing")
        return self

    def layer_parameters(self) -> int:
        """Weight elements: the norm, the router, every expert's three projections, the shared MLP."""
        d = self.d_model
        shared = 3 * d * self.shared_d_ff if self.shared_d_ff else 0
        return d + d * self.n_experts + self.n_experts * 3 * d * self.d_ff + shared

    def active_parameters(self) -> int:
        """Weight elements one token uses: the norm, the router, ``top_k`` experts, the shared MLP."""
        d = self.d_model
        shared = 3 * d * self.shared_d_ff if self.shared_d_ff else 0
        return d + d * self.n_experts + self.top_k * 3 * d * self.d_ff + shared

    def experts_read(self, tokens: int) -> int:
        """Experts whose weights one pass over ``tokens`` tokens reads (the module doc's rule)."""
        used = self.n_experts if self.routing == "uniform" else sum(1 for f in self.routing if f > 0)
        return min(used, tokens * self.top_k)


def check_histogram(values: list, n_experts: int, top_k: int, field: str) -> tuple[float, ...]:
    """A routing histogram a top-``top_k`` router can produce: one non-negative fraction of the
    token-expert assignments per expert, summing to 1, none above ``1/top_k`` (a token picks
    ``top_k`` distinct experts, so an expert receives at most one of each token's ``top_k``
    assignments; it follows that at least ``top_k`` experts receive tokens)."""
    if not isinstance(values, list) or not values:
        raise ValueError(f"{field} must be a list of per-expert token fractions")
    for k, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{field}[{k}] is {v!r}; a token fraction is a non-negative number")
    if len(values) != n_experts:
        raise ValueError(f"{field} has {len(values)} fractions but the model has {n_experts} experts")
    if abs(sum(values) - 1.0) > 1e-6:
        raise ValueError(f"{field} sums to {sum(values):.9g}; the token fractions of the experts must sum to 1")
    over = [(k, v) for k, v in enumerate(values) if v > 1.0 / top_k + 1e-9]
    if over:
        k, v = over[0]
        raise ValueError(f"{field}[{k}] is {v!r}, above 1/top_k = 1/{top_k}: a top-{top_k} router sends each token "
                         f"to {top_k} distinct experts, so no expert receives more than 1/{top_k} of the assignments "
                         f"(and at least {top_k} experts receive some); no router of this model can produce it")
    return tuple(float(v) for v in values)


def load_routing_histogram(path: str | Path, n_experts: int, top_k: int) -> tuple[float, ...]:
    """Per-expert token fractions from a YAML or JSON file (a list, or a mapping with the list
    under ``fractions``); one SpecError naming the file and the entry at fault."""
    from mambalaya.specio import parse_document_text, read_spec_file

    text = read_spec_file(Path(path), "routing histogram")
    data = parse_document_text(text, source=str(path), json_document=str(path).endswith(".json"))
    field = "fractions" if isinstance(data, dict) else "routing histogram"
    if isinstance(data, dict):
        extra = sorted(set(data) - {"fractions", "source"})
        if extra or "fractions" not in data:
            raise SpecError(f"a routing histogram mapping has the keys fractions (and source); this one has "
                            f"{', '.join(map(str, data))}", source=str(path))
        data = data["fractions"]
    try:
        return check_histogram(data, n_experts, top_k, field)
    except ValueError as err:
        raise SpecError(str(err), source=str(path)) from None


def parse_moe_config(data: dict, *, source: str = "MoE config") -> MoEConfig:
    return validated_config(MoEConfig, data, what="mixture-of-experts", source=source)


def _einsums(config: MoEConfig, o: str) -> list[str]:
    lines = [
        f"SS[b,{o}] = X[b,{o},d]*X[b,{o},d]",
        f"RS[b,{o}] = rsqrt(SS[b,{o}]/D + eps)",
        f"XN[b,{o},d] = X[b,{o},d]*RS[b,{o}]*WN[d]",
        f"LG[b,{o},x] = XN[b,{o},d]*WR[d,x]",
        f"LM[b,{o}] max= LG[b,{o},x]",
        f"LE[b,{o},x] = exp(LG[b,{o},x] - LM[b,{o}])",
        f"NB[b,{o},x] = step(LG[b,{o},y] - LG[b,{o},x])",
        f"SEL[b,{o},x] = step(topk - NB[b,{o},x])",
    ]
    if config.router == "softmax-topk":
        lines += [f"LS[b,{o}] = LE[b,{o},x]", f"RW[b,{o},x] = LE[b,{o},x]*SEL[b,{o},x]/LS[b,{o}]"]
    else:
        lines += [f"SE[b,{o},x] = LE[b,{o},x]*SEL[b,{o},x]", f"LS[b,{o}] = SE[b,{o},x]",
                  f"RW[b,{o},x] = SE[b,{o},x]/LS[b,{o}]"]
    lines += [
        f"GT[b,{o},x,f] = XN[b,{o},d]*WG[x,d,f]",
        f"UP[b,{o},x,f] = XN[b,{o},d]*WU[x,d,f]",
        f"HM[b,{o},x,f] = silu(GT[b,{o},x,f])*UP[b,{o},x,f]",
        f"EO[b,{o},x,d] = HM[b,{o},x,f]*WDN[x,f,d]",
        f"MO[b,{o},d] = EO[b,{o},x,d]*RW[b,{o},x]",
    ]
    out = f"MO[b,{o},d]"
    if config.shared_d_ff:
        lines += [
            f"SG[b,{o},v] = XN[b,{o},d]*WSG[d,v]",
            f"SU[b,{o},v] = XN[b,{o},d]*WSU[d,v]",
            f"SH[b,{o},v] = silu(SG[b,{o},v])*SU[b,{o},v]",
            f"SO[b,{o},d] = SH[b,{o},v]*WSD[v,d]",
        ]
        out = f"(MO[b,{o},d] + SO[b,{o},d])"
    scaled = out if config.residual_multiplier == 1 else f"{out}*rm"
    lines.append(f"XO[b,{o},d] = X[b,{o},d] + {scaled}")
    return lines


_W, _X = Role.WEIGHT, Role.INTERMEDIATE
_TENSORS: dict[str, tuple[tuple[str, ...], Role, str]] = {
    "X": (("B", "*", "D"), Role.INPUT, "block input (residual stream)"),
    "WN": (("D",), _W, "pre-feed-forward RMSNorm weight"),
    "SS": (("B", "*"), _X, "sum of squares"),
    "RS": (("B", "*"), _X, "reciprocal RMS"),
    "XN": (("B", "*", "D"), _X, "normalised input"),
    "WR": (("D", "X"), _W, "router weight"),
    "LG": (("B", "*", "X"), _X, "router logits"),
    "LM": (("B", "*"), _X, "largest logit"),
    "LE": (("B", "*", "X"), _X, "exp(logit - max)"),
    "NB": (("B", "*", "X"), _X, "experts scoring above this one"),
    "SEL": (("B", "*", "X"), _X, "1 for the top-k experts, else 0"),
    "SE": (("B", "*", "X"), _X, "exp of the selected logits"),
    "LS": (("B", "*"), _X, "softmax denominator"),
    "RW": (("B", "*", "X"), _X, "routing weights (0 for unselected experts)"),
    "WG": (("X", "D", "F"), _W, "experts' gate projections"),
    "WU": (("X", "D", "F"), _W, "experts' up projections"),
    "GT": (("B", "*", "X", "F"), _X, "expert gate pre-activation"),
    "UP": (("B", "*", "X", "F"), _X, "expert up projection"),
    "HM": (("B", "*", "X", "F"), _X, "silu(gate) x up"),
    "WDN": (("X", "F", "D"), _W, "experts' down projections"),
    "EO": (("B", "*", "X", "D"), _X, "expert outputs"),
    "MO": (("B", "*", "D"), _X, "routing-weighted sum of the expert outputs"),
    "WSG": (("D", "V"), _W, "shared MLP gate half of input_linear"),
    "WSU": (("D", "V"), _W, "shared MLP up half of input_linear"),
    "SG": (("B", "*", "V"), _X, "shared gate pre-activation"),
    "SU": (("B", "*", "V"), _X, "shared up projection"),
    "SH": (("B", "*", "V"), _X, "shared silu(gate) x up"),
    "WSD": (("V", "D"), _W, "shared MLP output_linear"),
    "SO": (("B", "*", "D"), _X, "shared MLP output"),
    "XO": (("B", "*", "D"), Role.OUTPUT, "block output (residual stream)"),
}


def moe_layer(
    config: MoEConfig, *, batch: int, seq_len: int, phase: str = "prefill", bits: int = 16,
    chunk_size: int | None = None, name: str | None = None,
) -> Cascade:
    """One MoE block over ``seq_len`` positions (prefill) or one (decode); with ``chunk_size``,
    over ``C = ceil(seq_len/chunk_size)`` chunks of ``Q``, as :func:`~mambalaya.workloads.blocks.mlp.mlp_layer`."""
    check_layer_args(phase, batch=batch, seq_len=seq_len, bits=bits)
    positions = 1 if phase == "decode" else seq_len
    if chunk_size is None:
        where, index = [Rank("I", positions, "L" if phase == "prefill" else "1")], "i"
    else:
        where = [Rank("C", math.ceil(positions / chunk_size), "ceil(L/chunk_size)"), Rank("Q", chunk_size, "chunk_size")]
        index = "c,q"
    c = config
    ranks = [Rank("B", batch, "batch"), *where, Rank("D", c.d_model, "hidden_size"),
             Rank("X", c.n_experts, "num_experts"), Rank("Y", c.n_experts, "num_experts"),
             Rank("F", c.d_ff, "intermediate_size")]
    if c.shared_d_ff:
        ranks.append(Rank("V", c.shared_d_ff, "shared_intermediate_size"))
    sizes = {r.name: r.size for r in ranks}
    lines = _einsums(c, index)
    made = {line.split("[")[0] for line in lines}
    at = tuple(r.name for r in where)
    tokens = batch * math.prod(r.size for r in where)
    params: dict[str, float] = {"batch": batch, "L": positions, "eps": c.norm_eps, "topk": c.top_k,
                                "moe_top_k": c.top_k, "moe_experts": c.n_experts,
                                "moe_experts_read": c.experts_read(tokens)}
    if c.residual_multiplier != 1:
        params["rm"] = c.residual_multiplier
    if chunk_size is not None:
        params["chunk_size"] = chunk_size
    tensors = []
    for t, (rk, role, d) in _TENSORS.items():
        if t in made or (role != _X and (role != _W or _weight_used(t, lines))):
            ranks_t = tuple(r for part in rk for r in (at if part == "*" else (part,)))
            tensors.append(TensorSpec(t, ranks_t, role, bits, description=d))
    routing = "uniform" if c.routing == "uniform" else "histogram"
    return build_cascade(
        name=name or f"moe-{phase}",
        params=params,
        ranks=ranks,
        tensors=tensors,
        einsums=[parse_einsum(line, sizes=sizes) for line in lines],
        description=f"mixture-of-experts block, {phase}, hidden {c.d_model}, {c.n_experts} experts of {c.d_ff}, "
        f"top-{c.top_k} ({c.router}), shared {c.shared_d_ff or 0}, batch={batch}, I={positions}, routing {routing}: "
        f"{params['moe_experts_read']} experts read",
        regions={"experts": EXPERTS_REGION},
    )


def _weight_used(tensor: str, lines: list[str]) -> bool:
    return any(f"{tensor}[" in line.split("=", 1)[1] for line in lines)


__all__ = ["EXPERTS_REGION", "MoEConfig", "check_histogram", "load_routing_histogram", "moe_layer", "parse_moe_config"]
