"""Precision policies: the shipped widths tensor by tensor, how they reach every model, the CLI,
bad input, and an executor that stores each tensor at its width still tracking transformers."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from mambalaya.cli import app
from mambalaya.errors import SpecError
from mambalaya.execute import execute
from mambalaya.execute.numpy_exec import round_to_bfloat16
from mambalaya.fusion.mapping import unfused_mapping
from mambalaya.cost.traffic import mapping_traffic
from mambalaya.workloads import PRESETS, build_layer
from mambalaya.workloads.blocks.mamba1 import Mamba1Config, mamba1_layer
from mambalaya.workloads.families.bamba import HybridConfig, hybrid_layer
from mambalaya.workloads.blocks.mamba2 import Mamba2Config, mamba2_layer
from mambalaya.workloads.blocks.gated_deltanet import GatedDeltaNetConfig, gdn_layer
from mambalaya.workloads.precision import (
    apply_policy,
    family_tensor_names,
    load_policy,
    loads_policy,
    policy_rows,
    shipped_policies,
    shipped_policy_text,
)

runner = CliRunner()

#: The float32 tensors of reference-kernels, as the README's table documents them (its sources
#: are in the policy file): everything else is at the design's width.
FLOAT32 = {
    "mamba1": {"X", "XO", "XC", "SS", "RS", "DELTA", "A", "AD", "BX", "H", "H0", "HN", "YS", "DS", "G"},
    "mamba2": {"X", "XO", "XC", "BC", "CC", "SS", "RS", "DELTA", "A", "DS", "AD", "BX", "H", "YS", "ACS", "LD", "CB",
               "YDG", "DC", "ST", "CD", "DO", "YO", "H0", "HN", "GZ", "YG", "SG", "RG"},
    # a hybrid layer: the Mamba-2 mixer's kernel widths but a model-dtype residual stream (X, XO),
    # the softmax statistics and running output, and the norms (the MLP's too) in float32
    "bamba": {"XC", "BC", "CC", "SS", "RS", "DELTA", "A", "DS", "AD", "BX", "H", "YS", "ACS", "LD", "CB", "YDG", "DC",
              "ST", "CD", "DO", "YO", "H0", "HN", "GZ", "YG", "SG", "RG", "MX", "EX", "SM", "MR", "CF", "LR", "OR",
              "FF_SS", "FF_RS"},
    # Gated DeltaNet (fla's kernels under transformers' olmo_hybrid): the norms' statistics, the
    # conv before SiLU, the log decay and its cumulative sums and decays, the state and the
    # carried state, the in-chunk products and on-chip output accumulators in float32; the
    # residual stream, TI, U, W and the chunk-boundary states HC as written (the model dtype)
    "gated_deltanet": {"SS", "RS", "AI", "A", "GL", "QC", "KC", "VC", "SQ", "RQ", "SK", "RK", "AD", "KB", "H", "ACS",
                       "LD", "DO", "DC", "CD", "KK", "QK", "AS", "ST", "YI", "YO", "H0", "HN", "SG", "RG", "GZ"},
}

CFG1 = Mamba1Config(d_model=16)
CFG2 = Mamba2Config(d_model=64, headdim=16, d_state=8, chunk_size=4)
CFG3 = HybridConfig(d_model=32, layer_types=("mamba", "attention"), d_ff=48, n_heads=4, n_kv_heads=2, mamba_heads=4,
                    mamba_headdim=16, mamba_d_state=8, mamba_chunk_size=4, vocab_size=16)
CFG4 = GatedDeltaNetConfig(d_model=32, layer_types=("linear_attention", "full_attention"), num_k_heads=2,
                           num_v_heads=4, k_head_dim=8, v_head_dim=8, chunk_size=4, d_ff=48, n_heads=4, n_kv_heads=2,
                           vocab_size=16)
FORMS = {
    "mamba1 prefill": mamba1_layer(CFG1, batch=1, seq_len=4),
    "mamba1 prefill with state": mamba1_layer(CFG1, batch=1, seq_len=4, state_io=True),
    "mamba1 decode": mamba1_layer(CFG1, batch=1, seq_len=1, phase="decode"),
    "mamba2 recurrent": mamba2_layer(CFG2, batch=1, seq_len=8, scan="recurrent", state_io=True),
    "mamba2 chunked": mamba2_layer(CFG2, batch=1, seq_len=8, scan="chunked", state_io=True),
    "mamba2 decode": mamba2_layer(CFG2, batch=1, seq_len=1, phase="decode"),
    "bamba mamba chunked": hybrid_layer(CFG3, "mamba", batch=1, seq_len=8),
    "bamba mamba decode": hybrid_layer(CFG3, "mamba", batch=1, seq_len=8, phase="decode"),
    "bamba attention": hybrid_layer(CFG3, "attention", batch=1, seq_len=8),
    "bamba attention online decode": hybrid_layer(CFG3, "attention", batch=1, seq_len=8, phase="decode", softmax="online"),
    "gated_deltanet recurrent": gdn_layer(CFG4, batch=1, seq_len=8, scan="recurrent", state_io=True),
    "gated_deltanet chunked": gdn_layer(CFG4, batch=1, seq_len=8, scan="chunked", state_io=True),
    "gated_deltanet decode": gdn_layer(CFG4, batch=1, seq_len=1, phase="decode"),
}


def test_shipped_policies() -> None:
    assert {"uniform", "reference-kernels"} <= set(shipped_policies())


@pytest.mark.parametrize("name", shipped_policies())
def test_shipped_policies_name_only_real_tensors(name: str) -> None:
    """Loading a shipped policy skips the check that each family entry names a tensor of that
    family's layers (it builds every family's cascades); this test is that check, in full,
    and it does bite: a misspelt entry is refused."""
    text = shipped_policy_text(name)
    assert loads_policy(text) == load_policy(name)
    if "families:" in text and "DELTA:" in text:
        with pytest.raises(SpecError, match="names no tensor of a mamba1 layer"):
            loads_policy(text.replace("DELTA:", "DELTAA:", 1))


@pytest.mark.parametrize("form", list(FORMS))
def test_reference_kernels_widths_tensor_by_tensor(form: str) -> None:
    family = form.split()[0]
    cascade = apply_policy(FORMS[form], "reference-kernels", 16)
    for name, spec in cascade.tensors.items():
        assert spec.bits == (32 if name in FLOAT32[family] else 16), (form, name, spec.bits)
    # a design of another width moves only the 'design' tensors
    wide = apply_policy(FORMS[form], "reference-kernels", 8)
    assert {n for n, s in wide.tensors.items() if s.bits == 32} == {n for n in cascade.tensors if n in FLOAT32[family]}


@pytest.mark.parametrize("form", list(FORMS))
def test_uniform_is_the_design_width(form: str) -> None:
    cascade = apply_policy(FORMS[form], "uniform", 16)
    assert cascade is FORMS[form]  # nothing to change: the same cascade
    assert {s.bits for s in apply_policy(FORMS[form], "uniform", 32).tensors.values()} == {32}


def test_every_named_width_has_a_source() -> None:
    policy = load_policy("reference-kernels")
    for family, entries in policy.families.items():
        for tensor in entries:
            source = policy.sources.get(f"{family}.{tensor}", "")
            assert any(x in source for x in ("ss ", "hf ", "fla ", "causal-conv1d", "flash-attention")), tensor
            assert any(x in source for x in (".py", ".cuh", ".cpp", ".cu", ".h ")), tensor
    assert policy.sources["default"]
    rows = policy_rows(policy, FORMS["mamba1 prefill"], 16)
    delta = next(r for r in rows if r["tensor"] == "DELTA")
    assert delta["bits"] == 32 and delta["rule"] == "mamba1.DELTA" and "selective_scan" in delta["source"]


def test_names_cover_every_form() -> None:
    for form, cascade in FORMS.items():
        assert set(cascade.tensors) <= family_tensor_names(form.split()[0])


def _statistic_kind(cascade, einsum) -> str | None:
    """What the algebra says an Einsum computes, for the statistics a reference kernel keeps in
    float32: a max (a max-reduction or a running max), an exponential, a sum of exponentials, a
    sum of squares (reduced over a rank: a norm's), or a reciprocal root of one."""
    from mambalaya.einsum.ir import Binary, Unary, accesses, walk

    functions = {n.fn for n in walk(einsum.expr) if isinstance(n, Unary)}
    functions |= {n.op for n in walk(einsum.expr) if isinstance(n, Binary)}
    reads, name = accesses(einsum.expr), einsum.output.tensor
    reduced = {v for a in reads for v in a.variables} - set(einsum.output.variables)
    producers = {e.output.tensor: e for e in cascade.einsums}

    def is_exp(tensor: str) -> bool:
        return tensor in producers and any(isinstance(n, Unary) and n.fn == "exp" for n in walk(producers[tensor].expr))

    if einsum.reduce_op == "max" or "max" in functions:
        return "max"
    if "rsqrt" in functions:
        return "reciprocal root"
    if "exp" in functions:
        return "exponential"
    if reads and all(is_exp(a.tensor) for a in reads if a.tensor != name) and (reduced or name in {a.tensor for a in reads}):
        return "sum of exponentials"  # reduced over a rank, or running (the online forms' LR)
    squares = [(a, b) for a, b in zip(reads[::2], reads[1::2])]
    if reduced and len(reads) % 2 == 0 and all(a == b for a, b in squares):
        return "sum of squares"
    return None


#: Statistics the reference kernels do not keep in float32, with the reason.
NOT_FLOAT32 = {
    "PE": "the fused forms' probabilities are converted to the element type for the P.V GEMM (flash-attention "
          "flash_fwd_kernel.h rP = convert_type<Element>(acc_s))",
    "APE": "as PE, in Falcon-H1's and Zamba2's attention",
}


def test_every_statistic_of_every_shipped_cascade_is_float32_under_reference_kernels() -> None:
    """The rule behind the policy's names, proved on every form of every shipped family's layers
    (not on the layers its entries were written for): what the reference implementations compute
    a max, an exponential, a softmax's sum, a norm's sum of squares or its reciprocal root in
    (float32, each entry's source) is what reference-kernels gives every such Einsum's output,
    whatever prefix a family's block puts on its names."""
    from mambalaya.workloads.shipped import shipped_layers

    checked: dict[str, set[str]] = {}
    for layer in shipped_layers():
        cascade = apply_policy(layer.cascade, "reference-kernels", 16, family=layer.precision_family)
        for einsum in cascade.einsums:
            kind = _statistic_kind(cascade, einsum)
            if kind is None:
                continue
            name = einsum.output.tensor
            expected = 16 if name in NOT_FLOAT32 else 32
            assert cascade.tensors[name].bits == expected, (layer.preset, layer.layer_type, layer.phase, layer.scan,
                                                            layer.softmax, kind, str(einsum))
            checked.setdefault(kind, set()).add(name)
    assert {"MX", "AMX", "FF_LM", "KBX", "AKBX", "MR", "AMR"} <= checked["max"]
    assert {"SS", "ASS", "FSS", "BMQ", "QS", "PSS", "SQ", "FF_SS"} <= checked["sum of squares"]
    assert {"SM", "ASM", "LR", "ALR", "KBS", "AKBS", "FF_LS"} <= checked["sum of exponentials"]
    assert {"EX", "AEX", "CF", "ACF", "AD", "FF_LE"} <= checked["exponential"]
    assert {"RS", "ARS", "FRS", "DLS", "QRS", "PRS"} <= checked["reciprocal root"]


def test_unfused_traffic_moves_by_exactly_the_widened_tensors() -> None:
    """Unfused, every tensor crosses DRAM: widening the float32 ones from 16 to 32 bits adds
    exactly their unfused bytes once more."""
    c16 = build_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=64, batch=2)
    c32 = build_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=64, batch=2, precision="reference-kernels")
    t16 = mapping_traffic(c16, unfused_mapping(c16))
    t32 = mapping_traffic(c32, unfused_mapping(c32))
    for tensor, (r16, w16) in t16.by_tensor.items():
        r32, w32 = t32.by_tensor[tensor]
        factor = 2 if tensor in FLOAT32["mamba1"] else 1
        assert (r32, w32) == (factor * r16, factor * w16), tensor


