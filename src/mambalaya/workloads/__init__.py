"""Workloads: Mamba model configurations (presets or custom) and their layer cascades."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from mambalaya.errors import SpecError
from mambalaya.einsum.cascade import Cascade
from mambalaya.workloads.mamba1 import PRESETS as MAMBA1_PRESETS
from mambalaya.workloads.mamba1 import Mamba1Config, mamba1_layer, parse_config

ModelConfig = Mamba1Config

#: Every named model, by preset name.
PRESETS: dict[str, ModelConfig] = dict(MAMBA1_PRESETS)


def load_model_config(path: str | Path) -> ModelConfig:
    """A model config from a YAML/JSON file: mambalaya's fields (``d_model``, ``n_layers``,
    ``d_state``, ...) or a transformers / state-spaces ``config.json``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise SpecError(f"cannot read model config: {err.strerror or err}", source=str(path)) from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise SpecError(f"model config is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {err}",
                        source=str(path)) from None
    if not isinstance(data, dict):
        raise SpecError("a model config is a mapping of fields to values", source=str(path))
    if "d_model" not in data and ("hidden_size" in data or "model_type" in data):
        from mambalaya.workloads.hf_weights import load_mamba1_config

        data = load_mamba1_config(data)
    return parse_config(data, source=str(path))


def resolve_model(name_or_path: str) -> ModelConfig:
    """A preset by name, or a config file by path."""
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    if Path(name_or_path).suffix in (".yaml", ".yml", ".json") or Path(name_or_path).exists():
        return load_model_config(name_or_path)
    raise SpecError(
        f"unknown model {name_or_path!r}: use a preset ({', '.join(PRESETS)}) or the path of a "
        "YAML/JSON model config"
    )


def build_layer(
    model: ModelConfig,
    *,
    phase: str,
    seq_len: int,
    batch: int,
    bits: int = 16,
    state_io: bool | None = None,
    name: str | None = None,
) -> Cascade:
    """One layer of ``model`` as a cascade."""
    return mamba1_layer(model, batch=batch, seq_len=seq_len, phase=phase, bits=bits,  # type: ignore[arg-type]
                        state_io=state_io, name=name)


__all__ = ["PRESETS", "ModelConfig", "build_layer", "load_model_config", "resolve_model"]
