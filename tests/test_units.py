"""Which unit runs each Einsum: every contraction the 2D array can run goes to it, with weights
or activations on either side, in the best of the design's dataflows, wherever the product sits
(a recurrence's whole-step matrix product included); dot products, matrix-vector products,
windows and row-by-row recurrences run on the lanes; the lanes may take the array's work only
where a design allows it, and a dataflow switch costs what the design declares."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mambalaya.arch import arch_from_dict, arch_to_dict, load_arch
from mambalaya.einsum.stats import einsum_ops
from mambalaya.cost.latency import einsum_cycles
from mambalaya.cost.spatial import contraction
from mambalaya.workloads import PRESETS, build_layer
from mambalaya.workloads.blocks.attention import AttentionConfig, attention_layer
from small_cascades import gemm, matmul

MAMBALAYA = load_arch("mambalaya")


def spec(base: str = "mambalaya", **compute):
    data = arch_to_dict(load_arch(base))
    data["compute"].update(compute)
    return arch_from_dict(data)


def test_a_product_of_two_activations_runs_on_the_array_holding_either_side() -> None:
    c = matmul(4096, 256, 16, "P", "Q", "input")
    found = contraction(c, c.einsum("Y"))
    assert found is not None and found.on_array and not found.has_weight
    assert found.roles == {"K": ("K",), "N": ("N",), "M": ("M",), "S": ()}
    # weight-stationary alone may hold either activation: holding P (K x M) fills the array
    cyc, sp = einsum_cycles(spec(dataflows=["weight-stationary"]).compute, c, c.einsum("Y"))
    assert sp.unit == "array_2d" and sp.stationary == ("P",) and sp.spatial_util == 1.0
    assert cyc.array_2d == 4096 * 256 * 16 / 256**2 and cyc.array_1d == 0


def test_the_ssd_contractions_run_on_the_array_and_its_dot_products_on_the_lanes() -> None:
    c = build_layer(PRESETS["mamba2-130m"], phase="prefill", seq_len=512, batch=1, scan="chunked")
    units = {e.name: einsum_cycles(MAMBALAYA.compute, c, e)[1].unit for e in c.einsums}
    assert {units[n] for n in ("CB", "YDG", "ST", "YO")} == {"array_2d"}  # activations on both sides
    assert {units[n] for n in ("Z", "XI", "BI", "CI", "DT", "O")} == {"array_2d"}  # weight GEMMs
    # a sum of squares (one tensor twice, no rank of its own on either side) and a window stay on the lanes
    assert units["SG"] == units["SS"] == units["XC"] == "array_1d"


def test_mamba1s_readout_is_a_matrix_vector_product_and_stays_on_the_lanes() -> None:
    c = build_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=64, batch=1)
    found = contraction(c, c.einsum("YS"))  # YS[b,i,e] = H[b,i,e,n]*CM[b,i,n]: CM has no rank of its own
    assert found is not None and not found.on_array
    assert einsum_cycles(MAMBALAYA.compute, c, c.einsum("YS"))[1].unit == "array_1d"


def test_attention_scores_and_value_product_run_on_the_array() -> None:
    cfg = AttentionConfig(d_model=256, n_heads=4, n_kv_heads=2)
    c = attention_layer(cfg, batch=1, seq_len=128)
    on_array = [e.name for e in c.einsums if contraction(c, e) is not None and contraction(c, e).on_array
                and c.kind(e) == "reduction"]
    assert len(on_array) >= 2  # QK^T and PV
    for name in on_array:
        assert einsum_cycles(MAMBALAYA.compute, c, c.einsum(name))[1].unit == "array_2d"


def test_on_the_gpu_the_ssd_contractions_use_the_tensor_cores() -> None:
    gpu = load_arch("gpu-h100")
    c = build_layer(PRESETS["mamba2-130m"], phase="prefill", seq_len=1024, batch=1, scan="chunked")
    for name in ("CB", "YDG", "ST", "YO"):
        cyc, sp = einsum_cycles(gpu.compute, c, c.einsum(name))
        macs = einsum_ops(c, c.einsum(name))["mac"]
        assert sp.unit == "array_2d" and cyc.array_2d == pytest.approx(macs / (gpu.compute.array_rows * gpu.compute.array_cols))


def test_the_lanes_take_the_arrays_work_only_where_the_design_allows_and_it_is_faster() -> None:
    # a batch-1 GEMV: 1 of 256 columns on the array (16 folds of 1 cycle); 4096 MACs on 65536 lanes take 1 cycle
    c = gemm(1, 4096, 1)
    fixed, sp = einsum_cycles(MAMBALAYA.compute, c, c.einsum("Y"))
    assert sp.unit == "array_2d" and fixed.array_2d == 16 and fixed.array_1d == 0
    free, sp = einsum_cycles(spec(gemm_in_1d_mode=True).compute, c, c.einsum("Y"))
    assert sp.unit == "array_1d" and free.array_1d == 1 and free.array_2d == 0


def test_a_dataflow_switch_costs_cycles_per_step_and_can_change_the_choice() -> None:
    # N = 16 outputs: weight-stationary fills 1/16 of the columns; input-stationary fills the array
    c = gemm(4096, 1536, 16)
    ws = 6 * 4096  # 6 folds of K, each streaming the 4096 positions
    is_ = 4096 * 1536 * 16 // 256**2
    free, sp = einsum_cycles(spec(dataflow_switch_cycles=100).compute, c, c.einsum("Y"))
    assert sp.dataflow == "input-stationary" and free.array_2d == is_ + 100  # one step: one switch
    costly, sp = einsum_cycles(spec(dataflow_switch_cycles=ws).compute, c, c.einsum("Y"))
    assert sp.dataflow == "weight-stationary" and costly.array_2d == ws


def test_the_least_array_cycles_over_tilings_equal_every_candidate_visited() -> None:
    """The search's closed form over a grid of tilings (row and column factors combined at
    once) equals visiting every spatial mapping in every dataflow, to the bit."""
    import numpy as np

    from mambalaya.cost import spatial as S

    checked = 0
    for db in (True, False):
        compute = spec(stationary_double_buffered=db, dataflow_switch_cycles=7).compute
        for model, phase, scan in [("mamba2-130m", "prefill", "chunked"), ("mamba-130m", "decode", None)]:
            c = build_layer(PRESETS[model], phase=phase, seq_len=1 if phase == "decode" else 1024, batch=3, scan=scan)
            sizes = {r: c.size(r) for r in c.ranks}
            for e in c.einsums:
                found = contraction(c, e)
                if found is None or not found.on_array:
                    continue
                ranks = [r for r in (v.upper() for v in e.output_variables) if sizes[r] > 1][:2]
                grids = np.meshgrid(*[np.array([1, 2, 3, 7, sizes[r]]) for r in ranks], indexing="ij")
                shapes = S.step_shapes(sizes, list(zip(ranks, (g.ravel() for g in grids))))
                used = {r for role in found.roles.values() for r in role}
                ext = [{r: S._extent(sh, sizes, r) for r in used} for sh in shapes]
                fast = S._least_array_cycles(compute, ext, shapes, found, sizes)
                slow = None
                for cand in S._array_candidates(compute, found, sizes):
                    cyc, _ = S._array_cycles(compute, ext, shapes, cand)
                    slow = cyc if slow is None else np.minimum(slow, cyc)
                assert np.array_equal(np.broadcast_to(slow, fast.shape), fast), (e.name, db)
                checked += 1
    assert checked >= 20


@pytest.mark.parametrize("model", ["mamba-1.4b", "mamba2-2.7b"])
def test_the_figure_2_captions_hold_on_the_baseline_design(model) -> None:
    """Unfused prefill alternates between compute- and memory-bound Einsums; in decode no
    Einsum reaches the compute bound but for one-pass artefacts, which the table marks."""
    from mambalaya.experiments.evaluate import evaluate
    from mambalaya.cost.latency import latency_rows

    def bounds(phase: str) -> list[str]:
        ev = evaluate("marca-ideal", model, PRESETS[model], phase=phase, seq_len=2048, batch=64)
        return [r["group_bound"] for r in latency_rows(ev.result) if r["einsum"] != "total"]

    prefill = bounds("prefill")
    assert "compute" in prefill and "offchip" in prefill
    decode = bounds("decode")
    assert "compute" not in decode
    assert {b for b in decode if b != "offchip"} <= {"compute (one pass)"}


def test_attention_with_partly_rotated_heads_runs_both_score_products_on_the_array() -> None:
    """Bamba's scores are two products (the rotated and the pass-through channels), each scaled:
    both run on the array, and the scale is one multiply per score, not one per MAC."""
    from mambalaya.cost.spatial import contractions

    c = build_layer(PRESETS["bamba-9b"], phase="prefill", seq_len=256, batch=1, layer_type="attention")
    sc = c.einsum("SC")
    assert len(contractions(c, sc)) == 2 and all(t.on_array for t in contractions(c, sc))
    ops = einsum_ops(c, sc)
    scores = c.elements("SC") * 257 // 512  # the (i, t) pairs with t <= i: the causal mask's others are skipped
    assert ops["mul"] == 2 * scores and ops["add"] == 2 * scores  # two scales, two adds (the second product, the mask)
    cyc, sp = einsum_cycles(MAMBALAYA.compute, c, sc)
    macs_ideal = ops["mac"] / MAMBALAYA.compute.pe_count
    assert sp.unit == "array_2d" and cyc.array_2d == pytest.approx(macs_ideal, rel=0.01)
    assert cyc.array_1d < cyc.array_2d / 10


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=2**53 - 1), min_size=1, max_size=20),
       st.integers(min_value=1, max_value=2**40))
def test_lane_passes_round_up_exactly(values, divisor) -> None:
    """The lanes' passes (model.spatial._ceil_div) are ceil(values / divisor) exactly for whole
    floats below 2^53, as the float floor division gave them; above, the floor division."""
    from mambalaya.cost.spatial import _ceil_div

    floats = np.array(values, dtype=float)
    assert np.array_equal(_ceil_div(floats, divisor), -(-floats // divisor))
    assert [int(x) for x in _ceil_div(floats, divisor)] == [-(-int(v) // divisor) for v in floats]
    big = np.array([2.0**60, 2.0**60 + 2**8])
    assert np.array_equal(_ceil_div(big, divisor), -(-big // divisor))


#: The Einsums of the shipped cascades whose multiply-accumulates run on the lanes, each with
#: the reason the algebra gives (every other Einsum with MACs runs on the array).
ON_THE_LANES = {
    **dict.fromkeys(("SS", "SG", "FF_SS", "ASS", "FSS", "PSS", "QS", "KS", "SK", "SQ", "BMQ", "CMQ", "DLQ"),
                    "a sum of squares (an RMS or L2 norm): a dot product, one operand, no reuse"),
    "YS": "Mamba-1's readout H[e,n]*C[n] over the state: a matrix-vector product per position",
    "YD": "the recurrent delta rule's readout H[p,n]*q[n]: a matrix-vector product per position",
    "H": "the recurrent delta rule's state read H[i-1,p,m]*k[m] (times k[n]): a matrix-vector product per step",
    "FF_MO": "the MoE combine, experts' outputs times their routing weights summed over experts: a matrix-vector "
             "product per token",
    **dict.fromkeys(("XC", "BC", "CC", "KC", "QC", "VC"), "a causal conv1d: a sliding window (a Toeplitz view)"),
    "TI": "the forward substitution: each row q waits for the rows before it (its generational rank is an output "
          "rank of one side), a vector times a matrix per step",
}


def test_every_contraction_of_every_shipped_cascade_runs_where_its_algebra_says() -> None:
    """Walk every Einsum with MACs in every shipped cascade (every family, both phases, both scan
    forms, both softmax forms): it runs on the array (the GPU's tensor cores on gpu-h100),
    wherever its product sits (Gated DeltaNet's chunk-state update inside a recurrence, its W
    product behind a scale), unless it is one of the reasoned exceptions above."""
    from mambalaya.cost.contraction import contractions
    from mambalaya.cost.latency import layer_latency
    from mambalaya.search.mappings import named_mapping
    from mambalaya.workloads.shipped import shipped_layers

    gpu = load_arch("gpu-h100")
    seen: dict[str, set[str]] = {}
    checked, refusals = 0, set()
    for layer in shipped_layers(refusals=refusals):
        name, cascade = layer.preset, layer.cascade
        rows = {r.einsum: r for r in layer_latency(gpu, cascade, named_mapping("unfused", cascade, None)).einsums}
        for e in cascade.einsums:
            if not einsum_ops(cascade, e).get("mac"):
                continue
            found = contractions(cascade, e)
            on_array = all(t.on_array for t in found)
            # a product of activations one of whose sides has no own rank above size 1 (a decode
            # step's attention without grouped query heads) is a vector times a matrix: the lanes
            degenerate = any(not t.has_weight and cascade.kind(e) != "gemm" and any(
                all(cascade.size(r) == 1 for r in t.roles[side]) for side in ("M", "N")) for t in found)
            expected = e.name not in ON_THE_LANES and not degenerate
            assert on_array == expected, (name, cascade.name, str(e), ON_THE_LANES.get(e.name, "expected on the array"))
            assert (rows[e.name].spatial.unit == "array_2d") == expected, (name, cascade.name, e.name)
            seen.setdefault("array" if on_array else "lanes", set()).add(e.name)
            seen.setdefault("degenerate", set()).update({e.name} if degenerate else set())
            checked += 1
    assert checked > 500 and set(ON_THE_LANES) <= seen["lanes"]  # every exception still exists somewhere
    assert refusals == {"Jamba's Mamba layers are Mamba-1, which has only the recurrent scan, not scan='chunked'"}
    assert {"HC", "W", "U", "ST", "CB", "SC", "AO"} <= seen["array"]
    assert {"SC", "AO", "ASC", "AAO"} <= seen["degenerate"]  # (olmo-hybrid's and zamba2's decode attention)
