"""Every reader of a file refuses malformed input with one paragraph, or reads it correctly.

Property tests (hypothesis) over the readers of mambalaya's own files: model configs in
mambalaya's fields, architecture specs, precision policies, mapping files, routing histograms,
validation case files and sensitivity specs. From a valid document of each kind they derive
malformed and extreme ones (a value replaced by another type, NaN, infinity, a huge or fractional
number, an empty list or mapping, deep nesting; a field deleted; a key given twice; an alias bomb)
and assert that each ends in one :class:`~mambalaya.errors.MambalayaError` (one line, naming the
file) within seconds, or in a valid result whose integers are integers and numbers finite. The
shared reading layer they go through is :mod:`mambalaya.specio`.
"""

from __future__ import annotations

import re

import functools

import math
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from mambalaya.arch import arch_to_yaml, load_arch
from mambalaya.errors import MambalayaError, SpecError
from mambalaya.experiments.sensitivity import load_sensitivity_spec
from mambalaya.experiments.validate import load_cases
from mambalaya.fusion.mapping_file import load_mapping
from mambalaya.specio import MAX_DOCUMENT_NODES, MAX_NESTING_DEPTH, parse_json_text, parse_yaml_text
from mambalaya.workloads import PRESETS, load_model_config
from mambalaya.workloads.blocks.moe import load_routing_histogram
from mambalaya.workloads.precision import load_policy, shipped_policy_text

#: Values put where a field's value was: other types, non-finite, huge, fractional, empty, nested.
JUNK: tuple[Any, ...] = (
    None, "", "no", "yes", "64", True, 0, -1, 64.0, 64.9, 1e-300, 1e300, float("inf"), float("-inf"),
    float("nan"), 10**30, 10**400, [], {}, [1, 2], {"x": 1}, "x" * 300, [[[[[[1]]]]]], {"a": {"b": {"c": 1}}},
)


def _model_doc(preset: str) -> dict[str, Any]:
    return PRESETS[preset].model_dump(mode="json")


def _mapping_doc() -> dict[str, Any]:
    return {"name": "two-groups", "buffer_bytes": "1MiB",
            "groups": [{"name": "G1", "einsums": ["SS", "RS"], "loops": [{"rank": "I", "tile": 64}], "halo": "retain"},
                       {"name": "G2", "einsums": ["XN"], "loops": []}]}


READERS: dict[str, tuple[Callable[[], Any], str, Callable[[Path], Any]]] = {
    "mamba1-model": (lambda: _model_doc("mamba-130m"), ".yaml", load_model_config),
    "mamba2-model": (lambda: _model_doc("mamba2-130m"), ".yaml", load_model_config),
    "mamba1-model-json": (lambda: _model_doc("mamba-130m"), ".json", load_model_config),
    "arch": (lambda: yaml.safe_load(arch_to_yaml(load_arch("mambalaya"))), ".yaml", lambda p: load_arch(str(p))),
    "policy": (lambda: yaml.safe_load(shipped_policy_text("reference-kernels")), ".yaml", lambda p: load_policy(str(p))),
    "mapping": (_mapping_doc, ".yaml", load_mapping),
    "routing": (lambda: {"fractions": [0.25] * 4 + [0.0] * 12}, ".yaml", lambda p: load_routing_histogram(p, 16, 2)),
    "sensitivity": (lambda: yaml.safe_load(Path(__file__).parents[1].joinpath(
        "src/mambalaya/data/sensitivity/h100-like.yaml").read_text()), ".yaml", load_sensitivity_spec),
}


