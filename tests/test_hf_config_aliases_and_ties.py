"""Two rules of every family's config.json reader, checked on every family against transformers
5.25 itself (not only on the family an issue named):

* **Ties.** What a model ties (its LM head to the embeddings, Zamba2's shared blocks across
  their uses) follows ``tie_word_embeddings`` as transformers applies it: with the field true and
  false, each family's parameter count equals that of transformers' causal-LM model built from the
  same file on the meta device. (Zamba2 untied holds a copy of the shared block per hybrid layer;
  Nemotron-H never ties its LM head: both were once counted otherwise.)
* **Aliases.** A config class's ``attribute_map`` alias given alone is read as its field; given
  beside its field with another value, the file is refused naming both (transformers takes the
  alias's; mambalaya once took the field's without a word). The aliases each reader declares are
  the class's own.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from mambalaya.errors import MambalayaError
from mambalaya.workloads import load_model_config
from test_hf_config_properties import BASES

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

#: transformers' config files (their ``model_type``), not the state-spaces format
FAMILIES = [f for f, data in BASES.items() if "model_type" in data]


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return path


def _transformers_parameters(path: Path) -> int:
    config = transformers.AutoConfig.from_pretrained(path.parent)
    config.pad_token_id = None  # (the small bases' vocabularies are below transformers' default pad ids)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def _ours(path: Path) -> int:
    return load_model_config(str(path)).model_parameters()


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("family", FAMILIES)
def test_parameter_count_follows_ties_as_transformers_does(tmp_path: Path, family: str, tie: bool) -> None:
    data = {**copy.deepcopy(BASES[family]), "tie_word_embeddings": tie}
    if family == "zamba2":  # three hybrid layers on two blocks: the tie decides two sets of weights or three
        data.update(layers_block_type=["hybrid", "hybrid", "hybrid"], num_mem_blocks=2, adapter_rank=4)
    path = _write(tmp_path, data)
    assert _ours(path) == _transformers_parameters(path)


def _declared_aliases(family: str) -> dict[str, str]:
    from mambalaya.workloads.families import nemotron_h, zamba2
    from mambalaya.workloads.hf.config_moe import ATTRIBUTE_MAPS

    return {"nemotron_h": nemotron_h.ATTRIBUTE_MAP, "zamba2": zamba2.ATTRIBUTE_MAP, **ATTRIBUTE_MAPS}.get(family, {})


#: The config classes whose alias targets a read-only property (the layer pattern transformers
#: builds from other fields): an alias there cannot set anything, and a file giving it is read
#: only if it says what the class builds (Bamba) or refused (Falcon-H1).
PROPERTY_TARGETS = {"bamba": {"layer_types"}, "falcon_h1": {"layer_types"}}


def _config_class(family: str) -> type:
    return type(transformers.AutoConfig.for_model(family))


@pytest.mark.parametrize("family", FAMILIES)
def test_each_reader_declares_its_config_class_aliases(family: str) -> None:
    aliases = dict(_config_class(family).attribute_map)
    assert {**_declared_aliases(family), **{a: aliases[a] for a in PROPERTY_TARGETS.get(family, ())}} == aliases


def _another_value(value: Any) -> Any:
    if isinstance(value, list):
        return list(reversed(value)) if list(reversed(value)) != value else value + value[:1]
    return value + 1


def _alias_cases() -> list[tuple[str, str, str]]:
    return [(f, alias, target) for f in FAMILIES for alias, target in _config_class(f).attribute_map.items()]


def _field_value(family: str, base: dict[str, Any], target: str) -> Any:
    """``target``'s value in the base config, else its config class's default, else (a pattern
    the class builds from other fields) the pattern it builds from the base."""
    if target in base:
        return base[target]
    default = getattr(_config_class(family)(), target, None)
    return default if default is not None else \
        {"bamba": ["mamba", "attention", "mamba"], "falcon_h1": ["hybrid", "hybrid"]}[family]


@pytest.mark.parametrize("family,alias,target", _alias_cases())
def test_an_alias_disagreeing_with_its_field_is_refused(tmp_path: Path, family: str, alias: str, target: str) -> None:
    data = copy.deepcopy(BASES[family])
    if (family, alias) == ("nemotron_h", "num_local_experts"):  # read only with a MoE layer (a dense one ignores it)
        data["layers_block_type"] = [*data["layers_block_type"][:-1], "moe"]
    field = _field_value(family, data, target)
    data[target], data[alias] = field, _another_value(field)
    with pytest.raises(MambalayaError) as err:
        load_model_config(str(_write(tmp_path, data)))
    assert alias in str(err.value) or target in str(err.value)


@pytest.mark.parametrize("family,alias,target", [c for c in _alias_cases() if c[1] not in PROPERTY_TARGETS.get(c[0], ())])
def test_an_alias_alone_reads_as_its_field(tmp_path: Path, family: str, alias: str, target: str) -> None:
    base = copy.deepcopy(BASES[family])
    base[target] = _field_value(family, base, target)
    renamed = {(alias if k == target else k): v for k, v in base.items()}
    (tmp_path / "a").mkdir()
    assert load_model_config(str(_write(tmp_path / "a", renamed))) == load_model_config(str(_write(tmp_path, base)))
