"""The dense hybrid families' presets and their config.json readers, dispatched on ``model_type``.

The layer-type strings of transformers overlap between families (``linear_attention`` is a
Mamba-2 layer in Nemotron-H and Bamba but a Gated DeltaNet layer in OLMo-Hybrid), so a
config.json is read by the reader of its ``model_type`` and by no other; a ``model_type`` no
reader of mambalaya takes is refused by name.
"""

from __future__ import annotations

from typing import Any, Callable

from mambalaya.errors import SpecError
from mambalaya.workloads.families.falcon_h1 import PRESETS as FALCON_H1_PRESETS
from mambalaya.workloads.families.falcon_h1 import falcon_h1_config_from_hf
from mambalaya.workloads.families.base import FamilyModel
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

#: ``model_type`` -> the reader of that family's config.json.
READERS: dict[str, Callable[..., FamilyModel]] = {"nemotron_h": nemotron_h_config_from_hf,
                                                  "falcon_h1": falcon_h1_config_from_hf, "zamba2": zamba2_config_from_hf,
                                                  "olmo_hybrid": olmo_hybrid_config_from_hf}

#: The model types other readers of mambalaya take (Mamba-1, Mamba-2, Bamba, Jamba, Granite 4).
OTHER_MODEL_TYPES: tuple[str, ...] = ("mamba", "mamba2", "bamba", "jamba", "granitemoehybrid")


def family_config_from_hf(data: dict, *, source: str = "config.json") -> FamilyModel | None:
    """The family model of a transformers config.json whose ``model_type`` is a dense family's;
    None for a model type another reader takes (or a config with none, such as a state-spaces
    one); a SpecError naming ``model_type`` for one that no reader takes."""
    if not isinstance(data, dict):
        raise SpecError(f"a model config is a mapping of fields to values, not {shown(data)}", source=source)
    model_type: Any = data.get("model_type")
    if model_type is None or model_type in OTHER_MODEL_TYPES:
        return None
    reader = READERS.get(model_type) if isinstance(model_type, str) else None
    if reader is None:
        known = sorted((*OTHER_MODEL_TYPES, *READERS))
        raise SpecError(f"field model_type is {shown(model_type)}, a model mambalaya does not model (it reads "
                        f"{', '.join(repr(t) for t in known)})", source=source)
    return reader(data, source=source)


__all__ = ["FAMILY_PRESETS", "OTHER_MODEL_TYPES", "READERS", "family_config_from_hf"]
