"""Workloads: model configurations (Mamba-1, Mamba-2 and hybrid presets, or custom) and their
layer cascades."""

from __future__ import annotations

from pathlib import Path

from mambalaya.errors import SpecError
from mambalaya.specio import parse_document_text, path_is, read_spec_file
from mambalaya.einsum.cascade import Cascade
from typing import Any

from mambalaya.workloads.blocks.mamba1 import Mamba1Config, parse_config
from mambalaya.workloads.blocks.mamba2 import Mamba2Config, parse_mamba2_config
from mambalaya.workloads.blocks.gated_deltanet import GatedDeltaNetConfig, parse_gdn_config
from mambalaya.workloads.families.bamba import HybridConfig, parse_hybrid_config
from mambalaya.workloads.families.jamba_granite import MOE_FAMILIES, MoEHybridConfig
from mambalaya.workloads.precision import PrecisionPolicy, apply_policy
from mambalaya.workloads.families.dense import READERS as CONFIG_JSON_ONLY_READERS
from mambalaya.workloads.families.dense import family_config_from_hf, hybrid_config_from_hf
from mambalaya.workloads.layers import (HYBRID_FAMILIES, PRESETS, SCAN_FORM_FAMILIES, SCANS, ModelConfig, has_scan_forms,
                                       layer_cascade, precision_family)


def load_model_config(path: str | Path) -> ModelConfig:
    """A model config from a YAML/JSON file: mambalaya's fields (``d_model``, ``n_layers``,
    ``d_state``, ...) or a transformers / state-spaces ``config.json``."""
    path = Path(path)
    text = read_spec_file(path, "model config")
    # one strict reading: duplicate keys, nesting and size bounded, every problem located
    data = parse_document_text(text, source=str(path), json_document=path.suffix == ".json")
    if not isinstance(data, dict):
        raise SpecError("a model config is a mapping of fields to values", source=str(path))
    own = _own_fields_reader(data, str(path))
    if own is not None:  # mambalaya's own fields, naming their family
        return own(data, source=str(path))
    hybrid = family_config_from_hf(data, source=str(path))  # a hybrid family's config.json, by model_type
    if hybrid is not None:
        return hybrid
    if _is_mamba2(data):
        if "d_model" not in data or "ssm_cfg" in data:
            from mambalaya.workloads.hf.weights_mamba2 import load_mamba2_config

            data = _converted(load_mamba2_config, data, path)
        return parse_mamba2_config(data, source=str(path))
    if ("d_model" not in data and ("hidden_size" in data or "model_type" in data)) or "ssm_cfg" in data \
            or "n_layer" in data:  # a transformers or a state-spaces config.json
        from mambalaya.workloads.hf.weights import load_mamba1_config

        data = _converted(load_mamba1_config, data, path)
    return parse_config(data, source=str(path))


#: The families a model file in mambalaya's own fields may name (``family``); the other hybrid
#: families are read from their transformers config.json alone.
OWN_FIELD_FAMILIES: tuple[str, ...] = ("mamba1", "mamba2", "bamba", *MOE_FAMILIES, "gated_deltanet")


def _own_fields_reader(data: dict, source: str):
    """The parser of a config in mambalaya's own fields for the hybrid and Gated DeltaNet
    families, by its ``family`` (None for a Mamba-1 or Mamba-2 config, or one without
    ``family``). A config that names both a ``family`` and a transformers ``model_type`` is read
    by its family's parser, which refuses ``model_type`` as a field it does not have. A
    ``family`` with no own fields (Nemotron-H, Falcon-H1, Zamba2, OLMo-Hybrid: their config.json
    only) or none mambalaya knows is refused by name: either was read as a Mamba-1 file and
    refused for a field it never had."""
    family = data.get("family")
    if family == "bamba":
        return parse_hybrid_config
    if family in MOE_FAMILIES:
        from mambalaya.workloads.families.jamba_granite import parse_moe_hybrid_config

        return parse_moe_hybrid_config
    if family == "gated_deltanet":
        return parse_gdn_config
    if family is None or family in ("mamba1", "mamba2"):
        return None
    if isinstance(family, str) and family in CONFIG_JSON_ONLY_READERS:
        presets = ", ".join(n for n, m in PRESETS.items() if getattr(m, "family", None) == family)
        raise SpecError(f"field family is {family!r}, a family mambalaya reads from its transformers config.json "
                        f"(model_type: {family}, with transformers' field names), not from its own fields "
                        f"({', '.join(OWN_FIELD_FAMILIES)}); give that config.json or a preset ({presets})",
                        source=source)
    raise SpecError(f"field family is {family!r}, not a family mambalaya reads: its own fields name one of "
                    f"{', '.join(OWN_FIELD_FAMILIES)}, and a transformers config.json names its model_type "
                    f"({', '.join(sorted(CONFIG_JSON_ONLY_READERS))} are read that way alone)", source=source)


def _converted(loader, data: dict, path: Path) -> dict:
    """A transformers / state-spaces config in mambalaya's fields; errors name the file."""
    from mambalaya.workloads.hf.weights import WeightLoadError

    try:
        return loader(data)
    except WeightLoadError as err:
        raise SpecError(str(err).replace("the config dict", "the config"), source=str(path)) from None


def _is_mamba2(data: dict) -> bool:
    ssm = data.get("ssm_cfg") if isinstance(data.get("ssm_cfg"), dict) else {}
    return (
        data.get("family") == "mamba2"
        or data.get("model_type") == "mamba2"
        or ssm.get("layer") == "Mamba2"
        or any(k in data for k in ("headdim", "head_dim", "ngroups", "n_groups", "chunk_size"))
    )


def resolve_model(name_or_path: str) -> ModelConfig:
    """A preset by name, or a config file by path."""
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    if Path(name_or_path).suffix in (".yaml", ".yml", ".json") or path_is(name_or_path):
        return load_model_config(name_or_path)
    raise SpecError(
        f"unknown model {name_or_path!r}: use a preset ({', '.join(PRESETS)}) or the path of a "
        "YAML/JSON model config"
    )


def build_layer(model: ModelConfig, *, phase: str, seq_len: int, batch: int, bits: int = 16,
                precision: "str | PrecisionPolicy | None" = None, layer_type: str | None = None,
                **forms: Any) -> Cascade:
    """One layer of ``model`` as a cascade (:func:`~mambalaya.workloads.layers.layer_cascade`:
    ``layer_type``, ``state_io``, ``name``, ``scan``, ``softmax``, ``chunk_size`` and
    ``key_block`` as there), with ``precision`` (a policy name, file or :class:`PrecisionPolicy`)
    setting each tensor's width, ``design`` widths being ``bits``, by the entries of the layer's
    family (:func:`~mambalaya.workloads.layers.precision_family`); without it every tensor is
    ``bits`` wide (``uniform``)."""
    cascade = layer_cascade(model, phase=phase, seq_len=seq_len, batch=batch, bits=bits, layer_type=layer_type,
                            **forms)
    if precision is None:
        return cascade
    return apply_policy(cascade, precision, bits, family=precision_family(model, layer_type))


__all__ = ["HYBRID_FAMILIES", "PRESETS", "SCANS", "SCAN_FORM_FAMILIES", "MoEHybridConfig", "GatedDeltaNetConfig", "HybridConfig", "Mamba1Config", "Mamba2Config", "ModelConfig", "build_layer",
           "has_scan_forms", "hybrid_config_from_hf", "load_model_config", "resolve_model"]
