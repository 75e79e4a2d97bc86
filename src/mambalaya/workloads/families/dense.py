"""The dense hybrid families' presets, and every hybrid family's config.json reader in one table
(:data:`HYBRID_READERS`) that :func:`hybrid_config_from_hf` dispatches on by ``model_type``.

The layer-type strings of transformers overlap between families (``linear_attention`` is a
Mamba-2 layer in Nemotron-H and Bamba but a Gated DeltaNet layer in OLMo-Hybrid), so a
config.json is read by the reader of its ``model_type`` and by no other; a ``model_type`` no
reader of mambalaya takes is refused by name.

The dispatch lives here, after every family module (each imports the blocks and the family base,
never this module), so no family module needs to know the others.
"""

from __future__ import annotations

from typing import Any, Callable

from mambalaya.errors import SpecError
from mambalaya.workloads.families.bamba import bamba_config_from_hf
from mambalaya.workloads.families.falcon_h1 import PRESETS as FALCON_H1_PRESETS
from mambalaya.workloads.families.falcon_h1 import falcon_h1_config_from_hf
from mambalaya.workloads.families.base import FamilyModel
from mambalaya.workloads.hf.config_moe import moe_config_from_hf
from mambalaya.workloads.hf.fields import shown
from mambalaya.workloads.families.nemotron_h import PRESETS as NEMOTRON_H_PRESETS
from mambalaya.workloads.families.nemotron_h import nemotron_h_config_from_hf
from mambalaya.workloads.families.olmo_hybrid import PRESETS as OLMO_HYBRID_PRESETS
from mambalaya.workloads.families.olmo_hybrid import olmo_hybrid_config_from_hf
from mambalaya.workloads.families.zamba2 import PRESETS as ZAMBA2_PRESETS
from mambalaya.workloads.families.zamba2 import zamba2_config_from_hf

#: Every dense family's preset, by name.
FAMILY_PRESETS: dict[str, FamilyModel] = {**NEMOTRON_H_PRESETS, **OLMO_HYBRID_PRESETS, **FALCON_H1_PRESETS,
                                         **ZAMBA2_PRESETS}

#: ``model_type`` -> the reader of that dense family's config.json.
READERS: dict[str, Callable[..., FamilyModel]] = {"nemotron_h": nemotron_h_config_from_hf,
                                                  "falcon_h1": falcon_h1_config_from_hf, "zamba2": zamba2_config_from_hf,
                                                  "olmo_hybrid": olmo_hybrid_config_from_hf}

#: ``model_type`` -> the reader of that mixture-of-experts hybrid family's config.json (one reader
#: for both, :func:`~mambalaya.workloads.hf.config_moe.moe_config_from_hf`).
MOE_READERS: dict[str, Callable[..., Any]] = {"jamba": moe_config_from_hf, "granitemoehybrid": moe_config_from_hf}

#: ``model_type`` -> the reader of that hybrid family's transformers config.json: the one table
#: :func:`hybrid_config_from_hf` (and through it ``load_model_config``) dispatches on.
HYBRID_READERS: dict[str, Callable[..., Any]] = {"bamba": bamba_config_from_hf, **MOE_READERS, **READERS}

#: The model types of transformers' Mamba-1 and Mamba-2 config.json files: not hybrid, read by
#: :func:`~mambalaya.workloads.load_model_config`.
MAMBA_MODEL_TYPES: tuple[str, ...] = ("mamba", "mamba2")


def hybrid_config_from_hf(data: dict, *, source: str = "config.json") -> Any:
    """The model of a transformers ``config.json`` (as a dict) of any hybrid family, read by the
    reader of its ``model_type`` (:data:`HYBRID_READERS`): ``bamba`` (a :class:`HybridConfig`;
    also a config without ``model_type``, or with a null one, as this function read before it
    dispatched), ``jamba`` and ``granitemoehybrid`` (a
    :class:`~mambalaya.workloads.families.jamba_granite.MoEHybridConfig`), ``nemotron_h``,
    ``falcon_h1``, ``zamba2`` and ``olmo_hybrid`` (a
    :class:`~mambalaya.workloads.families.base.FamilyModel`). A ``model_type`` no hybrid reader
    takes is one SpecError naming the field and listing the ones read."""
    if not isinstance(data, dict):
        raise SpecError(f"a model config is a mapping of fields to values, not {shown(data)}", source=source)
    model_type: Any = "bamba" if data.get("model_type") is None else data["model_type"]
    reader = HYBRID_READERS.get(model_type) if isinstance(model_type, str) else None
    if reader is None:
        read = ", ".join(repr(t) for t in sorted(HYBRID_READERS))
        raise SpecError(f"field model_type is {shown(model_type)}, not a hybrid family mambalaya reads: "
                        f"hybrid_config_from_hf reads {read} (a config without model_type, or with a null one, as "
                        "'bamba'), and load_model_config also reads Mamba-1 and Mamba-2 configs "
                        f"({', '.join(repr(t) for t in MAMBA_MODEL_TYPES)})", source=source)
    return reader(data, source=source)




def family_config_from_hf(data: dict, *, source: str = "config.json") -> Any:
    """The model of a transformers config.json of any hybrid family, read by the reader of its
    ``model_type`` (:func:`hybrid_config_from_hf`); None for
    a config that is not a hybrid family's: a Mamba-1 or Mamba-2 ``model_type``, or none (a
    state-spaces config.json, or mambalaya's own fields), which
    :func:`~mambalaya.workloads.load_model_config` reads otherwise. A ``model_type`` no reader
    takes is a SpecError naming ``model_type``."""
    if not isinstance(data, dict):
        raise SpecError(f"a model config is a mapping of fields to values, not {shown(data)}", source=source)
    model_type: Any = data.get("model_type")
    if model_type is None or model_type in MAMBA_MODEL_TYPES:
        return None
    return hybrid_config_from_hf(data, source=source)


__all__ = ["FAMILY_PRESETS", "HYBRID_READERS", "MAMBA_MODEL_TYPES", "MOE_READERS", "READERS", "family_config_from_hf",
           "hybrid_config_from_hf"]
