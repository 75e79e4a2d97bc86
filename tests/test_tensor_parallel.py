"""Tensor parallelism (mambalaya.cost.tensor_parallel), proved on every shipped layer: each form
of each family's layers, split over simulated devices in the numpy executor (each device holds
its part of the split ranks, and the devices exchange nothing but the model's all-reduces),
gives the whole layer's outputs; and the bytes they exchange are the model's."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from mambalaya.arch import arch_from_dict, arch_to_dict, load_arch
from mambalaya.cli import app
from mambalaya.arch.system import SystemSpec
from mambalaya.cost.tensor_parallel import (ALL_REDUCED_SUFFIX, KV_HEADS, SPLIT_SIZE_EXPRESSIONS, split_parts, all_reduce_algorithm, all_reduce_bound_s,
                                            all_reduce_options, all_reduce_s, all_reduce_sent_bytes, all_reduces,
                                            check_split, device_cascade, partial_tensors, tensor_parallel_ranks,
                                            with_rank_sizes)
from mambalaya.einsum import loads_cascade
from mambalaya.einsum.dead_work import mask_array
from mambalaya.einsum.ir import Role
from mambalaya.errors import SpecError
from mambalaya.execute.numpy_exec import execute, resolve_dtype, run_einsum
from mambalaya.cost.traffic import mapping_traffic
from mambalaya.experiments.evaluate import evaluate, model_memory_need
from mambalaya.experiments.hybrid import evaluate_hybrid
from mambalaya.workloads import PRESETS, build_layer
from mambalaya.workloads.precision import load_policy
from mambalaya.workloads.shipped import shipped_layers

runner = CliRunner()
POLICY = load_policy("reference-kernels")

DEVICES = 2
#: Sizes the proof shrinks to (the algebra does not depend on them): every split rank to two
#: parts of two, the model width to 8. Positions stay as built (the chunk lengths tie them).
SPLIT_SIZE, WIDTH_SIZE = 4, 8
WIDTH_EXPRESSIONS = {"d_model", "hidden_size"}
#: An attention head of 128 channels (rotary over all of them) shrinks to 8.
HEAD_SIZES = {"head_dim": 8, "head_dim/2": 4}



def random_arrays(cascade, rng) -> dict:
    """Uniform values in [-0.5, 0.5] for every array the cascade reads, but a mask's: the values
    its declaration gives it (``einsum.dead_work.mask_array``: the executor refuses others)."""
    return {t: mask_array(cascade, t) if cascade.tensors[t].mask is not None else rng.uniform(-0.5, 0.5, cascade.shape(t))
            for t in cascade.external_tensors()}


def small(cascade):
    split = tensor_parallel_ranks(cascade)
    sizes = {r: SPLIT_SIZE for r in split}
    sizes.update({name: WIDTH_SIZE for name, rank in cascade.ranks.items() if rank.size_expr in WIDTH_EXPRESSIONS})
    sizes.update({name: HEAD_SIZES[rank.size_expr] for name, rank in cascade.ranks.items()
                  if rank.size_expr in HEAD_SIZES and rank.size == 16 * HEAD_SIZES[rank.size_expr]})
    return with_rank_sizes(cascade, sizes), split


def layer_id(layer) -> str:
    return "-".join(str(x) for x in (layer.preset, layer.layer_type, layer.phase, layer.scan, layer.softmax,
                                     layer.state_io) if x is not None)


def proof_layers():
    """Every shipped layer form: at 16 positions, the chunked forms that need a whole chunk at
    256 (a multiple of every preset's chunk length)."""
    short = list(shipped_layers(seq_len=16))
    built = {layer_id(x) for x in short}
    return short + [x for x in shipped_layers(seq_len=256) if layer_id(x) not in built]


LAYERS = proof_layers()


def piece(cascade, rank: str, parts: dict, device: int, devices: int) -> int:
    """Which of its ``parts[rank]`` parts of ``rank`` device ``device`` holds: its own where the
    rank splits over every device; where key/value heads are replicated, device ``d`` holds head
    ``d // (devices / heads)`` and that head's query part ``d % (devices / heads)``."""
    n = parts[rank]
    if n == devices:
        return device
    if cascade.ranks[rank].size_expr == KV_HEADS:
        return device // (devices // n)
    return device % n


def device_part(cascade, tensor: str, array: np.ndarray, split, device: int, devices: int = DEVICES) -> np.ndarray:
    """Device ``device``'s part of ``array`` (tensor ``tensor`` of ``cascade``): its share of
    every split rank the tensor has."""
    parts = split_parts(cascade, split, devices)
    index = tuple(slice((k := piece(cascade, r, parts, device, devices)) * (size := cascade.size(r)) // parts[r],
                        (k + 1) * size // parts[r]) if r in parts else slice(None)
                  for r in cascade.tensors[tensor].ranks)
    return array[index]


def run_on_devices(cascade, split, arrays, devices: int = DEVICES):
    """Each device runs its part of the layer Einsum by Einsum; after each Einsum the model
    all-reduces, the devices sum (or maximise) their results. Returns each device's values and
    the bytes each device sent into all-reduces, per tensor."""
    part = device_cascade(cascade, split, devices)
    _, reduced = partial_tensors(cascade, frozenset(split_parts(cascade, split, devices)))
    dtype = resolve_dtype("float64")
    values = [{t: device_part(cascade, t, a, split, d, devices) for t, a in arrays.items()} for d in range(devices)]
    exchanged = {}
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        for e in part.einsums:
            for d in range(devices):
                values[d][e.name] = run_einsum(part, e, values[d], dtype)
            if e.name in reduced:  # the all-reduce: the sum lands in <name>_AR where the cascade is cut there
                results = [values[d][e.name] for d in range(devices)]
                total = np.maximum.reduce(results) if e.reduce_op == "max" else np.sum(results, axis=0)
                whole = e.name + ALL_REDUCED_SUFFIX if e.name + ALL_REDUCED_SUFFIX in part.tensors else e.name
                for d in range(devices):
                    values[d][whole] = total
                exchanged[e.name] = results[0].size * part.tensors[e.name].bits / 8
    return values, exchanged


@pytest.mark.parametrize("layer", LAYERS, ids=[layer_id(x) for x in LAYERS])
def test_a_layer_split_over_devices_equals_the_whole_layer(layer):
    cascade, split = small(layer.cascade)
    assert split, "every shipped layer has heads or channels to split"
    rng = np.random.default_rng(0)
    arrays = random_arrays(cascade, rng)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        whole = execute(cascade, arrays, keep="all")
    values, exchanged = run_on_devices(cascade, split, arrays)
    part = device_cascade(cascade, split, DEVICES)
    for t in cascade.output_tensors():
        reduced = t + ALL_REDUCED_SUFFIX if t + ALL_REDUCED_SUFFIX in part.tensors else t
        for d in range(DEVICES):
            np.testing.assert_allclose(values[d][reduced], device_part(cascade, t, whole[t], split, d), rtol=1e-9,
                                       atol=1e-12, err_msg=f"{t} on device {d}")
    model = {r.einsum: r.bytes for r in all_reduces(cascade, split)}  # outputs hold no split rank: whole on each
    assert exchanged == model
    # a device's cascade is cut at every all-reduce: the partial sum leaves the chip, the sum comes back
    for name in exchanged:
        if cascade.consumers(name):
            assert part.tensors[name].role == Role.OUTPUT and part.tensors[name + ALL_REDUCED_SUFFIX].role == Role.INPUT
            assert not part.consumers(name)


REPLICATED = [x for x in LAYERS if x.phase == "decode" and any(r.size_expr == KV_HEADS for r in x.cascade.ranks.values())
              and any(r.size_expr == "n_heads/n_kv_heads" for r in x.cascade.ranks.values())]


@pytest.mark.parametrize("layer", REPLICATED, ids=[layer_id(x) for x in REPLICATED])
def test_more_devices_than_key_value_heads_replicate_each_head_and_split_its_queries(layer):
    """Two key/value heads over four devices: each head on two devices, which split its four
    query heads; every output equals the whole layer's, and the devices exchange nothing but
    the model's all-reduces."""
    cascade, split = small(layer.cascade)
    kv = next(n for n, r in cascade.ranks.items() if r.size_expr == KV_HEADS)
    queries = next(n for n, r in cascade.ranks.items() if r.size_expr == "n_heads/n_kv_heads")
    cascade = with_rank_sizes(cascade, {kv: 2, queries: 4})
    if layer.preset.startswith("olmo"):  # its QK-norm sums every key head's channels, without the queries
        with pytest.raises(SpecError, match="Einsum KS sums over the key/value heads"):
            split_parts(cascade, split, 4)
        return
    assert split_parts(cascade, split, 4)[kv] == 2 and split_parts(cascade, split, 4)[queries] == 2
    rng = np.random.default_rng(3)
    arrays = random_arrays(cascade, rng)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        whole = execute(cascade, arrays, keep="all")
    values, exchanged = run_on_devices(cascade, split, arrays, devices=4)
    part = device_cascade(cascade, split, 4)
    assert part.size(kv) == 1 and part.size(queries) == 2
    for t in cascade.output_tensors():
        reduced = t + ALL_REDUCED_SUFFIX if t + ALL_REDUCED_SUFFIX in part.tensors else t
        for d in range(4):
            np.testing.assert_allclose(values[d][reduced], device_part(cascade, t, whole[t], split, d, 4), rtol=1e-9,
                                       atol=1e-12, err_msg=f"{t} on device {d}")
    assert exchanged == {r.einsum: r.bytes for r in all_reduces(cascade, split, 4)}


def test_the_split_ranks_are_the_heads_and_inner_channels_of_every_layer():
    """Each shipped layer splits exactly its ranks with a head or inner-channel size; those
    layers with a mixer split it, those with an MLP split its channels; the model width and the
    positions never split."""
    for layer in LAYERS:
        c = layer.cascade
        split = tensor_parallel_ranks(c)
        assert {c.ranks[r].size_expr for r in split} <= set(SPLIT_SIZE_EXPRESSIONS)
        assert not {"B", "I", "D", "T"} & set(split), layer_id(layer)


def test_all_reduces_fall_where_the_algebra_puts_them():
    """A Mamba-1 layer sums over its channels in x_proj (dt, B, C) and the out-projection; an MoE
    layer all-reduces its experts' combined output, not each expert's."""
    by_id = {layer_id(x): x.cascade for x in LAYERS}
    m1 = by_id["mamba-130m-prefill-False"]
    assert [r.einsum for r in all_reduces(m1, tensor_parallel_ranks(m1))] == ["DL", "BM", "CM", "O"]
    moe = by_id["jamba-v0.1-mamba-moe-prefill-recurrent-three-pass"]
    reduced = [r.einsum for r in all_reduces(moe, tensor_parallel_ranks(moe))]
    assert "FF_EO" not in reduced and "FF_MO" in reduced


SPLITTABLE = """
name: split
params: {}
ranks: {B: 1, I: 4, D: 4, F: 6}
tensors:
  X: {ranks: [B, I, D], role: input}
  W: {ranks: [D, F], role: weight}
  V: {ranks: [F, D], role: weight}
  H: {ranks: [B, I, F], role: intermediate}
  S: {ranks: [B, I, F], role: intermediate}
  Y: {ranks: [B, I, D], role: output}
einsums:
  - H[b,i,f] = X[b,i,d]*W[d,f]
  - S[b,i,f] = H[b,i,f-1]
  - Y[b,i,d] = S[b,i,f]*V[f,d]
"""


def test_a_split_that_would_read_another_devices_part_is_refused_naming_the_einsum():
    c = loads_cascade(SPLITTABLE)
    with pytest.raises(SpecError, match=r"Einsum S reads H\[b,i,f-1\] at f-1 along rank F"):
        check_split(c, ["F"])
    with pytest.raises(SpecError, match="does not divide 6"):
        device_cascade(loads_cascade(SPLITTABLE.replace("- S[b,i,f] = H[b,i,f-1]", "- S[b,i,f] = H[b,i,f]")),
                       ["F"], 4)
    with pytest.raises(SpecError, match="has no rank Z to split"):
        check_split(c, ["Z"])


def test_an_all_reduce_takes_its_fastest_algorithm():
    """Ring: 2 (N-1) steps, 2 (N-1)/N of the bytes per device; one-shot: one step, N-1 times the
    bytes; in-network (where the switch reduces): two steps, the bytes once. Each call pays the
    collective's fixed cost, each step the link's latency."""
    ring = SystemSpec(link_bandwidth_bytes_per_s=450e9, link_latency_s=3e-6, collective_latency_s=6.6e-6)
    assert all_reduce_options(1e9, 1, ring) == {} and all_reduce_s(1e9, 1, ring) == 0.0
    options = all_reduce_options(1e9, 8, ring)
    assert options["ring"] == pytest.approx(6.6e-6 + 14 * 3e-6 + 14 / 8 * 1e9 / 450e9)
    assert options["one-shot"] == pytest.approx(6.6e-6 + 3e-6 + 7 * 1e9 / 450e9) and "in-network" not in options
    assert all_reduce_algorithm(1e9, 8, ring)[0] == "ring" and all_reduce_algorithm(1e3, 8, ring)[0] == "one-shot"
    switch = ring.model_copy(update={"in_network_reduction": True})
    assert all_reduce_algorithm(1e9, 8, switch) == ("in-network", pytest.approx(6.6e-6 + 6e-6 + 1e9 / 450e9))
    assert all_reduce_bound_s(1e9, 8, switch) == pytest.approx(1e9 / 450e9)
    assert all_reduce_bound_s(1e9, 8, ring) == pytest.approx(14 / 8 * 1e9 / 450e9)
    assert all_reduce_sent_bytes(1e9, 8, "ring") == pytest.approx(1.75e9)


# -- evaluate and compare over several devices, tensor parallel ---------------------------------

def test_one_device_tensor_parallel_is_the_single_device_evaluation_exactly():
    config = PRESETS["mamba2-130m"]
    single = evaluate("gpu-h100", "mamba2-130m", config, phase="prefill", seq_len=1024, batch=2)
    one = evaluate("gpu-h100", "mamba2-130m", config, phase="prefill", seq_len=1024, batch=2, devices=1,
                   parallel="tensor")
    assert one.totals() == single.totals() and one.layer_split is None


def test_the_model_is_each_devices_part_of_every_layer_plus_its_all_reduces():
    config = PRESETS["mamba-2.8b"]
    ev = evaluate("gpu-h100", "mamba-2.8b", config, phase="prefill", seq_len=2048, batch=8, devices=4,
                  parallel="tensor")
    tp = ev.layer_split
    whole = build_layer(config, phase="prefill", seq_len=2048, batch=8, precision="reference-kernels")
    assert ev.cascade.size("E") == whole.size("E") // 4 and ev.cascade.size("D") == whole.size("D")
    (layers,) = tp.layers.values()
    assert [r.einsum for r in layers.all_reduces] == ["DL", "BM", "CM", "O"]
    assert layers.all_reduce_s == pytest.approx(sum(all_reduce_s(r.bytes, 4, ev.arch.system)
                                                    for r in layers.all_reduces))
    assert ev.model_latency_s == pytest.approx(config.n_layers * (ev.result.latency_s + layers.all_reduce_s))
    single = evaluate("gpu-h100", "mamba-2.8b", config, phase="prefill", seq_len=2048, batch=8)
    assert 2 < single.model_latency_s / ev.model_latency_s < 4  # four devices: faster, not four times
    t = ev.totals()
    assert t["devices"] == 4 and t["parallel"] == "tensor" and t["interconnect_s"] == pytest.approx(tp.interconnect_s)
    assert ev.dram.used_bytes < single.dram.used_bytes  # the split weights and states


def test_jamba_fits_two_h100s_tensor_parallel_and_names_its_all_reduces():
    r = runner.invoke(app, ["evaluate", "-m", "jamba-v0.1", "-a", "gpu-h100", "-L", "2048", "-B", "8",
                            "--devices", "2", "--parallel", "tensor"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert "tensor parallel over 2 devices (every layer's heads and channels split)" in text
    assert "mamba-moe: DL one-shot, BM one-shot, CM one-shot, O one-shot, FF_MO one-shot" in text  # two devices
    assert "on each device" in text and "each of the 2 devices: DRAM:" in text
    hv = evaluate_hybrid("gpu-h100", "jamba-v0.1", PRESETS["jamba-v0.1"], phase="prefill", seq_len=2048, batch=8,
                         devices=2, parallel="tensor")
    parts = sum(ev.result.model_latency_s for ev in hv.layers.values())
    assert hv.model_latency_s == pytest.approx(parts + hv.layer_split.interconnect_s)
    assert hv.dram.used_bytes < 80e9 < model_memory_need(PRESETS["jamba-v0.1"], batch=8, seq_len=2048,
                                                        bits=16, policy=POLICY).total_bytes


def test_energy_over_devices_is_every_devices_and_the_links_and_power_is_one_devices():
    spec = arch_from_dict({**arch_to_dict(load_arch("mambalaya")),
                           "system": {"link_bandwidth_bytes_per_s": 4.5e11, "link_latency_s": 3e-6,
                                      "link_energy_pj_per_bit": 5.0}})
    ev = evaluate(spec, "mamba-130m", PRESETS["mamba-130m"], phase="prefill", seq_len=1024, batch=2, devices=2,
                  parallel="tensor")
    t, tp, part = ev.totals(), ev.layer_split, ev.energy
    (layers,) = tp.layers.values()
    sent = 2 * sum(all_reduce_sent_bytes(r.bytes, 2, a) for r, a in zip(layers.all_reduces, layers.algorithms))
    assert tp.interconnect_j == pytest.approx(layers.count * 8 * sent * 5e-12)
    waiting = part.leakage_w * tp.interconnect_s  # each device leaks while the all-reduces run
    assert t["model_energy_j"] == pytest.approx(2 * (part.model_j + waiting) + tp.interconnect_j)
    assert t["average_power_w"] == pytest.approx((part.model_j + waiting) / ev.model_latency_s)


def test_compare_and_refusals_over_tensor_parallel_devices():
    r = runner.invoke(app, ["compare", "-m", "mamba2-130m", "--archs", "gpu-h100", "--baseline", "gpu-h100",
                            "--seq-lens", "1024", "-B", "2", "--devices", "2", "--parallel", "tensor",
                            "--format", "json"])
    assert r.exit_code == 0, r.output
    (row,) = json.loads(r.stdout)
    assert row["parallel"] == "tensor" and row["devices"] == 2 and row["interconnect_s"] > 0
    r = runner.invoke(app, ["evaluate", "-m", "mamba2-130m", "-a", "gpu-h100", "--devices", "5", "--parallel", "tensor"])
    assert r.exit_code == 1 and "5 does not divide 24" in " ".join(r.stderr.split())
    r = runner.invoke(app, ["evaluate", "-m", "mamba2-130m", "-a", "gpu-h100", "--devices", "2", "--parallel", "data"])
    assert r.exit_code == 2 and "--parallel" in r.output


def test_best_keeps_the_faster_strategy_and_names_both():
    config = PRESETS["mamba2-130m"]
    kw = dict(phase="decode", seq_len=1024, batch=1, devices=2)
    each = {s: evaluate("gpu-h100", "mamba2-130m", config, parallel=s, **kw).model_latency_s
            for s in ("pipeline", "tensor")}
    best = evaluate("gpu-h100", "mamba2-130m", config, parallel="best", **kw)
    assert dict(best.strategies_s) == pytest.approx(each) and best.model_latency_s == min(each.values())
    assert best.totals()["parallel_strategies_s"] == dict(best.strategies_s)
    # five devices do not divide mamba2-130m's 24 heads: best keeps the pipeline, naming nothing else
    five = evaluate("gpu-h100", "mamba2-130m", config, parallel="best", phase="decode", seq_len=1024, batch=1,
                    devices=5)
    assert [s for s, _ in five.strategies_s] == ["pipeline"] and five.pipeline is not None
    r = runner.invoke(app, ["evaluate", "-m", "mamba2-130m", "-a", "gpu-h100", "--phase", "decode", "-L", "1024",
                            "--devices", "2", "--parallel", "best"])
    assert r.exit_code == 0, r.output
    assert "--parallel best: pipeline" in r.stdout and "; kept " in r.stdout


CARRIED = """
name: carried
params: {}
ranks: {B: 1, I: 2, D: 3, F: 4}
tensors:
  X: {ranks: [B, I, D], role: input}
  W: {ranks: [D, F], role: weight}
  V: {ranks: [F, D], role: weight}
  G: {ranks: [B, I], role: input}
  H: {ranks: [B, I, F], role: intermediate}
  P: {ranks: [B, I, D], role: intermediate}
  M: {ranks: [B, I, D], role: intermediate}
  Y: {ranks: [B, I, D], role: output}
einsums:
  - H[b,i,f] = X[b,i,d]*W[d,f]
  - P[b,i,d] = H[b,i,f]*V[f,d]
  - M[b,i,d] max= H[b,i,f]*V[f,d]
  - Y[b,i,d] = G[b,i]*P[b,i,d] + M[b,i,d]*G[b,i]
"""


def test_a_partial_sum_is_carried_by_a_linear_reader_and_a_partial_maximum_never():
    """P (a sum over the split F) could be carried into Y, but Y's other term holds M, a maximum
    over F: a partial maximum is not summed across devices, so M is all-reduced (maximised) where
    it is made; with M whole, Y's term M*G holds no partial sum, so Y carries nothing and P is
    all-reduced too. Executed split, the layer equals the whole."""
    c = loads_cascade(CARRIED)
    assert [(r.einsum, r.op) for r in all_reduces(c, ["F"])] == [("P", "sum"), ("M", "max")]
    rng = np.random.default_rng(1)
    arrays = random_arrays(c, rng)
    values, _ = run_on_devices(c, ("F",), arrays)
    np.testing.assert_allclose(values[0]["Y"], execute(c, arrays)["Y"], rtol=1e-12)
    summed = loads_cascade(CARRIED.replace("M[b,i,d] max=", "M[b,i,d] ="))
    assert [r.einsum for r in all_reduces(summed, ["F"])] == ["Y"]  # both terms carry one partial sum: once, at Y


def test_a_devices_cascade_writes_each_partial_sum_and_reads_the_all_reduced_sum_back():
    """Cut at the all-reduces: under the optimal search on an accelerator joined by links, the
    out-projection's partial sum O is written off chip and the residual add reads O_AR back,
    both at O's bytes; the norm's partial sum of squares SG likewise."""
    spec = arch_from_dict({**arch_to_dict(load_arch("mambalaya")),
                           "system": {"link_bandwidth_bytes_per_s": 4.5e11, "link_latency_s": 3e-6}})
    ev = evaluate(spec, "mamba2-130m", PRESETS["mamba2-130m"], phase="prefill", seq_len=1024, batch=2, devices=2,
                  parallel="tensor")
    traffic = mapping_traffic(ev.cascade, ev.mapping).by_tensor
    o_bytes = 2 * 1024 * 768 * ev.cascade.tensors["O"].bits / 8
    assert traffic["O"] == (0.0, o_bytes) and traffic["O_AR"] == (o_bytes, 0.0)
    assert traffic["SG"][1] > 0 and traffic["SG_AR"][0] == traffic["SG"][1]