@pytest.mark.parametrize("text, field", [
    ("name: p\nfamilies: {mamba1: {NOPE: 32}}\n", "families.mamba1.NOPE"),
    ("name: p\nfamilies: {gated_deltanet: {DELTA: 32}}\n", "families.gated_deltanet.DELTA"),
    ("name: p\nfamilies: {mamba1: {H: 0}}\n", "families.mamba1.H"),
    ("name: p\nfamilies: {mamba1: {H: 16.5}}\n", "families.mamba1.H"),
    ("name: p\ndefault: sixteen\n", "default"),
    ("name: p\nroles: {weight: -8}\n", "roles.weight"),
    ("name: p\nfamilies: {mamba3: {H: 32}}\n", "families"),
    ("name: p\nsources: {mamba1.H: because}\n", "sources.mamba1.H"),
    ("name: p\nfamilies: {mamba1: {H: 32}\n", "not valid YAML"),
    ("- a list\n", "a mapping"),
])
def test_bad_policies_are_one_clear_error(tmp_path, text: str, field: str) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as err:
        load_policy(path)
    message = str(err.value)
    assert str(path) in message and field in message, message
    assert "\n" not in message
    r = runner.invoke(app, ["cascade", "show", "--model", "mamba-130m", "--seq-len", "8", "--precision", str(path)])
    assert r.exit_code == 1 and field in r.stderr and "Traceback" not in r.output


