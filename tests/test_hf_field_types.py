"""An inert config.json field must have the type transformers' config class requires of it:
for every class mambalaya reads and every inert field, mambalaya accepts exactly the values
transformers accepts (over a fixed set of JSON-shaped samples)."""

from __future__ import annotations

import logging
import warnings

import pytest

from mambalaya.workloads.families import falcon_h1, nemotron_h, olmo_hybrid, zamba2

from mambalaya.workloads.hf import config_moe as hf_config_moe, fields as hf_fields
from mambalaya.workloads.hf.field_types import INERT_FIELD_TYPES, field_type_problem

transformers = pytest.importorskip("transformers")

#: config class -> the inert fields of its reader.
INERT_FIELDS: dict[str, set[str]] = {
    "MambaConfig": set(hf_fields.MAMBA1_FIELDS.inert),
    "Mamba2Config": set(hf_fields.MAMBA2_FIELDS.inert),
    "BambaConfig": set(hf_fields.BAMBA_FIELDS.inert),
    "FalconH1Config": set(falcon_h1.INERT),
    "Zamba2Config": set(zamba2.INERT),
    "NemotronHConfig": set(nemotron_h.INERT) | set(nemotron_h.MOE_FIELDS),  # MoE fields: inert in dense configs
    "OlmoHybridConfig": set(olmo_hybrid.INERT),
    **{cls: set(hf_config_moe.INERT_FIELDS[family]) | set(hf_fields.TRANSFORMERS_COMMON_INERT)
       for family, cls in hf_config_moe.CONFIG_CLASSES.items()},
}
#: Inert fields whose values transformers checks against more than a type (a layer-type list
#: must name known layer types; Zamba2Config recomputes attention_head_dim and checks it):
#: mambalaya reads or checks these elsewhere, or they are structural.
STRUCTURAL = {"layer_types", "layers_block_type", "mtp_hybrid_override_pattern", "attention_head_dim"}
SAMPLES = [True, False, 0, 1, -1, 1.5, 0.0, -0.5, 0.5, 1e9, "x", "float32", None, [1], ["x"], [], {}, {"1": "a"}]


def _transformers_accepts(config_class: str, key: str, value) -> bool:
    cls = getattr(transformers, config_class)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.CRITICAL)
        try:
            cls(**{key: value})
        except Exception:  # noqa: BLE001 - any refusal
            return False
        finally:
            logging.disable(logging.NOTSET)
    return True


@pytest.mark.parametrize("config_class", sorted(INERT_FIELDS))
def test_inert_fields_take_exactly_the_values_transformers_takes(config_class: str) -> None:
    assert set(INERT_FIELD_TYPES) == set(INERT_FIELDS)
    disagreements = []
    for key in sorted(INERT_FIELDS[config_class] - STRUCTURAL):
        for value in SAMPLES:
            ours = field_type_problem(config_class, key, value) is None
            if ours != _transformers_accepts(config_class, key, value):
                disagreements.append((key, value, "mambalaya accepts" if ours else "mambalaya refuses"))
    assert not disagreements, disagreements


@pytest.mark.parametrize(("reader", "base"), [
    ("mamba", {"model_type": "mamba"}), ("bamba", {"model_type": "bamba"}),
    ("falcon_h1", {"model_type": "falcon_h1"}), ("jamba", {"model_type": "jamba"}),
    ("olmo_hybrid", {"model_type": "olmo_hybrid"}), ("nemotron_h", {"model_type": "nemotron_h", "hybrid_override_pattern": "M*"}),
])
def test_a_wrongly_typed_inert_field_is_one_error_naming_it(tmp_path, reader: str, base: dict) -> None:
    import json

    from mambalaya.errors import MambalayaError
    from mambalaya.workloads import load_model_config

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**base, "use_cache": "false"}))
    with pytest.raises(MambalayaError, match="use_cache") as caught:
        load_model_config(path)
    assert "bool" in str(caught.value) and "config.json" in str(caught.value)
