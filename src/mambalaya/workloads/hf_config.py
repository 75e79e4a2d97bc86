"""Reading a transformers ``config.json`` for the weight loaders: the file itself, its numbers and
switches checked by name, its fields audited against what mambalaya models
(:mod:`mambalaya.workloads.hf_fields`), and the config beside a weights file."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mambalaya.errors import SpecError
from mambalaya.specio import read_spec_file
from mambalaya.workloads.hf_fields import ConfigFields
from mambalaya.workloads.hf_loader import WeightLoadError


# --------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------


def read_config_json(path_or_dict: Any, label: str) -> tuple[dict[str, Any], str]:
    """A model config as a dict, from a dict or a local ``config.json`` (or its directory), and
    where it came from (for error messages); ``label`` names the model family in errors."""
    if isinstance(path_or_dict, Mapping):
        return dict(path_or_dict), "the config dict"
    if not isinstance(path_or_dict, (str, os.PathLike)):
        raise WeightLoadError(
            f"Cannot read a {label} config from a {type(path_or_dict).__name__}: give a dict or the "
            "path of a config.json (or of its directory)."
        )
    path = Path(path_or_dict).expanduser()
    if path.is_dir():
        path = path / "config.json"
    try:
        cfg = json.loads(read_spec_file(path, f"{label} config"))
    except SpecError as exc:
        raise WeightLoadError(f"Cannot read the {label} config: {exc}.") from None
    except ValueError as exc:
        raise WeightLoadError(f"The {label} config {path} is not valid JSON: {exc}.") from None
    if not isinstance(cfg, dict):
        raise WeightLoadError(f"The {label} config {path} is not a JSON object.")
    return cfg, str(path)


def positive_int(value: Any, name: str, where: str) -> int:
    """``value`` as an int if it is a positive whole number (numpy integers included)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer)) or int(value) != value or value <= 0:
        raise WeightLoadError(f"In {where}, {name} must be a positive integer, got {value!r}.")
    return int(value)


def positive_number(value: Any, name: str, where: str) -> float:
    """``value`` as a float if it is a finite positive number."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not 0 < value < float("inf"):
        raise WeightLoadError(f"In {where}, {name} must be a positive number, got {value!r}.")
    return float(value)


def config_format(cfg: Mapping[str, Any], where: str, family: str) -> str:
    """``"transformers"`` (``hidden_size`` or a ``model_type``) or ``"state-spaces"``
    (``d_model``): which class's fields and defaults a config is read with."""
    if "hidden_size" in cfg or "model_type" in cfg:
        if "d_model" in cfg:
            raise WeightLoadError(f"{where} has both hidden_size/model_type (transformers) and d_model "
                                  f"(state-spaces); a {family} config.json is one or the other.")
        return "transformers"
    if "d_model" in cfg:
        return "state-spaces"
    raise WeightLoadError(f"{where} has no d_model: looked for 'hidden_size' (a transformers config) and "
                          f"'d_model' (a state-spaces config).")


def audit_config(cfg: Mapping[str, Any], fields: ConfigFields, where: str, *, prefix: str = "") -> None:
    """Every field of ``cfg`` read, supported or inert (:mod:`~mambalaya.workloads.hf_fields`),
    else a WeightLoadError naming the field."""
    problem = fields.problem(cfg, prefix=prefix)
    if problem:
        raise WeightLoadError(f"In {where}, {problem}.")


@dataclass(frozen=True)
class ConfigReading:
    """How a family reads one config format: the format's field tables (``ssm_fields`` for a
    state-spaces ``ssm_cfg``), its class defaults, the keys that must be present, and which
    config key gives each of mambalaya's fields (``keys``)."""

    fields: ConfigFields
    defaults: Mapping[str, Any]
    keys: Mapping[str, str]
    ssm_fields: ConfigFields | None = None
    required: tuple[str, ...] = ()


def read_config_fields(cfg: Mapping[str, Any], ssm: Mapping[str, Any], where: str,
                       reading: ConfigReading) -> dict[str, tuple[str, Any]]:
    """Each of mambalaya's fields as ``(the config's name for it, its value)``: every field of
    ``cfg`` (and of ``ssm_cfg``) audited first, then each value taken from the config, else from
    ``ssm_cfg``, else from the class defaults (a null counts as absent)."""
    audit_config(cfg, reading.fields, where)
    scopes: list[Mapping[str, Any]] = [reading.defaults]
    if reading.ssm_fields is not None:
        audit_config(ssm, reading.ssm_fields, where, prefix="ssm_cfg.")
        scopes.append(ssm)
    scopes.append(cfg)
    values = {k: v for scope in scopes for k, v in scope.items() if v is not None}
    for key in reading.required:
        if key not in values:
            raise WeightLoadError(f"{where} has no {key} (a state-spaces config names it).")
    in_ssm = set(reading.ssm_fields.read) if reading.ssm_fields is not None else set()
    return {ours: (f"ssm_cfg.{key}" if key in in_ssm else key, values[key]) for ours, key in reading.keys.items()}


def true_or_false(value: Any, name: str, where: str) -> bool:
    if not isinstance(value, bool):
        raise WeightLoadError(f"In {where}, {name} must be true or false, got {value!r}.")
    return value


def padded_vocab(cfg: Mapping[str, Any], vocab_size: int, where: str) -> int:
    """A state-spaces ``vocab_size`` padded up to ``pad_vocab_size_multiple`` (the embedding's
    rows), as mamba_ssm and the transformers conversion do."""
    if "pad_vocab_size_multiple" not in cfg:
        return vocab_size
    mult = positive_int(cfg["pad_vocab_size_multiple"], "pad_vocab_size_multiple", where)
    return -(-vocab_size // mult) * mult


def ssm_cfg_of(cfg: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    ssm = cfg.get("ssm_cfg") or {}
    if not isinstance(ssm, Mapping):
        raise WeightLoadError(f"In {where}, 'ssm_cfg' is not an object: {ssm!r}.")
    return ssm


def config_beside(source: Any) -> Path | None:
    """The ``config.json`` next to a weight file or in a model directory, if ``source`` is a path
    and there is one."""
    if isinstance(source, Mapping) or not isinstance(source, (str, os.PathLike)):
        return None
    path = Path(source).expanduser()
    config = (path if path.is_dir() else path.parent) / "config.json"
    return config if config.is_file() else None


__all__ = ["ConfigReading", "audit_config", "config_beside", "config_format", "padded_vocab", "positive_int", "positive_number", "read_config_fields", "read_config_json", "ssm_cfg_of", "true_or_false"]
