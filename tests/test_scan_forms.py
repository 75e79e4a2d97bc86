"""Every model whose prefill has two scan forms runs the better one by default, in every command:
a gated delta rule's model (olmo-hybrid) once ran its chunked form, 16% slower than its recurrent
one at L 2048 batch 64, while a Mamba-2 model ran the faster."""

from __future__ import annotations

import pytest

from mambalaya.errors import MambalayaError
from mambalaya.experiments.evaluate import evaluate, evaluate_best_scan, scan_form
from mambalaya.workloads import PRESETS, SCAN_FORM_FAMILIES, build_layer, has_scan_forms
from mambalaya.workloads.families.base import is_hybrid


def _builds_both_forms(config) -> bool:
    forms = set()
    for scan in ("chunked", "recurrent"):
        try:
            forms.add(scan_form(build_layer(config, phase="prefill", seq_len=256, batch=1, scan=scan)))
        except MambalayaError:
            return False
    return forms == {"chunked", "recurrent"}


def test_the_families_with_two_forms_are_those_whose_prefill_builds_both() -> None:
    """The rule names its families; each non-hybrid family whose prefill builds in both forms is one."""
    firsts: dict[str, str] = {}
    for name, config in PRESETS.items():
        if not is_hybrid(config):
            firsts.setdefault(config.family, name)
    both = {family for family, name in firsts.items() if _builds_both_forms(PRESETS[name])}
    assert both == set(SCAN_FORM_FAMILIES)


@pytest.mark.parametrize("model", ["mamba2-130m", "olmo-hybrid"])
def test_a_prefill_without_a_form_runs_the_faster(model: str) -> None:
    config = PRESETS[model]
    assert has_scan_forms(config)
    forms = {form: evaluate("mambalaya", model, config, phase="prefill", seq_len=512, batch=4, scan=form)
             for form in ("chunked", "recurrent")}
    best = evaluate_best_scan("mambalaya", model, config, phase="prefill", seq_len=512, batch=4)
    assert best.model_latency_s == min(ev.model_latency_s for ev in forms.values())
    assert scan_form(best.cascade) == min(forms, key=lambda f: (forms[f].model_latency_s, f != "chunked"))


def test_a_sweep_point_and_a_sensitivity_scan_row_take_the_delta_rules_forms_too() -> None:
    """A sweep point of a gated delta rule model runs the faster form and names it (it ran the
    chunked one, unnamed); a sensitivity spec's ``scan`` assumption applies to such a model (its row
    was dropped without a word)."""
    from mambalaya.experiments import sensitivity as S
    from mambalaya.experiments.sweep import evaluate_point

    config = PRESETS["olmo-hybrid"]
    point = {"arch": "mambalaya", "model": "olmo-hybrid", "phase": "prefill", "seq_len": 512, "batch": 4,
             "mapping": "default"}
    out = evaluate_point(point)
    ev = evaluate_best_scan("mambalaya", "olmo-hybrid", config, phase="prefill", seq_len=512, batch=4)
    assert out["scan_used"] == scan_form(ev.cascade) == "recurrent"
    assert out["latency_s"] == ev.result.latency_s
    spec = S.load_sensitivity_spec("h100-like")
    run = S.RunSetup(models=("olmo-hybrid",), configs={"olmo-hybrid": config}, seq_lens=(512,), batch=4)
    assert any(a.key == "scan" for a in S.applicable(spec, run))
