"""Expert parallelism (mambalaya.cost.expert_parallel), proved on every shipped MoE layer: split
over simulated devices in the numpy executor (each device runs its share of the batch's
sequences outside the experts and its share of the experts, and the devices exchange nothing
but the rows of the model's all-to-alls, one per token-expert pair on another device), it gives
the whole layer's outputs; and the model's time, bytes, memory and refusals."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

from mambalaya.arch.system import SystemSpec
from mambalaya.cli import app
from mambalaya.cost.expert_parallel import (COMBINE, DISPATCH, all_to_all_bound_s, all_to_all_bytes, all_to_all_s,
                                            all_to_alls, expert_device_cascade, expert_loads, expert_parallel_layers,
                                            expert_side, expert_weights, is_moe, token_ranks)
from mambalaya.cost.tensor_parallel import with_rank_sizes
from mambalaya.einsum.cascade import build_cascade
from mambalaya.einsum.ir import Role, rank_of_variable
from mambalaya.einsum.routing import EXPERT_RANK, einsum_scale, routed_einsums, tensor_scale
from mambalaya.errors import SpecError
from mambalaya.execute.numpy_exec import execute, resolve_dtype, run_einsum
from mambalaya.experiments.devices import expert_parallel_need
from mambalaya.experiments.hybrid import evaluate_hybrid
from mambalaya.workloads import PRESETS, build_layer
from mambalaya.workloads.families.nemotron_h import NemotronHModel
from mambalaya.workloads.precision import load_policy
from test_tensor_parallel import LAYERS, layer_id, random_arrays, small

runner = CliRunner()
DEVICES = 2
BATCH = 2  # one sequence per device
MOE_LAYERS = [x for x in LAYERS if is_moe(x.cascade)]


#: A Nemotron-H model with MoE layers with the latent projections (its experts read ``XL``, not
#: ``XN``) and group-limited routing, none of which a shipped preset has.
NEMOTRON_MOE = NemotronHModel(d_model=16, layer_types=("mamba", "moe"), vocab_size=32, d_ff=8, n_heads=2,
                              n_kv_heads=1, head_dim=8, mamba_heads=4, mamba_headdim=4, mamba_d_state=4,
                              mamba_ngroups=1, moe_experts=8, moe_top_k=2, moe_d_ff=4, moe_shared_d_ff=4,
                              moe_n_group=4, moe_topk_group=2, moe_latent_size=8)


def proof_cascades():
    """(id, cascade, the model it is a layer of) for every shipped MoE layer form, at two
    sequences, and the Nemotron-H MoE layer above."""
    cases = [(layer_id(x), with_rank_sizes(small(x.cascade)[0], {"B": BATCH}), PRESETS[x.preset]) for x in MOE_LAYERS]
    nemotron = build_layer(NEMOTRON_MOE, phase="prefill", seq_len=4, batch=BATCH, layer_type="moe")
    return cases + [("nemotron-h-moe-latent-grouped", nemotron, NEMOTRON_MOE)]


CASES = proof_cascades()


def part(cascade, array: np.ndarray, tensor: str, rank: str, device: int) -> np.ndarray:
    """Device ``device``'s share of ``array`` along ``rank`` (the whole array if the tensor lacks it)."""
    ranks = cascade.tensors[tensor].ranks
    if rank not in ranks:
        return array
    size = array.shape[ranks.index(rank)]
    index = [slice(None)] * array.ndim
    index[ranks.index(rank)] = slice(device * size // DEVICES, (device + 1) * size // DEVICES)
    return array[tuple(index)]


def run_expert_parallel(cascade, arrays, whole):
    """Each device runs the Einsums outside the expert side on its sequences, and the expert side
    on its experts for every device's tokens, holding nothing but its experts' weights and what
    reaches it: the dispatched tensors' rows of the tokens that chose one of its experts. Only
    the rows of chosen pairs go back. Returns each device's values and the bytes sent, per
    all-to-all tensor, one row per token-expert pair on another device."""
    side = set(expert_side(cascade))
    moves = {a.tensor: a for a in all_to_alls(cascade)}
    per = cascade.size(EXPERT_RANK) // DEVICES
    home_c = with_rank_sizes(cascade, {"B": BATCH // DEVICES})
    expert_c = expert_part(cascade, per)
    held = set(expert_weights(cascade))
    dtype = resolve_dtype("float64")
    combine = next(e for e in cascade.einsums if e.name in routed_einsums(cascade) and e.name not in side)
    route = next(t for t in combine.input_tensors if t not in side and EXPERT_RANK in cascade.tensors[t].ranks)
    route_ranks = cascade.tensors[route].ranks
    chosen = whole[route] != 0  # the pairs the router chose (its weights are exactly 0 elsewhere)

    def share(mask, rank, device):  # a mask over route_ranks, one device's share along rank
        size = mask.shape[route_ranks.index(rank)] // DEVICES
        return np.take(mask, range(device * size, (device + 1) * size), axis=route_ranks.index(rank))

    home = [{t: part(cascade, a, t, "B", d) for t, a in arrays.items() if t not in held} for d in range(DEVICES)]
    local = [{t: part(cascade, arrays[t], t, EXPERT_RANK, q) for t in held} for q in range(DEVICES)]
    sent = dict.fromkeys(moves, 0.0)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        for e in cascade.einsums:
            if e.name in side:
                for q in range(DEVICES):
                    for t in e.input_tensors:
                        if t in moves and t not in local[q]:  # dispatched to q: rows of tokens choosing its experts
                            pairs = share(chosen, EXPERT_RANK, q)
                            wanted = pairs.any(axis=route_ranks.index(EXPERT_RANK))
                            rows = np.concatenate([home[d][t] for d in range(DEVICES)],
                                                  axis=cascade.tensors[t].ranks.index("B"))
                            kept = [r for r in route_ranks if r != EXPERT_RANK]
                            local[q][t] = np.where(broadcast(wanted, kept, cascade.tensors[t].ranks), rows, 0.0)
                            sent[t] += sum(share(pairs, "B", d).sum() for d in range(DEVICES) if d != q) * moves[t].row_bytes
                    local[q][e.name] = run_einsum(expert_c, e, local[q], dtype)
                continue
            for t in e.input_tensors:  # a combined tensor comes home before its first reader runs
                if t in moves and t not in home[0]:
                    for d in range(DEVICES):
                        parts = []
                        for q in range(DEVICES):
                            rows = part(cascade, local[q][t], t, "B", d)
                            pairs = share(share(chosen, "B", d), EXPERT_RANK, q)
                            if q != d:  # only the chosen pairs' rows come back
                                rows = np.where(broadcast(pairs, route_ranks, cascade.tensors[t].ranks), rows, 0.0)
                                sent[t] += pairs.sum() * moves[t].row_bytes
                            parts.append(rows)
                        home[d][t] = np.concatenate(parts, axis=cascade.tensors[t].ranks.index(EXPERT_RANK))
            for d in range(DEVICES):
                home[d][e.name] = run_einsum(home_c, e, home[d], dtype)
    return home, sent


def expert_part(cascade, per: int):
    """The expert side alone, over ``per`` experts: what a device runs for every token, its
    dispatched tensors as its inputs and its combined ones as its outputs."""
    side = expert_side(cascade)
    read = {t for n in side for t in cascade.einsum(n).input_tensors}
    combined = {a.tensor for a in all_to_alls(cascade) if a.direction == COMBINE}
    tensors = []
    for t, spec in cascade.tensors.items():
        if t in side:
            tensors.append(replace(spec, role=Role.OUTPUT) if t in combined else spec)
        elif t in read:
            tensors.append(spec if spec.role == Role.WEIGHT else replace(spec, role=Role.INPUT, initial=None, updates=None))
    used = {r for spec in tensors for r in spec.ranks} | {rank_of_variable(v) for n in side
                                                         for v in cascade.einsum(n).iteration_variables}
    ranks = [replace(r, size=per) if r.name == EXPERT_RANK else r for r in cascade.ranks.values() if r.name in used]
    return build_cascade(name=f"{cascade.name}-experts", params=cascade.params, ranks=ranks, tensors=tensors,
                         einsums=[cascade.einsum(n) for n in side])


def broadcast(mask: np.ndarray, mask_ranks, ranks) -> np.ndarray:
    """``mask`` (over ``mask_ranks``) laid out over ``ranks``, size 1 along the ranks it lacks."""
    present = [r for r in ranks if r in mask_ranks]
    out = np.transpose(mask, [list(mask_ranks).index(r) for r in present])
    sizes = iter(out.shape)
    return out.reshape([next(sizes) if r in mask_ranks else 1 for r in ranks])


@pytest.mark.parametrize("name,cascade,config", CASES, ids=[c[0] for c in CASES])
def test_a_moe_layer_split_over_devices_by_its_experts_equals_the_whole_layer(name, cascade, config):
    rng = np.random.default_rng(1)
    arrays = random_arrays(cascade, rng)
    arrays.update(config.constants(cascade) if hasattr(config, "constants") else {})
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        whole = execute(cascade, arrays, keep="all")
    home, sent = run_expert_parallel(cascade, arrays, whole)
    for t in cascade.output_tensors():
        for d in range(DEVICES):
            np.testing.assert_allclose(home[d][t], part(cascade, whole[t], t, "B", d), rtol=1e-9, atol=1e-12,
                                       err_msg=f"{name}: {t} on device {d}")
    assert set(sent) == {a.tensor for a in all_to_alls(cascade)}
    assert all(v > 0 for v in sent.values()), "the random router sends some pairs to the other device"


def test_the_all_to_alls_are_the_experts_input_and_output_rows():
    """Jamba's experts read the normed input ``XN`` and write ``EO`` (a row of the model width
    each way); Nemotron-H's latent experts read ``XL`` and write ``EO`` in the latent width. The
    router's weight is no expert's weight; the token ranks are batch and positions."""
    jamba = build_layer(PRESETS["jamba-v0.1"], phase="prefill", seq_len=64, batch=2, layer_type="mamba-moe")
    assert all_to_alls(jamba) == (all_to_alls(jamba)[0].__class__("FF_XN", DISPATCH, 4096 * 2),
                                  all_to_alls(jamba)[0].__class__("FF_EO", COMBINE, 4096 * 2))
    assert expert_weights(jamba) == ("FF_WG", "FF_WU", "FF_WDN") and token_ranks(jamba) == ("B", "I")
    nemotron = CASES[-1][1]
    moves = {a.tensor: a for a in all_to_alls(nemotron)}
    latent = nemotron.size("A")
    assert [(t, a.direction) for t, a in moves.items()] == [("XL", DISPATCH), ("EO", COMBINE)]
    assert moves["XL"].row_bytes == moves["EO"].row_bytes == latent * nemotron.tensors["XL"].bits / 8
    mamba = build_layer(PRESETS["jamba-v0.1"], phase="prefill", seq_len=64, batch=2, layer_type="mamba")
    assert not is_moe(mamba) and all_to_alls(mamba) == ()


def test_each_devices_load_follows_the_routing_and_the_most_loaded_device_is_costed():
    assert expert_loads(16, 4, "uniform") == (0.25,) * 4
    histogram = [0.125] * 4 + [0.0625] * 8 + [0.0] * 4  # device 0 gets half the pairs
    assert expert_loads(16, 4, histogram) == (0.5, 0.25, 0.25, 0.0)
    with pytest.raises(SpecError, match="3 does not divide 16"):
        expert_loads(16, 3, "uniform")
    layer = build_layer(PRESETS["jamba-v0.1"], phase="prefill", seq_len=64, batch=2, layer_type="mamba-moe")
    tokens = 4 * 64  # the whole batch: four sequences, two per device
    even = expert_device_cascade(layer, 4, "uniform", total_tokens=tokens)
    assert einsum_scale(even, "FF_GT") == einsum_scale(layer, "FF_GT") == 2 / 16  # its tokens' pairs, top-2 of 16
    assert tensor_scale(even, "FF_WG") == 4 / 16  # the four experts it holds, each receiving tokens
    heavy = expert_device_cascade(layer, 4, histogram, total_tokens=tokens)
    assert einsum_scale(heavy, "FF_GT") == 2 * einsum_scale(even, "FF_GT")  # half the pairs, twice its share
    assert tensor_scale(heavy, "FF_WG") == 4 / 16
    # a decode step of two tokens on four devices: each device's four experts get at most one pair each
    step = build_layer(PRESETS["jamba-v0.1"], phase="decode", seq_len=64, batch=1, layer_type="mamba-moe")
    assert tensor_scale(expert_device_cascade(step, 4, "uniform", total_tokens=2), "FF_WG") == 1 / 16


def test_an_all_to_all_costs_a_call_a_step_and_the_busiest_devices_bytes():
    """Uniform routing over N devices: each device sends (N-1)/N of its tokens' pairs and
    receives as many; the dispatch and the combine each take the fixed cost, one link latency
    and those bytes over the link."""
    system = SystemSpec(link_bandwidth_bytes_per_s=450e9, link_latency_s=3e-6, collective_latency_s=6.6e-6)
    assert all_to_all_s(9e6, system) == pytest.approx(6.6e-6 + 3e-6 + 9e6 / 450e9)
    assert all_to_all_bound_s(9e6, system) == pytest.approx(9e6 / 450e9)
    layer = build_layer(PRESETS["jamba-v0.1"], phase="prefill", seq_len=64, batch=2, layer_type="mamba-moe")
    row = 4096 * 2
    assert all_to_all_bytes(layer, expert_loads(16, 4, "uniform"), 2, DISPATCH) == pytest.approx(128 * 2 * 3 / 4 * row)
    # the most loaded device receives the most: three others' pairs to it at half the load
    loads = (0.5, 0.25, 0.25, 0.0)
    assert all_to_all_bytes(layer, loads, 2, DISPATCH) == pytest.approx(3 * 128 * 2 * 0.5 * row)
    costed = expert_parallel_layers(system, layer, 4, "uniform", count=16, layer_s=1e-3)
    assert costed.all_to_all_s == pytest.approx(2 * all_to_all_s(128 * 2 * 3 / 4 * row, system))
    assert costed.all_to_all_j is None  # no link energy in the spec
    with_energy = system.model_copy(update={"link_energy_pj_per_bit": 10.0})
    sent = 4 * 128 * 2 * 3 / 4 * 2 * row  # every device, both directions
    assert expert_parallel_layers(with_energy, layer, 4, "uniform", count=16, layer_s=1e-3).all_to_all_j == \
        pytest.approx(8 * sent * 10e-12)


# -- evaluate over several devices, expert parallel ----------------------------------------------

def test_jamba_expert_parallel_sums_its_parts_and_holds_half_the_experts():
    config = PRESETS["jamba-v0.1"]
    hv = evaluate_hybrid("gpu-h100", "jamba-v0.1", config, phase="prefill", seq_len=512, batch=4, devices=2,
                         parallel="expert")
    ep = hv.layer_split
    assert ep.strategy == "expert" and ep.devices == 2
    assert hv.model_latency_s == pytest.approx(ep.layers_s + ep.interconnect_s)
    assert ep.layers_s == pytest.approx(sum(ev.result.model_latency_s for ev in hv.layers.values()))
    assert ep.layers["mamba"].all_to_alls == () and ep.layers["attention"].all_to_all_s == 0.0
    assert [a.tensor for a in ep.layers["mamba-moe"].all_to_alls] == ["FF_XN", "FF_EO"]
    assert {ev.batch for ev in hv.layers.values()} == {4} and {ev.cascade.size("B") for ev in hv.layers.values()} == {2}
    t = hv.totals()
    assert t["parallel"] == "expert" and t["all_to_all_bytes"] == pytest.approx(ep.collective_bytes)
    experts = 16 * 16 * 3 * 4096 * 14336  # 16 MoE layers of 16 experts, gate, up and down
    need = expert_parallel_need(config, 2, batch=4, seq_len=512, bits=16, policy=load_policy("reference-kernels"))
    assert need.parameters == config.model_parameters() - experts // 2


def test_expert_parallel_refuses_what_it_cannot_split_naming_why():
    jamba = PRESETS["jamba-v0.1"]
    with pytest.raises(SpecError, match="no mixture-of-experts layers"):
        evaluate_hybrid("gpu-h100", "bamba-9b", PRESETS["bamba-9b"], phase="prefill", seq_len=256, batch=2, devices=2,
                        parallel="expert")
    with pytest.raises(SpecError, match="does not divide the batch"):
        evaluate_hybrid("gpu-h100", "jamba-v0.1", jamba, phase="decode", seq_len=256, batch=1, devices=2,
                        parallel="expert")
    with pytest.raises(SpecError, match="3 does not divide 16"):
        evaluate_hybrid("gpu-h100", "jamba-v0.1", jamba, phase="decode", seq_len=256, batch=3, devices=3,
                        parallel="expert")


def test_parallel_best_weighs_expert_parallelism_for_a_moe_model_and_the_cli_prints_its_line():
    result = runner.invoke(app, ["evaluate", "--model", "granite-4.0-h-tiny", "--arch", "gpu-h100", "--phase", "decode",
                                 "--seq-len", "1024", "--batch", "16", "--devices", "4", "--parallel", "best"])
    assert result.exit_code == 0, result.output
    assert "expert parallel over 4 devices" in result.output or "kept tensor" in result.output
    assert "--parallel best: pipeline" in result.output and "; expert " in result.output
    one = runner.invoke(app, ["evaluate", "--model", "mamba-130m", "--arch", "gpu-h100", "--devices", "2",
                              "--parallel", "expert"])
    assert one.exit_code != 0 and "no mixture-of-experts layers" in one.output
