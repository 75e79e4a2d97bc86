"""The capacity check: a model whose weights, states and KV cache do not fit in a design's
off-chip memory is refused, naming the need, the capacity and the devices that would hold it
(issue 42, "memory capacity"); where it fits, evaluate says how much is used and left."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from mambalaya.arch import load_arch, with_settings
from mambalaya.cli import app
from mambalaya.experiments.evaluate import evaluate, model_memory_need, require_fits, resolve_policy
from mambalaya.experiments.reproduce import DESIGNS, ReproduceConfig
from mambalaya.cost.capacity import (CapacityError, check_fits, devices_to_hold, is_kv_cache, memory_need,
                                      state_bytes)
from mambalaya.workloads import PRESETS, build_layer

runner = CliRunner()


def test_a_60_mib_dram_refuses_mamba_130m() -> None:
    r = runner.invoke(app, ["evaluate", "-m", "mamba-130m", "-L", "256", "-B", "1",
                            "--set", "memory.offchip_capacity_bytes=60MiB"])
    assert r.exit_code == 1, r.output
    message = " ".join(r.stderr.split())
    assert message.startswith("error: mamba-130m does not fit in the off-chip memory of mambalaya")
    assert "62,914,560 bytes" in message and "259.5 MB = 129,135,360 parameters x 16 bits (A, DS at the width the precision policy gives them: +1.253 MB)" in message
    assert "the joined capacity of 5 such devices" in message and "has no system section" in message
    assert "\n" not in r.stderr.strip()
    assert r.stdout == ""


def test_jamba_on_an_h100_is_refused_naming_two_devices() -> None:
    r = runner.invoke(app, ["evaluate", "-m", "jamba-v0.1", "-a", "gpu-h100", "-L", "2048", "-B", "1"])
    assert r.exit_code == 1, r.output
    message = " ".join(r.stderr.split())
    assert "jamba-v0.1 does not fit in the off-chip memory of gpu-h100" in message
    assert "103.2 GB" in message and "80 GB" in message and "of 2 such devices" in message
    assert "in a pipeline (its layers split in order) it runs on 2: --devices 2" in message
    with pytest.raises(CapacityError, match="of 2 such devices"):  # compare goes through the same check
        from mambalaya.experiments.evaluate import compare_rows

        compare_rows(["gpu-h100"], "mamba-2.8b", PRESETS["mamba-2.8b"], phase="prefill", seq_lens=[2048], batch=1,
                     baseline="gpu-h100", settings=("memory.offchip_capacity_bytes=5GB",))


def test_a_model_that_fits_prints_the_dram_used_and_left() -> None:
    r = runner.invoke(app, ["evaluate", "-m", "mamba-130m", "-L", "256", "-B", "1"])
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if x.startswith("DRAM:"))
    assert "262.1 MB of 80 GB used" in line and "79.74 GB left" in line
    doc = json.loads(runner.invoke(app, ["evaluate", "-m", "mamba-130m", "-L", "256", "-B", "1", "-f", "json"]).output)
    t = doc["totals"]
    assert t["dram_capacity_bytes"] == 80e9 and t["dram_need_bytes"] + t["dram_left_bytes"] == pytest.approx(80e9)
    hybrid = runner.invoke(app, ["evaluate", "-m", "bamba-9b", "-a", "gpu-h100", "-L", "512", "-B", "1"])
    assert hybrid.exit_code == 0, hybrid.output
    assert "KV cache 6.291 MB" in next(x for x in hybrid.output.splitlines() if x.startswith("DRAM:"))


def test_a_design_without_a_capacity_says_it_is_not_checked() -> None:
    ev = evaluate("marca-original", "mamba-130m", PRESETS["mamba-130m"], phase="prefill", seq_len=64, batch=1)
    assert ev.dram is not None and ev.dram.capacity_bytes is None and ev.dram.left_bytes is None
    assert "not checked" in ev.dram.text()


def test_states_and_kv_cache_are_the_decode_steps_incoming_state() -> None:
    """A Mamba-1 layer's state is its SSM state (float32 under reference-kernels) and its conv
    window; an attention layer's is its keys and values over the cached positions; a
    Falcon-H1 parallel layer has both, each counted where it belongs."""
    policy = resolve_policy(load_arch("mambalaya"), None)
    mamba = build_layer(PRESETS["mamba-130m"], phase="decode", seq_len=100, batch=3, precision=policy)
    E, N, J = 1536, 16, 3
    assert state_bytes(mamba) == (3 * E * N * 4 + 3 * J * E * 2, 0.0)
    attention = build_layer(PRESETS["bamba-9b"], phase="decode", seq_len=100, batch=3, layer_type="attention",
                            precision=policy)
    kv_heads, head_dim = 8, 128
    assert state_bytes(attention) == (0.0, 2 * 3 * 100 * kv_heads * head_dim * 2)
    parallel = build_layer(PRESETS["falcon-h1-7b"], phase="decode", seq_len=100, batch=1, layer_type="parallel",
                           precision=policy)
    kinds = {t: is_kv_cache(parallel, t) for t in parallel.external_tensors() if parallel.tensors[t].role.value == "state"}
    assert kinds == {"CSX0": False, "CSB0": False, "CSC0": False, "H0": False, "KC0A": True, "VC0": True}


#: The presets with attention layers (a KV cache that grows with the context).
WITH_ATTENTION = {"bamba-9b", "jamba-v0.1", "granite-4.0-h-tiny", "nemotron-h-8b", "olmo-hybrid", "olmo-hybrid-7b",
                  "falcon-h1-7b", "zamba2-2.7b"}


@pytest.mark.parametrize("model", sorted(PRESETS))
def test_every_family_needs_its_parameters_states_and_kv_cache(model: str) -> None:
    """Mamba-1/2, Gated DeltaNet, Bamba, the MoE hybrids and the dense hybrid families: weights
    are every parameter at the design width, but those the policy holds at another width
    (reference-kernels: Mamba's A and D at 32 bits) at the bytes one pass of the layer reads them
    (an ideal mapping of its decode step reads each weight once: the memory check once counted
    A and D at 16 bits where the traffic read 32); a longer context adds KV cache only where the
    model has attention, in proportion to the context."""
    from mambalaya.cost.traffic import group_traffic
    from mambalaya.einsum.ir import Role
    from mambalaya.experiments.devices import layer_order
    from mambalaya.fusion.mapping import FusionGroup
    from mambalaya.workloads.families.base import is_hybrid

    config = PRESETS[model]
    policy = resolve_policy(load_arch("mambalaya"), None)
    short = model_memory_need(config, batch=2, seq_len=1024, bits=16, policy=policy)
    long = model_memory_need(config, batch=2, seq_len=4096, bits=16, policy=policy)
    wider = 0.0
    order = layer_order(config)
    for kind in dict.fromkeys(order):
        if kind == "full_attention" and not is_hybrid(config):
            continue  # the Gated DeltaNet preset's unbuilt attention layers: at the design width
        step = build_layer(config, phase="decode", seq_len=1024, batch=2, precision=policy,
                           **({"layer_type": kind} if is_hybrid(config) else {}))
        reads = group_traffic(step, FusionGroup("all", tuple(e.name for e in step.einsums))).read_bytes
        # (a MoE decode step reads only the experts its tokens reach: the widths differ elsewhere)
        weights = [t for t, spec in step.tensors.items() if spec.role == Role.WEIGHT and spec.bits != 16]
        wider += order.count(kind) * sum(reads[t] - 2 * math.prod(step.shape(t)) for t in weights)
    assert short.weight_bytes == pytest.approx(config.model_parameters() * 2 + wider, rel=1e-12)
    assert (wider > 0) == bool(short.other_width_weights)
    assert short.state_bytes > 0 and long.state_bytes == short.state_bytes
    if model in WITH_ATTENTION:
        assert long.kv_cache_bytes == 4 * short.kv_cache_bytes > 0
    else:
        assert short.kv_cache_bytes == long.kv_cache_bytes == 0


def test_the_gated_deltanet_preset_counts_the_attention_layers_it_does_not_build() -> None:
    """``olmo-hybrid`` builds its Gated DeltaNet layers only, but the model it counts the weights
    of runs eight attention layers: their KV cache is the whole model's (``olmo-hybrid-7b``)."""
    policy = resolve_policy(load_arch("mambalaya"), None)
    gdn, whole = (model_memory_need(PRESETS[m], batch=3, seq_len=512, bits=16, policy=policy)
                  for m in ("olmo-hybrid", "olmo-hybrid-7b"))
    assert gdn.kv_cache_bytes == whole.kv_cache_bytes == 8 * 2 * 3 * 512 * 30 * 128 * 2
    assert gdn.parameters == whole.parameters


def test_the_pure_parts() -> None:
    need = memory_need(1000, 16, [(3, (10.0, 100.0)), (2, (5.0, 0.0))], batch=1, seq_len=8)
    assert (need.weight_bytes, need.state_bytes, need.kv_cache_bytes, need.total_bytes) == (2000, 40.0, 300.0, 2340.0)
    assert devices_to_hold(2340, 1000) == 3 and devices_to_hold(2000, 1000) == 2 and devices_to_hold(1, 1000) == 1
    use = check_fits(need, 2340, model="m", arch="a")
    assert use.left_bytes == 0
    with pytest.raises(CapacityError, match=r"of 3 such devices would hold it \(ceil\(2,340 / 1,000\)\)"):
        check_fits(need, 1000, model="m", arch="a")
    with pytest.raises(CapacityError, match="Use a smaller batch or sequence length"):
        check_fits(need, 2339, model="m", arch="a")


def test_the_default_reproduce_run_fits_on_its_designs() -> None:
    """Every point of ``mambalaya reproduce``'s main run fits in its design's memory: the check
    drops no point of it."""
    config = ReproduceConfig()
    for model in config.models:
        for design in DESIGNS:
            spec = load_arch(design)
            for L in (1, *config.seq_lens):
                use = require_fits(spec, model, PRESETS[model], batch=config.batch, seq_len=L)
                assert use.capacity_bytes is not None and use.left_bytes > 0 and math.isfinite(use.used_bytes)


def test_a_smaller_batch_or_context_is_suggested_only_when_it_helps() -> None:
    spec = with_settings(load_arch("gpu-h100"), ["memory.offchip_capacity_bytes=20GB"])
    with pytest.raises(CapacityError, match="Use a smaller batch or sequence length"):
        require_fits(spec, "bamba-9b", PRESETS["bamba-9b"], batch=64, seq_len=16384)
    with pytest.raises(CapacityError, match="weights alone are over the capacity"):
        require_fits(spec, "jamba-v0.1", PRESETS["jamba-v0.1"], batch=1, seq_len=16)


def test_the_activation_peak_is_what_is_live_at_once_under_the_mapping() -> None:
    """By hand, three groups in order: g1 reads X and writes A, g2 reads A and X and writes B,
    g3 reads B and W and writes the output Y. Live at g2: X, A, B (X from the start, A and B from
    their writers to their last readers); at g3: B, and Y to the end. Weights are the model's need,
    not an activation; a tensor its writer writes only part of holds that part."""
    from types import SimpleNamespace

    from mambalaya.cost.capacity import activation_peak
    from mambalaya.einsum.cascade_file import loads_cascade

    c = loads_cascade("""ranks: {I: 4, D: 8, E: 2}
tensors:
  X: {ranks: [I, D], role: input, bits: 16}
  W: {ranks: [D, E], role: weight, bits: 16}
  A: {ranks: [I, D], role: intermediate, bits: 32}
  B: {ranks: [I, D], role: intermediate, bits: 16}
  Y: {ranks: [I, E], role: output, bits: 16}
einsums:
  - A[i,d] = 2*X[i,d]
  - B[i,d] = A[i,d] + X[i,d]
  - Y[i,e] = B[i,d]*W[d,e]
""")
    def group(name, reads, writes):
        return SimpleNamespace(group=name, traffic=SimpleNamespace(read_bytes=reads, write_bytes=writes))
    x, a, b, y = 4 * 8 * 2, 4 * 8 * 4, 4 * 8 * 2, 4 * 2 * 2
    peak = activation_peak(c, [group("g1", {"X": x}, {"A": a}), group("g2", {"A": a, "X": x}, {"B": b}),
                               group("g3", {"B": b, "W": 32}, {"Y": y})])
    assert (peak.bytes, peak.group) == (x + a + b, "g2") and dict(peak.tensors) == {"X": x, "A": a, "B": b}
    # written twice over by a tiled writer: the tensor still holds its size; written in part: that part
    twice = activation_peak(c, [group("g1", {"X": x}, {"A": 2 * a}), group("g2", {"A": a, "X": x}, {"B": b // 4})])
    assert dict(twice.tensors) == {"X": x, "A": a, "B": b // 4}


def test_activations_over_the_capacity_are_reported_with_the_tensors_that_make_them() -> None:
    """The unfused baseline at batch 64 and L 16K writes the float32 scan state and its operands
    whole: 850 GB at once, which the report once hid behind '76.37 GB left'. Reported (not refused:
    the numbers take them to stream through DRAM, as a design running the batch in pieces would),
    with the tensors, in the text and the JSON; a small layer's fit, and leave room."""
    r = runner.invoke(app, ["evaluate", "-a", "marca-ideal", "-m", "mamba-1.4b", "-L", "16384", "-B", "64"])
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if x.startswith("DRAM:"))
    assert "activations as mapped peak at 850.4 GB" in line and "H 274.9 GB" in line and "beside the layer's" not in line
    assert "over what the capacity leaves" in line and "pieces" in line
    doc = json.loads(runner.invoke(app, ["evaluate", "-a", "marca-ideal", "-m", "mamba-1.4b", "-L", "16384", "-B", "64",
                                         "-f", "json"]).output)
    assert doc["totals"]["activations_fit_dram"] is False and doc["totals"]["activation_peak_bytes"] > 8.5e11
    small = evaluate("mambalaya", "mamba-130m", PRESETS["mamba-130m"], phase="prefill", seq_len=256, batch=1)
    assert small.dram.activations_fit and 0 < small.dram.activations.bytes < 1e8


def test_every_output_of_evaluate_carries_the_same_dram_and_model_figures(tmp_path) -> None:
    """The text's two "left" figures are the JSON's dram_left_bytes and
    dram_left_after_activations_bytes (the table once quoted the second as the first), and
    evaluate -o FILE writes the model's latency and DRAM lines beside the table (they were left out)."""
    path = tmp_path / "ev.txt"
    r = runner.invoke(app, ["evaluate", "-m", "mamba-130m", "-L", "2048", "-B", "4", "-o", str(path)])
    assert r.exit_code == 0, r.output
    text = path.read_text(encoding="utf-8")
    line = next(x for x in text.splitlines() if x.startswith("DRAM:"))
    assert any(x.startswith("layer ") and "model (24 layers)" in x for x in text.splitlines())
    t = json.loads(runner.invoke(app, ["evaluate", "-m", "mamba-130m", "-L", "2048", "-B", "4", "-f", "json"]).output)["totals"]
    from mambalaya.cost.capacity import byte_size

    assert f"{byte_size(t['dram_left_bytes'])} left, {byte_size(t['dram_left_after_activations_bytes'])} beside" in line
    assert t["dram_left_bytes"] - t["dram_left_after_activations_bytes"] == pytest.approx(t["activation_peak_bytes"])