@functools.cache
def _document(kind: str) -> Any:
    """The valid document of ``kind``, made once (the arch's dump alone takes most of an
    example's time); examples change copies of it (:func:`_replaced` copies along its path)."""
    return READERS[kind][0]()


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value of ``doc`` (keys of mappings, indices of lists)."""
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for key, value in doc.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc[:3]):
            out += _paths(value, (*prefix, i))
    return out


def _replaced(doc: Any, path: tuple, value: Any, delete: bool) -> Any:
    if not path:
        return value
    head, *rest = path
    copy = dict(doc) if isinstance(doc, dict) else list(doc)
    if not rest and delete:
        del copy[head]
        return copy
    copy[head] = _replaced(copy[head], tuple(rest), value, delete)
    return copy


def _text(doc: Any, suffix: str) -> str:
    if suffix == ".json":
        import json

        return json.dumps(doc)  # NaN and Infinity as JSON's literals, which Python writes
    return yaml.safe_dump(doc, sort_keys=False)


def _check_valid(result: Any) -> None:
    """A result read from a malformed-looking document is still well-typed: integers are
    integers, numbers finite (a routing histogram is a tuple of finite fractions)."""
    values = result.model_dump() if isinstance(result, BaseModel) else result
    stack = [values]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
        elif isinstance(value, float):
            assert math.isfinite(value), f"a non-finite number was read: {values!r}"


def _read(reader: Callable[[Path], Any], path: Path) -> Any:
    start = time.perf_counter()
    try:
        result = reader(path)
    except MambalayaError as err:
        message = str(err)
        assert "\n" not in message.strip(), f"not one paragraph: {message!r}"
        assert str(path) in message or path.name in message, f"the file is not named: {message!r}"
        return None
    finally:
        assert time.perf_counter() - start < 10, "a reader took more than 10 s"
    _check_valid(result)
    return result


@pytest.mark.parametrize("kind", sorted(READERS))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_mutated_document_is_read_or_refused_in_one_paragraph(kind, data, tmp_path) -> None:
    _, suffix, reader = READERS[kind]
    doc = _document(kind)
    path = data.draw(st.sampled_from(_paths(doc)), label="path")
    delete = data.draw(st.booleans(), label="delete") and isinstance(path[-1], str)
    value = data.draw(st.sampled_from(JUNK), label="value")
    mutated = _replaced(doc, path, value, delete)
    target = tmp_path / f"doc{suffix}"
    target.write_text(_text(mutated, suffix))
    before = sorted(p.name for p in tmp_path.iterdir())
    _read(reader, target)
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "a reader wrote a file"


@pytest.mark.parametrize("kind", sorted(READERS))
def test_the_valid_documents_are_read(kind, tmp_path) -> None:
    """The documents the properties start from are valid (else the properties test nothing)."""
    make, suffix, reader = READERS[kind]
    target = tmp_path / f"doc{suffix}"
    target.write_text(_text(make(), suffix))
    assert reader(target) is not None


@pytest.mark.parametrize("kind", sorted(k for k in READERS if READERS[k][1] == ".yaml"))
def test_a_key_given_twice_is_refused_naming_it_and_both_lines(kind, tmp_path) -> None:
    make, suffix, reader = READERS[kind]
    doc = make()
    first = next(iter(doc))
    text = _text(doc, suffix)
    target = tmp_path / f"doc{suffix}"
    target.write_text(text + _text({first: doc[first]}, suffix))
    with pytest.raises(SpecError, match=rf"key '{first}' is given twice in one mapping \(lines 1 and \d+\)"):
        reader(target)


@pytest.mark.parametrize("kind", sorted(READERS))
def test_an_alias_bomb_or_deep_nesting_is_refused_in_seconds(kind, tmp_path) -> None:
    make, suffix, reader = READERS[kind]
    doc = make()
    first = next(iter(doc))
    rest = _text({k: v for k, v in doc.items() if k != first}, ".yaml")
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi"))
    nested = "[" * (MAX_NESTING_DEPTH + 5) + "]" * (MAX_NESTING_DEPTH + 5)
    for extra in (f"{first}:\n  " + bomb.replace("\n", "\n  "), f"{first}: {nested}\n", f"{first}: &r [*r]\n"):
        target = tmp_path / "doc.yaml"
        target.write_text(rest + extra)
        start = time.perf_counter()
        with pytest.raises(SpecError, match="more than|nested|nests|not valid YAML"):
            reader(target)
        assert time.perf_counter() - start < 5


def test_the_document_bounds_are_stated() -> None:
    assert MAX_NESTING_DEPTH >= 16 and MAX_DOCUMENT_NODES >= 1_000_000


def test_json_reading_is_strict() -> None:
    """JSON: duplicate keys, 5000-digit integers and deep nesting refused; transformers' encoded
    infinity and Python's literals read as floats."""
    with pytest.raises(SpecError, match="key 'a' is given twice"):
        parse_json_text('{"a": 1, "b": {}, "a": 2}', source="c.json")
    with pytest.raises(SpecError, match="an integer of 5,000 digits"):
        parse_json_text("[" + "7" * 5000 + "]", source="c.json")
    with pytest.raises(SpecError, match="nested more than|nests more than"):
        parse_json_text("[" * 100_000 + "]" * 100_000, source="c.json")
    assert parse_json_text('[0.0, {"__float__": "Infinity"}]', source="c.json") == [0.0, math.inf]
    assert math.isnan(parse_json_text("NaN", source="c.json"))
    assert parse_json_text('{"__float__": "Infinity", "x": 1}', source="c.json") == {"__float__": "Infinity", "x": 1}


