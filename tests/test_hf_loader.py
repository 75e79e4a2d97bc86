"""The shared weights-loader core: a family other than Mamba-1/2 plugs in with only its keys.

A hybrid checkpoint (layer 0 a Mamba-1 block, layer 1 an MLP block, as in hybrid models) is
written to a .safetensors file; the MLP layer is read through ``read_layer`` with nothing but a
``LayerKeys``, and the Mamba layer of the same file still loads through ``load_mamba1_layer``.
"""

from __future__ import annotations

import numpy as np
import pytest

from mambalaya.workloads.hf.loader import LayerKeys, WeightLoadError, read_layer
from mambalaya.workloads.hf.weights import WeightLoadError as Mamba1WeightLoadError
from mambalaya.workloads.hf.weights import load_mamba1_layer

D, E, N, R, K, F = 8, 16, 4, 2, 4, 24

MLP_KEYS = LayerKeys(
    family="hybrid-MLP",
    required=("norm.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"),
    block="the MLP block (RMSNorm -> up -> down)",
    scope="The test models an MLP block without biases.",
    unsupported={"mlp.up_proj.bias": "up_proj has a bias"},
    missing_hints={"mlp.down_proj.weight": " (no down projection)"},
)


def _mamba1_block(rng: np.random.Generator) -> dict[str, np.ndarray]:
    shapes = {
        "norm.weight": (D,), "mixer.in_proj.weight": (2 * E, D), "mixer.conv1d.weight": (E, 1, K),
        "mixer.conv1d.bias": (E,), "mixer.x_proj.weight": (R + 2 * N, E), "mixer.dt_proj.weight": (E, R),
        "mixer.dt_proj.bias": (E,), "mixer.A_log": (E, N), "mixer.D": (E,), "mixer.out_proj.weight": (D, E),
    }
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def _mlp_block(rng: np.random.Generator) -> dict[str, np.ndarray]:
    shapes = {"norm.weight": (D,), "mlp.up_proj.weight": (F, D), "mlp.down_proj.weight": (D, F)}
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def _hybrid(mamba: dict[str, np.ndarray], mlp: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {**{f"backbone.layers.0.{k}": v for k, v in mamba.items()},
            **{f"backbone.layers.1.{k}": v for k, v in mlp.items()}}


@pytest.fixture()
def blocks() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    rng = np.random.default_rng(14)
    return _mamba1_block(rng), _mlp_block(rng)


def test_a_new_family_reads_its_layer_from_a_hybrid_file(tmp_path, blocks) -> None:
    from safetensors.numpy import save_file

    mamba, mlp = blocks
    path = tmp_path / "hybrid.safetensors"
    save_file(_hybrid(mamba, mlp), str(path))

    tensors = read_layer(path, 1, MLP_KEYS)
    assert tensors.prefix == "backbone.layers.1."
    assert str(path) in tensors.where
    for key, value in mlp.items():
        np.testing.assert_array_equal(tensors[key], value)
    tensors.require_floating()
    tensors.require_shapes({"mlp.up_proj.weight": (F, D), "mlp.down_proj.weight": (D, F)}, f"D={D}, F={F}")

    # The Mamba layer of the same file loads as it does from a bare block.
    from_hybrid = load_mamba1_layer(path, 0)
    from_bare = load_mamba1_layer(mamba)
    assert from_hybrid.keys() == from_bare.keys()
    for name in from_bare:
        np.testing.assert_array_equal(from_hybrid[name], from_bare[name])


def test_a_new_family_gets_the_cores_key_and_shape_errors(blocks) -> None:
    mamba, mlp = blocks
    assert WeightLoadError is Mamba1WeightLoadError  # one error type, importable from either module

    with_bias = _hybrid(mamba, {**mlp, "mlp.up_proj.bias": np.zeros(F, np.float32)})
    with pytest.raises(WeightLoadError, match=r"Unexpected key 'backbone\.layers\.1\.mlp\.up_proj\.bias'.*up_proj has a bias\. "
                                              r"The test models an MLP block without biases\."):
        read_layer(with_bias, 1, MLP_KEYS)
    unknown = _hybrid(mamba, {**mlp, "mlp.gate.weight": np.zeros(F, np.float32)})
    with pytest.raises(WeightLoadError, match=r"it is not a parameter of the MLP block \(RMSNorm -> up -> down\)"):
        read_layer(unknown, 1, MLP_KEYS)

    no_down = _hybrid(mamba, {k: v for k, v in mlp.items() if k != "mlp.down_proj.weight"})
    with pytest.raises(WeightLoadError, match=r"Missing key 'backbone\.layers\.1\.mlp\.down_proj\.weight' in layer 1 .*"
                                              r"\(no down projection\).*A hybrid-MLP layer needs norm\.weight"):
        read_layer(no_down, 1, MLP_KEYS)
    # The Mamba layer is not an MLP layer: its mixer keys are unexpected there.
    with pytest.raises(WeightLoadError, match=r"Unexpected key 'backbone\.layers\.0\.mixer\."):
        read_layer(_hybrid(mamba, mlp), 0, MLP_KEYS)
    with pytest.raises(WeightLoadError, match=r"Layer 2 is not in .*layers present are 0-1"):
        read_layer(_hybrid(mamba, mlp), 2, MLP_KEYS)

    tensors = read_layer(_hybrid(mamba, mlp), 1, MLP_KEYS)
    with pytest.raises(WeightLoadError, match=r"'backbone\.layers\.1\.mlp\.up_proj\.weight' .*shape \[24, 8\], expected "
                                              r"\[25, 8\] \(F=25\)"):
        tensors.require_shapes({"mlp.up_proj.weight": (F + 1, D)}, "F=25")
    with pytest.raises(WeightLoadError, match=r"'backbone\.layers\.1\.norm\.weight' .*expected a 2-d tensor"):
        tensors.require_ndim("norm.weight", 2)
    as_ints = read_layer(_hybrid(mamba, {**mlp, "norm.weight": np.ones(D, np.int32)}), 1, MLP_KEYS)
    with pytest.raises(WeightLoadError, match=r"'backbone\.layers\.1\.norm\.weight' .*dtype int32; expected floating point"):
        as_ints.require_floating()
