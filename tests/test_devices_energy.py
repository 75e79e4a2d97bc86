"""Energy and power on several devices and cores: one rule with one device's.

Found by an audit of designs combining sections no shipped spec combines (2026-12-07): a hybrid
model's throttled latency on several devices left out the collectives (so it was faster than
the unthrottled model), the over-budget flag judged an average with the waits in it while the
throttle judged a layer's power, the devices' leakage while they wait was not counted, and a
multi-core chip's sweep row set one core's power beside the chip's budget.
"""

from __future__ import annotations

import pytest

from mambalaya.arch import arch_from_dict, arch_to_dict, load_arch
from mambalaya.errors import MambalayaError
from mambalaya.experiments.evaluate import evaluate
from mambalaya.experiments.hybrid import evaluate_hybrid
from mambalaya.workloads import PRESETS

LINKS = {"link_bandwidth_bytes_per_s": 4.5e11, "link_latency_s": 3e-6, "collective_latency_s": 6.6e-6,
         "in_network_reduction": True, "max_devices": 8, "link_energy_pj_per_bit": 10.0}


def _design(**changes):
    """``mambalaya`` (energy, area, technology) joined to others by links with an energy."""
    return arch_from_dict({**arch_to_dict(load_arch("mambalaya")), "system": LINKS, **changes})


@pytest.mark.parametrize("parallel", ["expert", "tensor", "pipeline"])
def test_a_hybrid_models_throttled_latency_keeps_its_collectives(parallel) -> None:
    """Held to the budget a model never runs faster than it runs: the collectives and transfers
    stay (granite on two devices took 4.09 ms throttled against 5.28 ms unthrottled)."""
    hv = evaluate_hybrid(_design(), "granite-4.0-h-tiny", PRESETS["granite-4.0-h-tiny"], phase="prefill",
                         seq_len=256, batch=2, devices=2, parallel=parallel)
    t = hv.totals()
    assert t["throttled_model_latency_s"] >= hv.model_latency_s * (1 - 1e-12)
    if not t["over_power_budget"]:
        assert t["throttled_model_latency_s"] == pytest.approx(hv.model_latency_s)


def test_the_budget_is_judged_as_the_throttle_judges_it() -> None:
    """Two pipeline stages at a 60 W budget: a layer draws 112 W while it runs, so it is throttled;
    the flag said "within" from the device's average over the latency, waits included (55 W)."""
    ev = evaluate(_design(power_budget_w=60), "mamba-130m", PRESETS["mamba-130m"], phase="prefill",
                  seq_len=512, batch=2, devices=2)
    t = ev.totals()
    assert t["layer_power_w"] > 60 > t["average_power_w"]
    assert t["over_power_budget"] and t["throttled_latency_s"] > t["latency_s"]


def test_a_waiting_device_leaks() -> None:
    """A four-stage pipeline: each device leaks the whole latency, not its own layers' time only
    (leakage was counted over each device's busy time)."""
    ev = evaluate(_design(), "mamba-130m", PRESETS["mamba-130m"], phase="prefill", seq_len=512, batch=4,
                  devices=4)
    t, p, e = ev.totals(), ev.pipeline, ev.energy
    waiting = e.leakage_w * (4 * p.latency_s - sum(p.stage_s))
    assert t["waiting_leakage_j"] == pytest.approx(waiting) and waiting > 0
    assert t["model_energy_j"] == pytest.approx(e.model_j + waiting + p.interconnect_j)
    tensor = evaluate(_design(), "mamba-130m", PRESETS["mamba-130m"], phase="prefill", seq_len=512, batch=4,
                      devices=2, parallel="tensor")
    tt = tensor.totals()
    assert tt["waiting_leakage_j"] == pytest.approx(2 * tensor.energy.leakage_w * tensor.layer_split.interconnect_s)


def test_a_chips_budget_below_its_cores_leakage_names_the_chips_threshold() -> None:
    """32 cores at 1 W: the refusal named one core's leakage (0.033 W) as the threshold, and a
    budget above it was refused again."""
    spec = arch_from_dict({**arch_to_dict(load_arch("marca-multicore")), "power_budget_w": 1.0})
    with pytest.raises(MambalayaError, match="shared by its 32 cores") as info:
        evaluate(spec, "mamba-130m", PRESETS["mamba-130m"], phase="prefill", seq_len=256, batch=1)
    assert "32 x" in str(info.value)


def test_a_design_without_an_area_says_it_has_no_leakage(tmp_path) -> None:
    """The technology's leakage densities are per mm^2 and per MiB of the area model: without an
    area section none is computed, and the power line said "leakage 0 W included"."""
    from typer.testing import CliRunner

    from mambalaya.arch import arch_to_yaml
    from mambalaya.cli import app

    data = arch_to_dict(load_arch("mambalaya"))
    data.pop("area")
    data["sources"] = {k: v for k, v in data["sources"].items() if not k.startswith("area")}
    f = tmp_path / "no-area.yaml"
    f.write_text(arch_to_yaml(arch_from_dict(data)))
    r = CliRunner().invoke(app, ["evaluate", "--arch", str(f), "-m", "mamba-130m", "-L", "64", "-B", "1"])
    text = " ".join(r.output.split())
    assert r.exit_code == 0, r.output
    assert "no leakage (no area section" in text and "leakage 0 W included" not in text