def test_a_syntax_error_at_the_end_of_a_large_yaml_file_is_found_in_one_reading() -> None:
    """The file is parsed once (a syntax pass in C first for large texts), not again by the pure
    Python parser: 3 MB with an error on its last line is reported with its line quickly."""
    text = "".join(f"k{i}: [1, 2, 3]\n" for i in range(200_000)) + "z: [\n"
    start = time.perf_counter()
    with pytest.raises(SpecError, match="line 200002") as err:
        parse_yaml_text(text, source="big.yaml")
    assert "not valid YAML" in str(err.value)
    assert time.perf_counter() - start < 10


def test_merge_keys_may_be_overridden_but_plain_keys_not() -> None:
    assert parse_yaml_text("b: &b {x: 1, y: 2}\nm: {<<: *b, x: 3}\n", source="m.yaml")["m"] == {"x": 3, "y": 2}
    with pytest.raises(SpecError, match=r"key 'x' is given twice in one mapping \(lines 1 and 1\)"):
        parse_yaml_text("{x: 1, x: 2}\n", source="m.yaml")


@pytest.mark.parametrize("text, message", [
    ("d_model: 64\nn_layers: 2.0\n", "n_layers: must be an integer"),
    ("d_model: 64\nn_layers: 2.9\n", "n_layers: must be an integer"),
    ("d_model: '64'\nn_layers: 2\n", "d_model: must be an integer"),
    ("d_model: 64\nn_layers: 2\ntie_embeddings: 'no'\n", "tie_embeddings: must be true or false"),
    ("d_model: 64\nn_layers: 2\ntie_embeddings: 0\n", "tie_embeddings: must be true or false"),
    ("d_model: 64\n", "n_layers: required field is missing"),
    ("d_model: 64\nn_layers: 2\nnorm_eps: .nan\n", "norm_eps: must be a finite number"),
])
def test_a_model_file_takes_integers_booleans_and_required_fields_strictly(tmp_path, text, message) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match=message):
        load_model_config(path)


def test_validation_cases_are_read_strictly(tmp_path) -> None:
    cases, _ = load_cases()
    doc = {"sources": dict(cases.sources), "cases": [cases.cases[0].model_dump(mode="json")]}
    doc["cases"][0]["batch"] = 2.0
    path = tmp_path / "cases.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(SpecError, match=r"cases\[0\]\.batch: must be an integer"):
        load_cases(path)


# --------------------------------------------------------------------------------------------
# cases a hostile review found (each was a silent wrong number or a refused valid input)

@pytest.mark.parametrize("text, message", [
    ("d_model: 64\nn_layers: 1:00\n", "n_layers: must be an integer"),      # YAML 1.1 base 60: was 60
    ("d_model: 0100\nn_layers: 2\n", "d_model: must be an integer"),        # YAML 1.1 octal: was 64
    ("d_model: 64\nn_layers: 2\nnorm_eps: 1:30.5\n", "norm_eps: must be a number"),
])
def test_yaml_11_base_60_and_octal_are_not_numbers(tmp_path, text, message) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match=message):
        load_model_config(path)