def test_unknown_policy_and_arch_field() -> None:
    r = runner.invoke(app, ["evaluate", "--precision", "fp8-everything", "--model", "mamba-130m", "-L", "64", "-B", "1"])
    assert r.exit_code == 1 and "fp8-everything" in r.stderr and "reference-kernels" in r.stderr


def test_every_model_command_takes_precision(tmp_path) -> None:
    args = ["--model", "mamba2-130m", "--seq-len", "256", "--batch", "1", "--precision", "reference-kernels"]
    for cmd in (["cascade", "show"], ["fusion", "map", "--mapping", "unfused"]):
        r = runner.invoke(app, cmd + args)
        assert r.exit_code == 0, (cmd, r.output)
    r = runner.invoke(app, ["fusion", "classes"] + args)  # no fusion class depends on a width: refused, not ignored
    assert r.exit_code == 1 and "no fusion class depends on a width" in " ".join(r.output.split())
    r = runner.invoke(app, ["cascade", "show", "--model", "mamba-130m", "--seq-len", "64", "--precision",
                            "reference-kernels", "--format", "json"])
    assert r.exit_code == 0
    import json

    doc = json.loads(r.stdout)
    assert doc["provenance"]["precision"] == "reference-kernels"
    by = {e["name"]: e for e in doc["einsums"]}
    # AD's write is float32 now: B*I*E*N elements x 4 bytes
    assert by["AD"]["write_bytes"] == 1 * 64 * 1536 * 16 * 4
    for cmd in (["evaluate", "--arch", "mambalaya"], ["compare", "--archs", "mambalaya,marca-ideal", "--seq-lens", "64"]):
        r = runner.invoke(app, cmd + ["--model", "mamba-130m", "--batch", "1", "--precision", "uniform", "--format", "json"])
        assert r.exit_code == 0, (cmd, r.output)


