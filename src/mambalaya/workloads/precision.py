"""Precision policies: the width of every tensor of a Mamba layer, as data with sources.

A real Mamba implementation does not keep every tensor at one width: the reference code paths
keep the step size after softplus, ``A``, the discretised tensors and the scan state in
float32 while activations and weights are 16-bit. A :class:`PrecisionPolicy` says which, per
model family, and where each decision comes from. It is a YAML file::

    name: reference-kernels
    description: what the reference implementations compute in
    default: design          # every tensor not named: the design's width (bits_per_element)
    roles: {weight: design}  # optional: a width per tensor role
    families:                # optional: a width per tensor name, per model family
      mamba1: {DELTA: 32, AD: 32, BX: 32, H: 32}
      mamba2: {DELTA: 32, ...}
    sources:                 # where each decision comes from, keyed like the entries above
      default: ...
      mamba1.DELTA: "transformers models/mamba/modeling_mamba.py, MambaMixer.slow_forward: ..."

A width is a positive integer (bits) or ``design``. A tensor's width is its family entry if
the policy names it, else its role's entry, else ``default``. Names are checked against every
tensor of the family's cascades (prefill with and without state, decode, both Mamba-2 scan
forms): a policy naming a tensor no cascade of that family has is an error, so a typo cannot
silently leave a tensor at the default width. The unrolled form of a recurrence
(:mod:`mambalaya.einsum.unroll`) inherits the recurrent tensor's width, because policies are
applied before unrolling.

Shipped policies (``mambalaya/data/precision/*.yaml``): ``uniform`` (every tensor at the
design's width; mambalaya's behaviour before policies existed) and ``reference-kernels``.
"""

from __future__ import annotations

import os
from dataclasses import replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    model_validator,
)
from typing_extensions import Annotated

from mambalaya.einsum.cascade import Cascade
from mambalaya.einsum.ir import Role
from mambalaya.errors import SpecError
from mambalaya.arch.quantities import MAX_ELEMENT_BITS
from mambalaya.specio import FieldProblem, load_spec_text, path_is, read_spec_file

FAMILIES: tuple[str, ...] = ("mamba1", "mamba2", "bamba", "gated_deltanet")
DESIGN = "design"
#: Widths above this are refused (no datatype of interest is wider than float64).
MAX_BITS = MAX_ELEMENT_BITS

def _width(value: Any) -> Any:
    """A positive integer number of bits (at most MAX_BITS) or ``design``: one clear message."""
    if value == DESIGN:
        return value
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_BITS:
        raise ValueError(f"must be a whole number of bits from 1 to {MAX_BITS} or 'design' (got {value!r})")
    return value


Width = Annotated[Union[int, str], BeforeValidator(_width)]
Family = Literal["mamba1", "mamba2", "bamba", "gated_deltanet"]