def test_a_number_with_an_exponent_is_a_number_in_every_file(tmp_path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("d_model: 64\nn_layers: 2\nnorm_eps: 1e-5\n")
    assert load_model_config(path).norm_eps == 1e-5
    routing = tmp_path / "r.yaml"
    routing.write_text("fractions: [25e-2, 25e-2, 25e-2, 25e-2" + ", 0" * 12 + "]\n")
    assert load_routing_histogram(routing, 16, 2)[:4] == (0.25,) * 4
    assert parse_yaml_text("a: 7e2\nb: 2.039e12\nc: 0x10\nd: 1_000\n", source="x") == \
        {"a": 700.0, "b": 2.039e12, "c": 16, "d": 1000}


def test_a_null_is_refused_where_transformers_refuses_it(tmp_path) -> None:
    import json

    base = {"model_type": "mamba", "hidden_size": 64, "num_hidden_layers": 4, "state_size": 8, "vocab_size": 100}
    for field in ("num_hidden_layers", "state_size", "tie_word_embeddings"):
        path = tmp_path / f"{field}.json"
        path.write_text(json.dumps({**base, field: None}))
        with pytest.raises(MambalayaError, match=f"field {field} is null"):
            load_model_config(path)


def test_a_width_given_twice_in_an_energy_table_is_refused() -> None:
    from mambalaya.arch import with_settings

    with pytest.raises(SpecError, match="width 16 is given twice"):
        with_settings(load_arch("mambalaya"), ['energy.mac_pj={16: 1.5, "16": 400, 32: 4.6}'])


@pytest.mark.parametrize("setting, needle", [
    ("energy.mac_pj.16.5=1", "16 is one value here (1.5), not a section or table"),  # was a TypeError traceback
    ("area.mac_um2.16.x=1", "16 is one value here"),
    ("energy.mac_pj.0=1", "width 0 is no width"),  # accepted: no tensor has 0 bits
])
def test_a_setting_through_a_width_table_entry_is_refused_by_name(setting, needle) -> None:
    from mambalaya.arch import with_settings

    with pytest.raises(SpecError, match=re.escape(needle)):
        with_settings(load_arch("mambalaya"), [setting])


def test_sizes_past_2_to_the_53_are_exact() -> None:
    from mambalaya.einsum.parse import evaluate_size
    from mambalaya.fusion.mapping_file import parse_bytes

    assert parse_bytes("9007199254740993") == 2**53 + 1 and parse_bytes("1.5KiB") == 1536
    with pytest.raises(SpecError, match="whole number of bytes"):
        parse_bytes("0.3B")
    with pytest.raises(SpecError, match="9,007,199,254,740,993, above 2\\^53"):
        evaluate_size("L", {"L": 2**53 + 1})
    assert evaluate_size("ceil(d/16)", {"d": 2**52 + 16}) == 2**48 + 1


def test_widths_are_at_most_64_bits() -> None:
    from mambalaya.workloads import build_layer

    with pytest.raises(SpecError, match="bits must be at most 64"):
        build_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=8, batch=1, bits=65)


def test_sensitivity_batch_ends_are_integers(tmp_path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("name: t\ndesigns: [mambalaya]\nassumptions:\n  - {key: batch, low: 2.5, high: 4, reason: r}\n")
    with pytest.raises(SpecError, match=r"assumptions\[0\]\.low: must be an integer"):
        load_sensitivity_spec(path)


def test_validation_cases_need_a_case_and_a_measured_time_in_range(tmp_path) -> None:
    cases, _ = load_cases()
    path = tmp_path / "cases.yaml"
    path.write_text(yaml.safe_dump({"sources": dict(cases.sources), "cases": []}))
    with pytest.raises(SpecError, match="cases"):
        load_cases(path)
    doc = {"sources": dict(cases.sources), "cases": [{**cases.cases[0].model_dump(mode="json"), "measured_ms": 1e-320}]}
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(SpecError, match=r"measured_ms: must be >= 0.001"):
        load_cases(path)


def test_a_large_document_of_small_values_is_refused_before_its_values_are_built() -> None:
    text = "x: [" + "1," * (MAX_DOCUMENT_NODES + 10) + "1]\n"
    start = time.perf_counter()
    with pytest.raises(SpecError, match=f"more than {MAX_DOCUMENT_NODES:,} values"):
        parse_yaml_text(text, source="big.yaml")
    assert time.perf_counter() - start < 15


def test_a_mapping_file_that_breaks_a_rule_is_named_in_the_error(tmp_path) -> None:
    from mambalaya.fusion.mapping_file import dump_mapping
    from mambalaya.fusion.mapping_file import check_mapping_file
    from mambalaya.search.mappings import load_mapping_file, named_mapping
    from mambalaya.workloads import build_layer

    cascade = build_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=64, batch=1)
    path = tmp_path / "m.yaml"
    path.write_text(dump_mapping(named_mapping("optimal", cascade, 32 * 2**20)).replace("buffer_bytes: 33554432",
                                                                                        "buffer_bytes: 1024"))
    with pytest.raises(SpecError, match=r"m\.yaml: group G\d+: on-chip footprint .* \[rule: buffer\]"):
        check_mapping_file(cascade, load_mapping_file(str(path)), str(path))