@pytest.mark.parametrize("parallel, micro_batches", [("pipeline", 2), ("pipeline", 1), ("tensor", 1)])
def test_a_hybrid_models_energy_line_adds_up_to_its_total(parallel, micro_batches) -> None:
    """The hybrid text printed one micro-batch's (or one device's) breakdown beside the model's
    total, without the count, the waiting leakage and the links that make the total (33.67 J of
    components beside 76.61 J on a two-micro-batch pipeline). Its terms now add up to it."""
    import re

    from mambalaya.cli.evaluate_text import hybrid_energy_text

    hv = evaluate_hybrid(_design(), "bamba-9b", PRESETS["bamba-9b"], phase="prefill",
                         seq_len=512, batch=4, devices=2, parallel=parallel, micro_batches=micro_batches)
    t = hv.totals()
    text = hybrid_energy_text(hv, t, hv.energy.model_j, "parts")
    total, part, count = re.search(r"links ([\d.e+]+) J = .*? ([\d.e+]+) J \(parts\) x (\d+)", text).groups()
    extras = [float(x) for x in re.findall(r"\+ [^+]*? ([\d.e+-]+) J", text)]
    assert int(count) == (2 if parallel == "tensor" else micro_batches)
    assert float(part) * int(count) + sum(extras) == pytest.approx(float(total), rel=1e-3)
    assert float(total) == pytest.approx(t["model_energy_j"], rel=1e-3)


def test_over_the_budget_the_printed_figures_say_they_are_unthrottled() -> None:
    """Over its power budget a run's latency, throughput, energy and EDP were printed as if the
    budget held, without a word; the power line now says they are unthrottled and gives the
    model's latency and throughput held to the budget."""
    import re

    from typer.testing import CliRunner

    from mambalaya.cli import app

    out = CliRunner().invoke(app, ["evaluate", "-m", "mamba-130m", "-L", "512", "-B", "1", "--set",
                                   "power_budget_w=5"])
    assert out.exit_code == 0, out.output
    line = next(x for x in out.output.splitlines() if x.startswith("average power"))
    assert "OVER" in line and "(the latency, throughput, energy and EDP above are unthrottled)" in line
    from mambalaya.arch import with_settings

    tight = with_settings(load_arch("mambalaya"), ["power_budget_w=5"], option="test")
    ev = evaluate(tight, "mamba-130m", PRESETS["mamba-130m"], phase="prefill", seq_len=512, batch=1)
    t = ev.totals()
    held = t["throttled_model_latency_s"]
    assert held > ev.model_latency_s
    shown = int(re.search(r"the model [0-9.]+ ms, ([0-9,]+) tokens/s", line).group(1).replace(",", ""))
    assert shown == pytest.approx(t["tokens_per_s"] * ev.model_latency_s / held, abs=1)


def test_an_energy_search_over_the_best_strategy_lists_the_strategies_of_the_form_it_kept() -> None:
    """--objective energy --parallel best on a Mamba-2 prefill: the form is chosen by energy, each
    form's strategy by latency; the strategies listed were each the fastest over both forms, so a
    strategy was listed faster than the kept form ran it (and the text's lookup of the kept one
    failed with a traceback). The list is now the kept form's own."""
    from mambalaya.experiments.evaluate import evaluate_best_scan

    ev = evaluate_best_scan(_design(), "mamba2-130m", PRESETS["mamba2-130m"], phase="prefill", seq_len=256, batch=1,
                            devices=2, parallel="best", objective="energy")
    listed = dict(ev.strategies_s)
    kept = ev.layer_split.strategy if ev.layer_split is not None else "pipeline"
    assert listed[kept] == pytest.approx(ev.model_latency_s, rel=1e-12)
    assert min(listed.values()) == pytest.approx(ev.model_latency_s, rel=1e-12)


def test_a_leakage_setting_on_a_design_without_an_area_is_refused(tmp_path) -> None:
    """Its leakage densities are over the area model's components: without an area section every
    value printed the same numbers, and --set took them without a word."""
    from typer.testing import CliRunner

    from mambalaya.arch import arch_to_yaml
    from mambalaya.cli import app

    data = arch_to_dict(load_arch("mambalaya"))
    data.pop("area")
    data["sources"] = {k: v for k, v in data["sources"].items() if not k.startswith("area")}
    f = tmp_path / "no-area.yaml"
    f.write_text(arch_to_yaml(arch_from_dict(data)))
    for field in ("technology.logic_leakage_w_per_mm2=5", "technology.sram_leakage_w_per_mib=1", "technology.area_scale=0.5"):
        r = CliRunner().invoke(app, ["evaluate", "--arch", str(f), "-m", "mamba-130m", "-L", "64", "-B", "1", "--set", field])
        assert r.exit_code != 0 and "no area section" in " ".join(r.output.split()), (field, r.output)
    r = CliRunner().invoke(app, ["evaluate", "-m", "mamba-130m", "-L", "64", "-B", "1", "--set", "technology.area_scale=0.5"])
    assert r.exit_code == 0, r.output  # (the shipped design has an area section)