class PrecisionPolicy(BaseModel):
    """Tensor widths by name (per family), by role, and a default; with sources."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    description: str = ""
    default: Width = DESIGN
    roles: dict[Role, Width] = Field(default_factory=dict)
    families: dict[Family, dict[str, Width]] = Field(default_factory=dict)
    sources: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _names_are_tensors(self, info: ValidationInfo) -> "PrecisionPolicy":
        # a shipped policy's names are checked by the test suite (:data:`SHIPPED`)
        families = {} if info.context and info.context.get(SHIPPED) else self.families
        for family, entries in families.items():
            known = family_tensor_names(family)
            for tensor in entries:
                if tensor not in known:
                    raise FieldProblem(
                        f"families.{family}.{tensor}",
                        f"names no tensor of a {family} layer (its tensors: {', '.join(sorted(known))})",
                    )
        keys = {"default"} | {f"roles.{r.value}" for r in self.roles}
        keys |= {f"{f}.{t}" for f, entries in self.families.items() for t in entries}
        for key in self.sources:
            if key not in keys:
                raise FieldProblem(f"sources.{key}", f"names no entry of the policy (entries: {', '.join(sorted(keys))})")
        return self

    # -- queries ------------------------------------------------------------------------------
    def rule(self, family: str, tensor: str, role: Role) -> tuple[str, Width]:
        """The entry that sets ``tensor``'s width: ``(key, width)`` with key ``family.tensor``,
        ``roles.role`` or ``default``."""
        entries = self.families.get(family, {})  # type: ignore[call-overload]
        if tensor in entries:
            return f"{family}.{tensor}", entries[tensor]
        if role in self.roles:
            return f"roles.{role.value}", self.roles[role]
        return "default", self.default

    def bits(self, family: str, tensor: str, role: Role, design_bits: int) -> int:
        width = self.rule(family, tensor, role)[1]
        return design_bits if width == DESIGN else int(width)

    def is_uniform(self) -> bool:
        """True when every tensor takes the same width (the design's or one number)."""
        widths = {self.default, *self.roles.values(), *(w for e in self.families.values() for w in e.values())}
        return len(widths) == 1


def family_tensor_names(family: str) -> frozenset[str]:
    """Every tensor name of the layers whose widths ``family``'s entries set: every form of every
    shipped model family's layers of that precision family
    (:func:`~mambalaya.workloads.shipped.shipped_layers`: prefill with and without state, decode,
    both scan forms, every softmax form; the ``bamba`` entries set Bamba's, the mixture-of-experts
    hybrids' and the dense hybrid families' attention, Mamba and MLP layers)."""
    names = _tensor_names_by_family()
    if family not in names:
        raise SpecError(f"unknown model family {family!r} (known: {', '.join(FAMILIES)})")
    return names[family]


@lru_cache(maxsize=1)
def _tensor_names_by_family() -> dict[str, frozenset[str]]:
    from mambalaya.workloads.shipped import shipped_layers

    names: dict[str, set[str]] = {family: set() for family in FAMILIES}
    for layer in shipped_layers():  # 256: a multiple of every preset's chunk size
        names[layer.precision_family] |= set(layer.cascade.tensors)
    return {family: frozenset(found) for family, found in names.items()}


# ---------------------------------------------------------------------------------------------
# loading

_DATA = "data/precision"


def shipped_policies() -> list[str]:
    folder = resources.files("mambalaya").joinpath(_DATA)
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


#: Validation context of a shipped policy: its tensor names are checked against the layers'
#: cascades by the test suite (tests/test_precision.py), not each time it is loaded: building
#: every form of every shipped family's layers for that takes about 3 s (a policy file of the
#: user's pays it once per process).
SHIPPED = "shipped: tensor names checked by the tests"


@lru_cache(maxsize=32)
def _load_shipped(name: str) -> PrecisionPolicy:
    return loads_policy(shipped_policy_text(name), source=f"{name}.yaml (shipped precision policy)", shipped=True)


def shipped_policy_text(name: str) -> str:
    return resources.files("mambalaya").joinpath(_DATA, f"{name}.yaml").read_text(encoding="utf-8")


def load_policy(name_or_path: str | os.PathLike[str] | PrecisionPolicy) -> PrecisionPolicy:
    """A shipped policy by name (``uniform``, ``reference-kernels``) or a YAML file by path."""
    if isinstance(name_or_path, PrecisionPolicy):
        return name_or_path
    text = str(name_or_path)
    if not isinstance(name_or_path, os.PathLike) and text in shipped_policies():
        return _load_shipped(text)
    path = Path(name_or_path)
    if not path_is(path, "any"):  # (a directory or a device is read_spec_file's to name)
        raise SpecError(
            f"unknown precision policy {text!r}: use a shipped one ({', '.join(shipped_policies())}) "
            "or the path of a policy YAML file"
        )
    return loads_policy(read_spec_file(str(path), "precision policy"), source=str(path))


def loads_policy(text: str, *, source: str = "<string>", shipped: bool = False) -> PrecisionPolicy:
    """A policy from YAML text; a ``shipped`` one's tensor names are left to the tests
    (:data:`SHIPPED`)."""
    return load_spec_text(text, PrecisionPolicy, what="precision policy",
                          fields="name, default, roles, families, sources", source=source,
                          context={SHIPPED: True} if shipped else None)


# ---------------------------------------------------------------------------------------------
# applying


def cascade_family(cascade: Cascade) -> str:
    """``mamba1``, ``mamba2``, ``bamba`` or ``gated_deltanet``, from the cascade's tensors (a
    hybrid layer has its MLP block, prefixed ``FF_``; an attention block has scores ``SC``, an
    MLP block ``HM``; a Gated DeltaNet layer has the write strength ``BETA`` and normalised keys
    ``KN``; Mamba-2 has heads: rank ``G``)."""
    if {"FF_XO", "SC", "HM"} & set(cascade.tensors):  # a hybrid layer, or its attention or MLP block alone
        return "bamba"
    if {"BETA", "KN"} <= set(cascade.tensors):
        return "gated_deltanet"
    return "mamba2" if "G" in cascade.ranks and "P" in cascade.ranks else "mamba1"


def apply_policy(cascade: Cascade, policy: PrecisionPolicy | str, design_bits: int, family: str | None = None) -> Cascade:
    """``cascade`` with every tensor's width set by ``policy`` (``design`` = ``design_bits``)."""
    policy = load_policy(policy)
    family = family or cascade_family(cascade)
    if policy.families and family not in policy.families:  # its tensor entries would set nothing here
        raise SpecError(f"precision policy {policy.name!r} gives tensor widths for the "
                        f"{', '.join(policy.families)} famil{'y' if len(policy.families) == 1 else 'ies'}, but layer "
                        f"{cascade.name!r} takes the {family} family's entries (its model's precision family for "
                        f"this layer type, docs/precision.md), so none of them would apply; add a '{family}:' "
                        f"entry, or use roles and default alone")
    tensors = {
        name: replace(spec, bits=policy.bits(family, name, spec.role, design_bits))
        for name, spec in cascade.tensors.items()
    }
    if all(tensors[n].bits == s.bits for n, s in cascade.tensors.items()):
        return cascade
    return replace(cascade, tensors=tensors)


def policy_rows(policy: PrecisionPolicy | str, cascade: Cascade, design_bits: int) -> list[dict[str, Any]]:
    """Per tensor of ``cascade``: its width under ``policy``, the rule that set it and its source."""
    policy = load_policy(policy)
    family = cascade_family(cascade)
    rows = []
    for name, spec in cascade.tensors.items():
        key, width = policy.rule(family, name, spec.role)
        rows.append({
            "tensor": name,
            "role": spec.role.value,
            "bits": design_bits if width == DESIGN else int(width),
            "rule": key,
            "source": policy.sources.get(key, ""),
        })
    return rows


__all__ = [
    "DESIGN",
    "FAMILIES",
    "SHIPPED",
    "PrecisionPolicy",
    "apply_policy",
    "cascade_family",
    "family_tensor_names",
    "load_policy",
    "loads_policy",
    "policy_rows",
    "shipped_policies",
    "shipped_policy_text",
]
