"""A pre-norm mixture-of-experts block (RMSNorm, top-k router, expert MLPs, an optional
shared MLP, residual) as a cascade of extended Einsums, as transformers' Jamba
(``JambaSparseMoeBlock``), Granite 4 (``GraniteMoeHybridMoE`` + ``GraniteMoeHybridMLP``) and
Nemotron-H (``NemotronHMoE``: ``NemotronHTopkRouter``, ``NemotronHExperts``, the shared
``NemotronHMLP`` and the optional latent projections) run it.

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

**Nemotron-H** (``router="sigmoid-topk"``, ``expert_mlp="relu2"``; transformers 5.25
``modeling_nemotron_h.py``):

* ``SC = sigmoid(LG)`` are the scores; the experts are chosen on ``SB[b,i,x] = SC[b,i,x] + EB[x]``
  (``e_score_correction_bias``, a per-expert buffer of the checkpoint) and weighted by ``SC``
  (``scores.gather``), not ``SB``;
* group-limited choice (``n_group`` groups of ``E = n_experts/n_group`` consecutive experts, the
  ``topk_group`` best groups kept): with ranks ``G``/``H`` (groups) and ``E``/``Z`` (experts of a
  group) ``NBG[b,i,g,e] = step(SB[b,i,g*E+z] - SB[b,i,g*E+e])``, ``TOP2 = step(2 - NBG)`` (the
  group's two best: ``.topk(2, dim=-1)``), the group score ``GS[b,i,g] = SB[b,i,g*E+e]*TOP2``,
  ``NG[b,i,g] = step(GS[b,i,h] - GS[b,i,g])``, ``GSEL = step(topkg - NG)``, and the kept groups
  per expert ``GX[b,i,x] = GSEL[b,i,g]*GM[g,x]`` (``GM``: the constant one-hot group of each
  expert, :func:`moe_constants`); then ``NB`` counts only the kept experts scoring above
  (``step(SB[y] - SB[x])*GX[y]``) and ``SEL = step(topk - NB)*GX``. With ``topk_group =
  n_group`` (Nemotron 3 Nano: one group) every group is kept and these Einsums are left out;
* ``norm_topk_prob``: ``SW = SC*SEL``, ``LS = sum_x SW``, ``RW = SW/(LS + nfloor)*rsf``
  (``nfloor = 1e-20``, transformers' ``denominator = topk_weights.sum(...) + 1e-20``; ``rsf`` is
  ``routed_scaling_factor``, absent when 1); without it ``RW = SC*SEL*rsf``;
* experts without a gate: ``UP``, ``RU = relu(UP)``, ``HM = RU*RU`` (``relu2``), ``EO``, ``MO``;
  with ``latent_size`` (``moe_latent_size``) the experts work in a latent width ``A``:
  ``XL[b,i,a] = XN[b,i,d]*WL1[d,a]`` (``fc1_latent_proj``) before them and
  ``LO[b,i,d] = MO[b,i,a]*WL2[a,d]`` (``fc2_latent_proj``) after, while the router and the
  shared MLP read ``XN``;
* the shared MLP (``shared_experts``, always present) is ``relu2`` too: ``SU``, ``SR``, ``SH``, ``SO``;
  ``XO = X + MO + SO`` (``LO`` for ``MO`` with the latent projections).

The router weight and the correction bias are float32 in transformers
(``_keep_in_fp32_modules_strict``); the cascade gives them the layer's width like every tensor
(a precision policy can widen them).

What the IR needed: one unary function, ``step`` (Heaviside), for the two comparisons of the
top-k selection; the pairwise count is an ordinary reduction over a second expert rank ``Y``.
Ties between logits at the k-th place would select both (``torch.topk`` picks one); with
real-valued logits they have probability zero.

**Cost.** The executor runs the dense form and gives transformers' values. The cost model must
not charge the dense form's zero work: the Einsums of the ``experts`` region (``GT``, ``UP``,
``HM``, ``EO``, ``MO``; ``UP``, ``RU``, ``HM``, ``EO``, ``MO`` for ``relu2`` experts) run for
``topk`` of the ``n_experts`` experts per token, so their operations and the traffic of their
per-expert tensors are ``topk/n_experts`` of the dense form's, and an expert's weights are read
once per pass if it receives any token (:mod:`mambalaya.einsum.routing`). How many tokens each expert gets is the named assumption
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

import numpy as np
from pydantic import BaseModel, BeforeValidator, Field, PositiveInt, model_validator

from mambalaya.specio import SPEC_MODEL_CONFIG, list_as_tuple

from mambalaya.errors import SpecError
from mambalaya.einsum.cascade import Cascade, build_cascade
from mambalaya.einsum.routing import experts_reached
from mambalaya.einsum.ir import Rank, Role, TensorSpec
from mambalaya.einsum.parse import parse_einsum
from mambalaya.workloads.checks import check_layer_args, validated_config

Router = Literal["softmax-topk", "topk-softmax", "sigmoid-topk"]
ExpertMLP = Literal["gated-silu", "relu2"]
#: The region of the routed (per-expert) Einsums: gated SiLU experts, then ``relu2`` experts.
EXPERTS_REGION: tuple[str, ...] = ("GT", "UP", "HM", "EO", "MO")
RELU2_EXPERTS_REGION: tuple[str, ...] = ("UP", "RU", "HM", "EO", "MO")
#: The normaliser's floor of the sigmoid router: transformers 5.25 ``NemotronHTopkRouter.forward``,
#: ``denominator = topk_weights.sum(dim=-1, keepdim=True) + 1e-20``.
NORM_FLOOR = 1e-20
Routing = Union[Literal["uniform"], Annotated[tuple[float, ...], BeforeValidator(list_as_tuple)]]


class MoEConfig(BaseModel):
    """One MoE feed-forward block: ``d_model`` [hidden_size], ``d_ff`` [intermediate_size, per
    expert], ``n_experts`` [num_experts / num_local_experts / n_routed_experts], ``top_k``
    [num_experts_per_tok], ``router`` (how experts are chosen and weighted), ``shared_d_ff``
    [shared_intermediate_size; None: no shared MLP], ``residual_multiplier``, ``norm_eps``
    [rms_norm_eps] and ``routing`` (the cost model's token-per-expert assumption).

    ``expert_mlp``: ``gated-silu`` (``silu(gate)*up``; Jamba, Granite) or ``relu2``
    (``relu(up)^2``, no gate; Nemotron-H), for the experts and the shared MLP alike. The
    ``sigmoid-topk`` router (Nemotron-H) alone reads ``n_group``, ``topk_group``,
    ``norm_topk_prob`` and ``routed_scaling_factor``; ``latent_size`` [moe_latent_size] puts the
    experts in a latent width between two projections (see the module doc)."""

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
    expert_mlp: ExpertMLP = "gated-silu"
    n_group: PositiveInt = 1
    topk_group: PositiveInt = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    latent_size: PositiveInt | None = None

    @model_validator(mode="after")
    def _fits(self) -> "MoEConfig":
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k = {self.top_k} exceeds n_experts = {self.n_experts}: a token cannot pick "
                             "more experts than there are")
        if self.router == "sigmoid-topk":
            self._groups_fit()
        else:
            sigmoid_only = {"n_group": 1, "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 1.0}
            for key, default in sigmoid_only.items():
                if getattr(self, key) != default:
                    raise ValueError(f"{key} = {getattr(self, key)!r} acts only in the sigmoid-topk router "
                                     f"(Nemotron-H's); the {self.router} router has none")
        if self.routing != "uniform":
            check_histogram(list(self.routing), self.n_experts, self.top_k, "routing")
        return self

    def _groups_fit(self) -> None:
        """What ``NemotronHTopkRouter.forward`` needs: the experts split into ``n_group`` equal
        groups (``view(-1, n_group, n_experts // n_group)``) of at least two (``.topk(2)``),
        ``topk_group`` of them kept (``torch.topk(group_scores, k=topk_group)``), and enough
        experts in the kept groups for ``top_k`` (else ``torch.topk`` picks masked experts)."""
        n, g = self.n_experts, self.n_group
        if n % g or n // g < 2:
            raise ValueError(f"n_group = {g} does not split n_experts = {n} into equal groups of at least two "
                             "experts (the router scores each group by its two best experts)")
        if self.topk_group > g:
            raise ValueError(f"topk_group = {self.topk_group} exceeds n_group = {g}: the router cannot keep more "
                             "groups than there are")
        if self.top_k > self.topk_group * (n // g):
            raise ValueError(f"top_k = {self.top_k} exceeds the {self.topk_group * (n // g)} experts of the "
                             f"topk_group = {self.topk_group} groups kept: the router would pick experts it masked")

    @property
    def group_limited(self) -> bool:
        """Whether the router keeps only some groups (``topk_group < n_group``)."""
        return self.router == "sigmoid-topk" and self.topk_group < self.n_group

    @property
    def expert_width(self) -> int:
        """The width the experts read and write: ``latent_size``, else ``d_model``."""
        return self.latent_size or self.d_model

    def _weights(self, experts: int) -> int:
        d, per = self.d_model, 3 if self.expert_mlp == "gated-silu" else 2  # gate (gated only), up, down
        shared = per * d * self.shared_d_ff if self.shared_d_ff else 0
        latent = 2 * d * self.latent_size if self.latent_size else 0  # fc1_latent_proj, fc2_latent_proj
        return d + d * self.n_experts + experts * per * self.expert_width * self.d_ff + shared + latent

    def layer_parameters(self) -> int:
        """Weight elements: the norm, the router, every expert's projections, the shared MLP and
        the latent projections (the sigmoid router's correction bias is a buffer, not a parameter
        in transformers' count, and is left out)."""
        return self._weights(self.n_experts)

    def active_parameters(self) -> int:
        """Weight elements one token uses: as :meth:`layer_parameters` with ``top_k`` experts."""
        return self._weights(self.top_k)

    def experts_read(self, tokens: int) -> int:
        """Experts whose weights one pass over ``tokens`` tokens reads (the module doc's rule)."""
        if self.routing == "uniform":
            return min(self.n_experts, tokens * self.top_k)
        return experts_reached(self.routing, tokens, self.top_k)


def check_histogram(values: list, n_experts: int, top_k: int, field: str) -> tuple[float, ...]:
    """A routing histogram a top-``top_k`` router can produce: one non-negative fraction of the
    token-expert assignments per expert, summing to 1, none above ``1/top_k`` (a token picks
    ``top_k`` distinct experts, so an expert receives at most one of each token's ``top_k``
    assignments; it follows that at least ``top_k`` experts receive tokens)."""
    if not isinstance(values, list) or not values:
        raise ValueError(f"{field} must be a list of per-expert token fractions")
    for k, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:  # (NaN fails too)
            shown = repr(v) if len(repr(v)) <= 40 else f"a number of {len(repr(v))} digits"
            raise ValueError(f"{field}[{k}] is {shown}; a token fraction is a number from 0 to 1")
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
    ]
    lines += _sigmoid_router(config, o) if config.router == "sigmoid-topk" else _softmax_router(config, o)
    lines += _experts(config, o)
    out = f"{'LO' if config.latent_size else 'MO'}[b,{o},d]"
    if config.shared_d_ff:
        lines += _shared_mlp(config, o)
        out = f"({out} + SO[b,{o},d])"
    scaled = out if config.residual_multiplier == 1 else f"{out}*rm"
    lines.append(f"XO[b,{o},d] = X[b,{o},d] + {scaled}")
    return lines


def _softmax_router(config: MoEConfig, o: str) -> list[str]:
    """Jamba's and Granite 4's routers: the top-k of the logits, then a softmax (module doc)."""
    lines = [
        f"LM[b,{o}] max= LG[b,{o},x]",
        f"LE[b,{o},x] = exp(LG[b,{o},x] - LM[b,{o}])",
        f"NB[b,{o},x] = step(LG[b,{o},y] - LG[b,{o},x])",
        f"SEL[b,{o},x] = step(topk - NB[b,{o},x])",
    ]
    if config.router == "softmax-topk":
        return lines + [f"LS[b,{o}] = LE[b,{o},x]", f"RW[b,{o},x] = LE[b,{o},x]*SEL[b,{o},x]/LS[b,{o}]"]
    return lines + [f"SE[b,{o},x] = LE[b,{o},x]*SEL[b,{o},x]", f"LS[b,{o}] = SE[b,{o},x]",
                    f"RW[b,{o},x] = SE[b,{o},x]/LS[b,{o}]"]


def _sigmoid_router(config: MoEConfig, o: str) -> list[str]:
    """Nemotron-H's router (``NemotronHTopkRouter``): sigmoid scores, the choice on the scores
    plus the correction bias within the kept groups, the weights from the scores (module doc)."""
    lines = [f"SC[b,{o},x] = sigmoid(LG[b,{o},x])", f"SB[b,{o},x] = SC[b,{o},x] + EB[x]"]
    if config.group_limited:
        lines += [
            f"NBG[b,{o},g,e] = step(SB[b,{o},g*E+z] - SB[b,{o},g*E+e])",
            f"TOP2[b,{o},g,e] = step(2 - NBG[b,{o},g,e])",
            f"GS[b,{o},g] = SB[b,{o},g*E+e]*TOP2[b,{o},g,e]",
            f"NG[b,{o},g] = step(GS[b,{o},h] - GS[b,{o},g])",
            f"GSEL[b,{o},g] = step(topkg - NG[b,{o},g])",
            f"GX[b,{o},x] = GSEL[b,{o},g]*GM[g,x]",
            f"NB[b,{o},x] = step(SB[b,{o},y] - SB[b,{o},x])*GX[b,{o},y]",
            f"SEL[b,{o},x] = step(topk - NB[b,{o},x])*GX[b,{o},x]",
        ]
    else:
        lines += [f"NB[b,{o},x] = step(SB[b,{o},y] - SB[b,{o},x])", f"SEL[b,{o},x] = step(topk - NB[b,{o},x])"]
    scale = "" if config.routed_scaling_factor == 1 else "*rsf"
    if not config.norm_topk_prob:
        return lines + [f"RW[b,{o},x] = SC[b,{o},x]*SEL[b,{o},x]{scale}"]
    return lines + [f"SW[b,{o},x] = SC[b,{o},x]*SEL[b,{o},x]", f"LS[b,{o}] = SW[b,{o},x]",
                    f"RW[b,{o},x] = SW[b,{o},x]/(LS[b,{o}] + nfloor){scale}"]


def _experts(config: MoEConfig, o: str) -> list[str]:
    """Every expert on every token, combined with the routing weights (the ``experts`` region),
    with the latent projections around them when ``latent_size`` is set."""
    w = "a" if config.latent_size else "d"
    source = "XL" if config.latent_size else "XN"
    lines = [f"XL[b,{o},a] = XN[b,{o},d]*WL1[d,a]"] if config.latent_size else []
    if config.expert_mlp == "gated-silu":
        lines += [f"GT[b,{o},x,f] = {source}[b,{o},{w}]*WG[x,{w},f]",
                  f"UP[b,{o},x,f] = {source}[b,{o},{w}]*WU[x,{w},f]",
                  f"HM[b,{o},x,f] = silu(GT[b,{o},x,f])*UP[b,{o},x,f]"]
    else:
        lines += [f"UP[b,{o},x,f] = {source}[b,{o},{w}]*WU[x,{w},f]", f"RU[b,{o},x,f] = relu(UP[b,{o},x,f])",
                  f"HM[b,{o},x,f] = RU[b,{o},x,f]*RU[b,{o},x,f]"]
    lines += [f"EO[b,{o},x,{w}] = HM[b,{o},x,f]*WDN[x,f,{w}]", f"MO[b,{o},{w}] = EO[b,{o},x,{w}]*RW[b,{o},x]"]
    if config.latent_size:
        lines.append(f"LO[b,{o},d] = MO[b,{o},a]*WL2[a,d]")
    return lines


def _shared_mlp(config: MoEConfig, o: str) -> list[str]:
    """The always-on shared MLP (Granite 4's gated one, Nemotron-H's ``relu2`` one)."""
    if config.expert_mlp == "gated-silu":
        return [f"SG[b,{o},v] = XN[b,{o},d]*WSG[d,v]", f"SU[b,{o},v] = XN[b,{o},d]*WSU[d,v]",
                f"SH[b,{o},v] = silu(SG[b,{o},v])*SU[b,{o},v]", f"SO[b,{o},d] = SH[b,{o},v]*WSD[v,d]"]
    return [f"SU[b,{o},v] = XN[b,{o},d]*WSU[d,v]", f"SR[b,{o},v] = relu(SU[b,{o},v])",
            f"SH[b,{o},v] = SR[b,{o},v]*SR[b,{o},v]", f"SO[b,{o},d] = SH[b,{o},v]*WSD[v,d]"]


_W, _X = Role.WEIGHT, Role.INTERMEDIATE
_TENSORS: dict[str, tuple[tuple[str, ...], Role, str]] = {
    "X": (("B", "*", "D"), Role.INPUT, "block input (residual stream)"),
    "WN": (("D",), _W, "pre-feed-forward RMSNorm weight"),
    "SS": (("B", "*"), _X, "sum of squares"),
    "RS": (("B", "*"), _X, "reciprocal RMS"),
    "XN": (("B", "*", "D"), _X, "normalised input"),
    "WR": (("D", "X"), _W, "router weight"),
    "LG": (("B", "*", "X"), _X, "router logits"),
    "SC": (("B", "*", "X"), _X, "sigmoid scores"),
    "EB": (("X",), _W, "score correction bias (e_score_correction_bias)"),
    "SB": (("B", "*", "X"), _X, "scores for the choice (score + correction bias)"),
    "NBG": (("B", "*", "G", "E"), _X, "experts of the group scoring above this one"),
    "TOP2": (("B", "*", "G", "E"), _X, "1 for the group's two best experts, else 0"),
    "GS": (("B", "*", "G"), _X, "group score (sum of its two best)"),
    "NG": (("B", "*", "G"), _X, "groups scoring above this one"),
    "GSEL": (("B", "*", "G"), _X, "1 for the topk_group groups kept, else 0"),
    "GM": (("G", "X"), Role.INPUT, "constant: 1 where expert x is in group g"),
    "GX": (("B", "*", "X"), _X, "1 for the experts of the kept groups, else 0"),
    "LM": (("B", "*"), _X, "largest logit"),
    "LE": (("B", "*", "X"), _X, "exp(logit - max)"),
    "NB": (("B", "*", "X"), _X, "experts scoring above this one"),
    "SEL": (("B", "*", "X"), _X, "1 for the top-k experts, else 0"),
    "SE": (("B", "*", "X"), _X, "exp of the selected logits"),
    "SW": (("B", "*", "X"), _X, "scores of the selected experts"),
    "LS": (("B", "*"), _X, "softmax denominator"),
    "RW": (("B", "*", "X"), _X, "routing weights (0 for unselected experts)"),
    "WL1": (("D", "A"), _W, "fc1_latent_proj (hidden to latent)"),
    "XL": (("B", "*", "A"), _X, "the experts' input in the latent width"),
    "WG": (("X", "D", "F"), _W, "experts' gate projections"),
    "WU": (("X", "D", "F"), _W, "experts' up projections"),
    "GT": (("B", "*", "X", "F"), _X, "expert gate pre-activation"),
    "UP": (("B", "*", "X", "F"), _X, "expert up projection"),
    "RU": (("B", "*", "X", "F"), _X, "relu(up)"),
    "HM": (("B", "*", "X", "F"), _X, "silu(gate) x up"),
    "WDN": (("X", "F", "D"), _W, "experts' down projections"),
    "EO": (("B", "*", "X", "D"), _X, "expert outputs"),
    "MO": (("B", "*", "D"), _X, "routing-weighted sum of the expert outputs"),
    "WL2": (("A", "D"), _W, "fc2_latent_proj (latent to hidden)"),
    "LO": (("B", "*", "D"), _X, "the experts' sum projected back to the hidden width"),
    "WSG": (("D", "V"), _W, "shared MLP gate half of input_linear"),
    "WSU": (("D", "V"), _W, "shared MLP up half of input_linear"),
    "SG": (("B", "*", "V"), _X, "shared gate pre-activation"),
    "SU": (("B", "*", "V"), _X, "shared up projection"),
    "SR": (("B", "*", "V"), _X, "shared relu(up)"),
    "SH": (("B", "*", "V"), _X, "shared silu(gate) x up"),
    "WSD": (("V", "D"), _W, "shared MLP output_linear"),
    "SO": (("B", "*", "D"), _X, "shared MLP output"),
    "XO": (("B", "*", "D"), Role.OUTPUT, "block output (residual stream)"),
}
#: The descriptions that differ for ``relu2`` experts and shared MLP.
_RELU2_DESCRIPTIONS = {"HM": "relu(up)^2", "SH": "shared relu(up)^2", "WSU": "shared MLP up_proj",
                       "WSD": "shared MLP down_proj"}
#: The tensors whose ``D`` is the experts' width (``A`` with latent projections).
_EXPERT_WIDTH = frozenset({"WG", "WU", "WDN", "EO", "MO"})


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
    ranks += _nemotron_ranks(c)
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
    params.update(_sigmoid_params(c))
    tensors = []
    for t, (rk, role, d) in _TENSORS.items():
        if t in made or (role != _X and _weight_used(t, lines)):
            if c.latent_size and t in _EXPERT_WIDTH:
                rk = tuple("A" if part == "D" else part for part in rk)
            ranks_t = tuple(r for part in rk for r in (at if part == "*" else (part,)))
            if c.expert_mlp == "relu2":
                d = _RELU2_DESCRIPTIONS.get(t, d)
            tensors.append(TensorSpec(t, ranks_t, role, bits, description=d))
    routing = "uniform" if c.routing == "uniform" else "histogram"
    region = EXPERTS_REGION if c.expert_mlp == "gated-silu" else RELU2_EXPERTS_REGION
    return build_cascade(
        name=name or f"moe-{phase}",
        params=params,
        ranks=ranks,
        tensors=tensors,
        einsums=[parse_einsum(line, sizes=sizes) for line in lines],
        description=f"mixture-of-experts block, {phase}, hidden {c.d_model}, {c.n_experts} experts of {c.d_ff}, "
        f"top-{c.top_k} ({c.router}{_router_text(c)}), shared {c.shared_d_ff or 0}, batch={batch}, I={positions}, "
        f"routing {routing}: {params['moe_experts_read']} experts read",
        regions={"experts": region},
    )


def _nemotron_ranks(config: MoEConfig) -> list[Rank]:
    """The latent width ``A`` and the group ranks ``G``, ``H``, ``E``, ``Z`` where used."""
    ranks = [Rank("A", config.latent_size, "moe_latent_size")] if config.latent_size else []
    if config.group_limited:
        per_group = config.n_experts // config.n_group
        ranks += [Rank("G", config.n_group, "n_group"), Rank("H", config.n_group, "n_group"),
                  Rank("E", per_group, "num_experts/n_group"), Rank("Z", per_group, "num_experts/n_group")]
    return ranks


def _sigmoid_params(config: MoEConfig) -> dict[str, float]:
    """The sigmoid router's scalars its Einsums name (none for the softmax routers)."""
    if config.router != "sigmoid-topk":
        return {}
    params: dict[str, float] = {}
    if config.group_limited:
        params["topkg"] = config.topk_group
    if config.norm_topk_prob:
        params["nfloor"] = NORM_FLOOR
    if config.routed_scaling_factor != 1:
        params["rsf"] = config.routed_scaling_factor
    return params


def _router_text(config: MoEConfig) -> str:
    if config.router != "sigmoid-topk":
        return ""
    groups = f", {config.topk_group} of {config.n_group} groups" if config.group_limited else ""
    latent = f", latent {config.latent_size}" if config.latent_size else ""
    return (f"{groups}, {'normalised' if config.norm_topk_prob else 'not normalised'}, scaled "
            f"{config.routed_scaling_factor:g}, {config.expert_mlp} experts{latent}")


def moe_constants(cascade: Cascade) -> dict[str, np.ndarray]:
    """The constant inputs of a MoE cascade (float64): ``{"GM": [G, X]}``, 1 where expert ``x``
    is in group ``g`` (the groups are consecutive experts: ``view(-1, n_group, n_experts //
    n_group)``), for a group-limited sigmoid router; ``{}`` otherwise."""
    if "GM" not in cascade.tensors:
        return {}
    groups, experts = cascade.shape("GM")
    return {"GM": np.kron(np.eye(groups), np.ones((1, experts // groups)))}


def _weight_used(tensor: str, lines: list[str]) -> bool:
    return any(f"{tensor}[" in line.split("=", 1)[1] for line in lines)


__all__ = ["EXPERTS_REGION", "NORM_FLOOR", "RELU2_EXPERTS_REGION", "MoEConfig", "check_histogram",
           "load_routing_histogram", "moe_constants", "moe_layer", "parse_moe_config"]