def test_arch_default_policy_and_override() -> None:
    from mambalaya.experiments.evaluate import evaluate

    ev = evaluate("mambalaya", "mamba-130m", PRESETS["mamba-130m"], phase="prefill", seq_len=64, batch=1)
    assert ev.precision.name == "reference-kernels" and ev.cascade.tensors["H"].bits == 32
    ev = evaluate("mambalaya", "mamba-130m", PRESETS["mamba-130m"], phase="prefill", seq_len=64, batch=1,
                  precision="uniform")
    assert ev.precision.name == "uniform" and ev.cascade.tensors["H"].bits == 16
    ev = evaluate("marca-original", "mamba-130m", PRESETS["mamba-130m"], phase="prefill", seq_len=64, batch=1)
    assert {s.bits for s in ev.cascade.tensors.values()} == {32}


def test_round_to_bfloat16_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(10000).astype(np.float32) * 10.0 ** rng.integers(-20, 20, 10000),
                        np.array([0.0, -0.0, np.inf, -np.inf, 1.00390625, 1.01171875], dtype=np.float32)])
    ours = round_to_bfloat16(x)
    theirs = torch.from_numpy(x).to(torch.bfloat16).to(torch.float32).numpy()
    assert np.array_equal(ours, theirs)


def test_storage_keeps_float32_tensors_and_rounds_the_rest() -> None:
    cascade = apply_policy(mamba1_layer(CFG1, batch=2, seq_len=5), "reference-kernels", 16)
    rng = np.random.default_rng(1)
    arrays = {t: rng.standard_normal(cascade.shape(t)) * 0.5 for t in cascade.external_tensors()}
    arrays["A"] = -rng.uniform(1, 4, cascade.shape("A"))
    values = execute(cascade, arrays, dtype="float32", keep="all", storage="bfloat16")
    for name, spec in cascade.tensors.items():
        v = values[name].astype(np.float32)
        is_bf16 = np.array_equal(round_to_bfloat16(v), v)
        if spec.bits == 16:
            assert is_bf16, name
        elif v.size > 4 and cascade.producer(name) is not None:
            assert not is_bf16, name  # a float32 result is not rounded to 16 bits


pytest.importorskip("transformers")


