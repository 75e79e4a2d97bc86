"""Sequence parallelism (mambalaya.cost.sequence_parallel), proved on every shipped prefill layer
it splits: each device runs its part of the positions in the numpy executor, receiving nothing
but the model's halos and the state passed along the devices, and every output equals the whole
layer's; the bytes it receives are the model's; every other layer is refused naming the Einsum."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mambalaya.arch import load_arch
from mambalaya.cost.sequence_parallel import (CORRECTED, CUT, HALO, PRODUCT, PRODUCT_START, check_sequence_split,
                                              crossings, halos, sequence_device_cascade, sequence_parallel_layers,
                                              sequence_ranks, state_bytes)
from mambalaya.einsum.ir import Role
from mambalaya.errors import SpecError
from mambalaya.execute.numpy_exec import execute, resolve_dtype, run_einsum
from mambalaya.workloads.shipped import shipped_layers
from test_tensor_parallel import layer_id, random_arrays, small

DTYPE = resolve_dtype("float64")


def prefill_layers():
    """Every shipped prefill layer form at 32 positions, the chunked forms at 512 (two chunks of
    256, a multiple of every preset's chunk length)."""
    short = [x for x in shipped_layers(seq_len=32) if x.phase == "prefill" and "C" not in x.cascade.ranks]
    return short + [x for x in shipped_layers(seq_len=512) if x.phase == "prefill" and "C" in x.cascade.ranks]


LAYERS = prefill_layers()
SPLITS, REFUSED = [], []
for _layer in LAYERS:
    try:
        check_sequence_split(_layer.cascade, sequence_ranks(_layer.cascade))
        SPLITS.append(_layer)
    except SpecError as _err:
        REFUSED.append((_layer, str(_err)))


def part(cascade, tensor: str, array: np.ndarray, device: int, devices: int) -> np.ndarray:
    """Device ``device``'s positions of ``array``: its share of every position rank."""
    split = set(sequence_ranks(cascade))
    index = tuple(slice(device * (n := cascade.size(r)) // devices, (device + 1) * n // devices) if r in split
                  else slice(None) for r in cascade.tensors[tensor].ranks)
    return array[index]


def last_positions(cascade, tensor: str, array: np.ndarray, rank: str, depth: int) -> np.ndarray:
    axis = cascade.tensors[tensor].ranks.index(rank)
    return np.take(array, range(array.shape[axis] - depth, array.shape[axis]), axis=axis)


def run_on_devices(cascade, arrays, devices: int):
    """Each device in turn runs its part Einsum by Einsum, given the previous device's halos and
    passed state; returns each device's values and the bytes each device received."""
    device_part = sequence_device_cascade(cascade, devices)
    split = sequence_ranks(cascade)
    found = check_sequence_split(cascade, split)
    received, values = [], []
    for d in range(devices):
        got = 0.0
        v = {t: part(cascade, t, a, d, devices) for t, a in arrays.items() if t in device_part.tensors}
        for h in halos(cascade, split):
            initial = device_part.tensors[h.tensor].initial
            if d > 0:  # the previous device's last positions
                v[initial] = last_positions(device_part, h.tensor, values[d - 1][h.tensor], h.rank, h.positions)
                got += v[initial].size * device_part.tensors[initial].bits / 8
            elif initial.endswith(HALO):  # the first device reads zeros before the sequence, as the layer does
                v[initial] = np.zeros(device_part.shape(initial))
        for c in found:
            v[c.einsum + PRODUCT_START] = np.ones(device_part.shape(c.einsum + PRODUCT_START))
            if d > 0:  # the previous device's true last state: its own plus its product times what it received
                prev = values[d - 1]
                ranks = device_part.tensors[c.einsum].ranks
                product_ranks = device_part.tensors[c.einsum + PRODUCT].ranks  # the coefficients' (Mamba-2: chunk, head)
                last = np.take(prev[c.einsum + PRODUCT], -1, axis=product_ranks.index(c.rank))
                kept = [r for r in product_ranks if r != c.rank]
                for n, r in enumerate(r for r in ranks if r != c.rank):  # broadcast over the state's other ranks
                    if r not in kept:
                        last = np.expand_dims(last, n)
                v[c.incoming] = np.take(prev[c.einsum], -1, axis=ranks.index(c.rank)) + last * prev[c.incoming]
                got += v[c.incoming].size * device_part.tensors[c.incoming].bits / 8
            elif c.incoming not in v:  # no initial state in the layer: zeros
                v[c.incoming] = np.zeros(device_part.shape(c.incoming))
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            for e in device_part.einsums:
                v[e.name] = run_einsum(device_part, e, v, DTYPE)
                if e.name + CUT in device_part.tensors:  # written off chip, read back after the state arrives
                    v[e.name + CUT] = v[e.name]
        values.append(v)
        received.append(got)
    return device_part, values, received


@pytest.mark.parametrize("layer", SPLITS, ids=[layer_id(x) for x in SPLITS])
def test_a_prefill_split_over_devices_by_its_positions_equals_the_whole_layer(layer):
    cascade = small(layer.cascade)[0]
    devices = 4 if layer.preset == "mamba-130m" else 2  # four: three states passed one after another
    rng = np.random.default_rng(2)
    arrays = random_arrays(cascade, rng)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        whole = execute(cascade, arrays, keep="all")
    device_part, values, received = run_on_devices(cascade, arrays, devices)
    split = set(sequence_ranks(cascade))
    for t in cascade.output_tensors():
        name = t + CORRECTED if t + CORRECTED in device_part.tensors else t
        if split & set(cascade.tensors[t].ranks):
            for d in range(devices):
                np.testing.assert_allclose(values[d][name], part(cascade, t, whole[t], d, devices), rtol=1e-9,
                                           atol=1e-12, err_msg=f"{t} on device {d}")
        else:  # a final state: the last device's is the layer's
            np.testing.assert_allclose(values[-1][name], whole[t], rtol=1e-9, atol=1e-12, err_msg=t)
    costed = sequence_parallel_layers(load_arch("gpu-h100").system, cascade, devices, count=1, layer_s=0.0)
    assert received[0] == 0.0
    assert received[1:] == [pytest.approx(costed.halo_bytes + costed.state_bytes)] * (devices - 1)


def test_every_mamba_layer_splits_and_attention_and_the_delta_rule_are_refused_naming_the_einsum():
    split_ids = {layer_id(x) for x in SPLITS}
    assert {"mamba-130m-prefill-False", "mamba2-130m-prefill-chunked-False", "mamba2-130m-prefill-recurrent-False"} \
        <= split_ids
    for layer, message in REFUSED:
        assert message.startswith("Einsum "), message
        kinds = set(layer.cascade.regions)
        assert "attention" in kinds or layer.preset.startswith("olmo") or "gdn" in kinds or "delta" in message, \
            (layer_id(layer), message)
    attention = [m for x, m in REFUSED if "attention" in x.cascade.regions]
    assert attention and all("ring attention" in m for m in attention)


def test_the_state_crosses_and_its_readers_are_corrected_after_it_arrives():
    """Mamba-1: the scan H passes its state; YS, its reader, is corrected; what YS's correction and
    the rest read from the first pass is written off chip (``_SP``); the conv input's last three
    positions are the halo."""
    layer = next(x for x in SPLITS if layer_id(x) == "mamba-130m-prefill-False").cascade
    [c] = crossings(layer)
    assert (c.einsum, c.rank, c.incoming) == ("H", "I", "H_IN")
    [h] = halos(layer, sequence_ranks(layer))
    assert (h.tensor, h.rank, h.positions) == ("XI", "I", 3)
    assert h.bytes == 3 * layer.size("B") * layer.size("E") * 2
    device = sequence_device_cascade(layer, 2)
    assert device.size("I") == layer.size("I") // 2
    assert str(device.einsum("YS_C")) == "YS_C[b,i,e] = H_P_SP[b,i,e,n]*H_IN[b,e,n]*CM_SP[b,i,n]"
    assert str(device.einsum("YD")).startswith("YD[b,i,e] = YS_T[b,i,e]")
    assert device.tensors["H_P_SP"].role == Role.INPUT and device.tensors["H_P"].role == Role.OUTPUT
    assert state_bytes(layer, c) == math.prod(layer.size(r) for r in ("B", "E", "N")) * layer.tensors["H"].bits / 8
    assert sequence_device_cascade(layer, 1) is layer
    with pytest.raises(SpecError, match="does not divide 32"):
        sequence_device_cascade(layer, 3)
    with pytest.raises(SpecError, match="fewer than the 3 earlier positions of XI"):  # 2 positions a device
        sequence_device_cascade(layer, 16)


# -- evaluate over several devices, sequence parallel --------------------------------------------

def test_a_mamba2_prefill_sequence_parallel_adds_its_halos_and_passed_states_to_its_part():
    from mambalaya.experiments.evaluate import evaluate
    from mambalaya.workloads import PRESETS

    config = PRESETS["mamba2-130m"]
    ev = evaluate("gpu-h100", "mamba2-130m", config, phase="prefill", seq_len=4096, batch=2, devices=4,
                  parallel="sequence")
    sp, system = ev.layer_split, load_arch("gpu-h100").system
    assert sp.strategy == "sequence" and ev.cascade.size("I") == 1024 and ev.cascade.size("C") == 4
    [layer] = sp.layers.values()
    assert [h.tensor for h in layer.halos] == ["XI", "BI", "CI"] and [c.einsum for c in layer.crossings] == ["HC"]
    transfers = sum(system.transfer_s(h.bytes) for h in layer.halos) + 3 * system.transfer_s(layer.state_bytes)
    assert layer.transfer_s == pytest.approx(transfers)
    assert ev.model_latency_s == pytest.approx(24 * (ev.result.latency_s + transfers))
    t = ev.totals()
    assert t["parallel"] == "sequence" and t["passed_bytes"] == pytest.approx(24 * (layer.halo_bytes + layer.state_bytes))
    single = evaluate("gpu-h100", "mamba2-130m", config, phase="prefill", seq_len=4096, batch=2)
    assert ev.model_latency_s < single.model_latency_s
    assert ev.dram.used_bytes == single.dram.used_bytes  # every weight and state on each device


def test_sequence_parallel_refuses_a_decode_step_and_attention_naming_why():
    from mambalaya.experiments.evaluate import evaluate
    from mambalaya.experiments.hybrid import evaluate_hybrid
    from mambalaya.workloads import PRESETS

    with pytest.raises(SpecError, match="a decode step has one position"):
        evaluate("gpu-h100", "mamba2-130m", PRESETS["mamba2-130m"], phase="decode", seq_len=512, batch=2, devices=2,
                 parallel="sequence")
    with pytest.raises(Exception, match="Einsum SC reads .* ring attention"):
        evaluate_hybrid("gpu-h100", "bamba-9b", PRESETS["bamba-9b"], phase="prefill", seq_len=1024, batch=1, devices=2,
                        parallel="sequence")


def test_the_cli_prints_the_sequence_parallel_line_and_best_weighs_it():
    from typer.testing import CliRunner

    from mambalaya.cli import app

    result = CliRunner().invoke(app, ["evaluate", "--model", "mamba2-130m", "--arch", "gpu-h100", "--seq-len", "8192",
                                      "--devices", "2", "--parallel", "best"])
    assert result.exit_code == 0, result.output
    assert "; sequence " in result.output and "--parallel best: pipeline" in result.output
    one = CliRunner().invoke(app, ["evaluate", "--model", "mamba2-130m", "--arch", "gpu-h100", "--seq-len", "8192",
                                   "--devices", "2", "--parallel", "sequence"])
    assert one.exit_code == 0 and "sequence parallel over 2 devices" in one.output and "HC state" in one.output


def test_the_running_product_has_its_coefficients_ranks() -> None:
    """A device's running product of the crossing recurrence's coefficients has the ranks the
    coefficients have: Mamba-2's decay (one value per chunk and head) makes HC_P of (B, C, G, R),
    where it was kept at the state's shape (16.8 MB chunked, 8.6 GB a layer recurrent on
    mamba2-1.3b at L 2048 on 4 devices, 39% of the recurrent time); Mamba-1's AD has every state
    rank, so its H_P keeps them."""
    from mambalaya.workloads import PRESETS, build_layer

    m2 = sequence_device_cascade(build_layer(PRESETS["mamba2-130m"], phase="prefill", seq_len=1024, batch=2,
                                             scan="chunked"), 4)
    assert m2.tensors["HC" + PRODUCT].ranks == ("B", "C", "G", "R")
    m2r = sequence_device_cascade(build_layer(PRESETS["mamba2-130m"], phase="prefill", seq_len=1024, batch=2,
                                              scan="recurrent"), 4)
    assert m2r.tensors["H" + PRODUCT].ranks == ("B", "I", "G", "R")
    m1 = sequence_device_cascade(build_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=1024, batch=2), 4)
    assert m1.tensors["H" + PRODUCT].ranks == m1.tensors["H"].ranks
