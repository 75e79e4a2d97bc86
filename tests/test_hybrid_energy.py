"""A hybrid model's energy and power (issue 45): the whole model's figures are the sums over its
layer types (each layer type's energy per layer times its layers), the average power is that
energy over the model's latency, the budget throttles each layer type on its own, and every
command and store carries the figures. For one layer type every figure equals a Mamba model's."""

from __future__ import annotations

import math

import pytest

from mambalaya.arch import load_arch, with_settings
from mambalaya.cost.energy import ModelEnergy
from mambalaya.experiments.evaluate import evaluate
from mambalaya.experiments.hybrid import evaluate_hybrid, point_outputs
from mambalaya.experiments.store import ENERGY_OUTPUT_COLUMNS, check_point_outputs
from mambalaya.workloads import PRESETS


def test_one_layer_type_gives_the_mamba_models_own_figures() -> None:
    ev = evaluate("mambalaya", "mamba-130m", PRESETS["mamba-130m"], phase="decode", seq_len=1, batch=4)
    layer, model = ev.energy, ModelEnergy((ev.energy,))
    assert math.isclose(model.model_j, layer.model_j) and math.isclose(model.per_token_j, layer.per_token_j)
    assert math.isclose(model.average_power_w, layer.average_power_w)
    assert math.isclose(model.edp_js, layer.edp_js)
    assert math.isclose(model.throttled_model_latency_s, layer.n_layers * layer.throttled_latency_s)
    assert model.by_component_j().keys() == layer.by_component_j().keys()


@pytest.mark.parametrize("model", ["bamba-9b", "olmo-hybrid-7b", "granite-4.0-h-tiny", "nemotron-h-8b"])
def test_a_hybrid_models_energy_is_the_sum_over_its_layer_types(model: str) -> None:
    # unfused: the sums do not depend on the mapping, and it keeps the test fast
    hv = evaluate_hybrid("mambalaya", model, PRESETS[model], phase="decode", seq_len=256, batch=1, mapping="unfused")
    energy = hv.energy
    parts = {t: ev.energy for t, ev in hv.layers.items()}
    assert math.isclose(energy.model_j, sum(p.n_layers * p.layer_j for p in parts.values()), rel_tol=1e-12)
    assert math.isclose(energy.average_power_w, energy.model_j / hv.model_latency_s, rel_tol=1e-12)
    assert math.isclose(energy.per_token_j, energy.model_j / 1, rel_tol=1e-12)  # batch 1, one position
    assert math.isclose(sum(energy.by_component_j().values()), energy.model_j, rel_tol=1e-9)
    totals = hv.totals()
    assert all(math.isclose(totals[f"{t}_layer_energy_j"], p.layer_j) for t, p in parts.items())
    outputs = point_outputs(hv)
    assert set(ENERGY_OUTPUT_COLUMNS) <= set(outputs)
    design = {"buffer_bytes": 1, "pes": 1, "bandwidth_bytes_per_s": 1.0}  # the sweep adds the design's own
    check_point_outputs({**outputs, **design})  # the store takes the point whole
    assert math.isclose(outputs["layer_energy_j"] * hv.config.n_layers, energy.model_j, rel_tol=1e-12)
    # groups per layer, a mean over the costed layers as every per-layer figure (it was the types' sum)
    counted = sum(ev.result.n_layers for ev in hv.layers.values())
    assert math.isclose(outputs["groups"] * counted, sum(ev.result.n_layers * len(ev.result.groups)
                                                         for ev in hv.layers.values()), rel_tol=1e-12)


def test_the_budget_throttles_each_layer_type_on_its_own() -> None:
    arch = load_arch("mambalaya")
    hv = evaluate_hybrid(arch, "bamba-9b", PRESETS["bamba-9b"], phase="decode", seq_len=256, batch=1, mapping="unfused")
    powers = {t: ev.energy.average_power_w for t, ev in hv.layers.items()}
    budget = (min(powers.values()) + max(powers.values())) / 2  # between the layer types' powers
    budget = max(budget, 1.01 * hv.energy.leakage_w)
    tight = with_settings(arch, [f"power_budget_w={budget}"])
    held = evaluate_hybrid(tight, "bamba-9b", PRESETS["bamba-9b"], phase="decode", seq_len=256, batch=1,
                           mapping="unfused")
    energy = held.energy
    assert energy.over_power_budget
    expected = sum(ev.result.n_layers * ev.energy.throttled_latency_s for ev in held.layers.values())
    assert math.isclose(energy.throttled_model_latency_s, expected, rel_tol=1e-12)
    assert energy.throttled_model_latency_s > held.model_latency_s