@pytest.mark.parametrize("storage, tol", [("bfloat16", 3e-2), ("float16", 5e-3)])
def test_mixed_precision_executor_tracks_transformers(storage: str, tol: float) -> None:
    """Ours with each tensor stored at its reference-kernels width (float32 where the policy
    says so, bfloat16 or float16 elsewhere) against transformers in float32: the error is that
    of 16-bit storage (bfloat16 keeps 8 significant bits, a unit roundoff of 3.9e-3; float16
    11 bits, 4.9e-4), within about 8 units, and not zero (the rounding did happen)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from hf_reference import run_hf_mamba1_block

    from mambalaya.execute import carry_states
    from mambalaya.workloads.hf.weights import load_mamba1_layer

    ref = run_hf_mamba1_block(d_model=32, batch=2, seq_len=64, n_decode=3, dtype="float32", seed=7)
    cfg = Mamba1Config(d_model=32)
    weights = load_mamba1_layer(ref["state_dict"], layer=0, dtype="float32")
    prefill = apply_policy(mamba1_layer(cfg, batch=2, seq_len=64, state_io=True), "reference-kernels", 16)
    decode = apply_policy(mamba1_layer(cfg, batch=2, seq_len=1, phase="decode"), "reference-kernels", 16)
    zero = {t: np.zeros(prefill.shape(t)) for t in ("H0", "CS0")}

    def rel(a, b):
        return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))

    out = execute(prefill, {"X": ref["x_prefill"], **weights, **zero}, dtype="float32", storage=storage)
    errors = [rel(out["XO"], ref["y_prefill"])]
    states = carry_states(prefill, out)
    for x, y, s in zip(ref["x_decode"], ref["y_decode"], ref["states_decode"]):
        out = execute(decode, {"X": x, **weights, **states}, dtype="float32", storage=storage)
        states = carry_states(decode, out)
        errors += [rel(out["XO"], y), rel(states["H0"], s["H"])]
    assert 1e-5 < max(errors) <= tol, errors


@pytest.mark.parametrize("scan", ["recurrent", "chunked"])
def test_mixed_precision_mamba2_tracks_transformers(scan: str) -> None:
    """The same for Mamba-2, both scan forms of the prefill and a decode step (bfloat16 storage
    of the 16-bit tensors; tolerance as above)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    import hf_reference_mamba2 as hf

    from mambalaya.execute import carry_states
    from mambalaya.workloads.blocks.mamba2 import chunked_output_to_positions, mamba2_constants

    ref = hf.run_hf_mamba2_block(d_model=32, ngroups=2, batch=2, seq_len=24, n_decode=2, dtype="float32", seed=7)
    config = Mamba2Config(**ref["config"])
    weights = ref["weights"]
    prefill = apply_policy(mamba2_layer(config, batch=2, seq_len=24, state_io=True, scan=scan), "reference-kernels", 16)
    zero = {t: np.zeros(prefill.shape(t)) for t in prefill.external_tensors() if prefill.tensors[t].role.value == "state"}
    out = execute(prefill, {"X": ref["x_prefill"], **weights, **zero, **mamba2_constants(prefill)},
                  dtype="float32", storage="bfloat16")
    xo = out["XO"] if scan == "recurrent" else chunked_output_to_positions(out["XO"], 24)

    def rel(a, b):
        return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))

    errors = [rel(xo, ref["y_prefill"])]
    states = carry_states(prefill, out)
    decode = apply_policy(mamba2_layer(config, batch=2, seq_len=1, phase="decode"), "reference-kernels", 16)
    for x, y, s in zip(ref["x_decode"], ref["y_decode"], ref["states_decode"]):
        out = execute(decode, {"X": x, **weights, **states}, dtype="float32", storage="bfloat16")
        states = carry_states(decode, out)
        errors += [rel(out["XO"], y), rel(states["H0"], s["H0"])]
    assert 1e-5 < max(errors) <= 3e-2, errors


def test_a_policy_without_entries_for_a_layers_family_is_refused_naming_it(tmp_path) -> None:
    """A policy whose family entries are for Mamba-2 evaluated on Granite 4 (whose Mamba-2 mixers take
    the bamba entries) set nothing and printed its name over the uniform widths; refused, naming the
    family. On a model of the family it names, it applies."""
    from mambalaya.errors import SpecError
    from mambalaya.workloads import PRESETS, build_layer

    path = tmp_path / "m2.yaml"
    path.write_text("name: m2-state32\ndefault: design\nfamilies: {mamba2: {H: 32, HC: 32}}\n", encoding="utf-8")
    with pytest.raises(SpecError, match="takes the bamba family's entries"):
        build_layer(PRESETS["granite-4.0-h-tiny"], phase="prefill", seq_len=512, batch=1, precision=str(path),
                    layer_type="mamba-moe", scan="recurrent")
    mamba2 = build_layer(PRESETS["mamba2-130m"], phase="prefill", seq_len=512, batch=1, precision=str(path),
                         scan="recurrent")
    assert mamba2.tensors["H"].bits == 32
