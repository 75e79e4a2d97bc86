"""Unrolling recurrences into one Einsum per step: same values, the expected graph, the cost of
moving the carried state off chip, and clear refusals."""

from __future__ import annotations

import numpy as np
import pytest

from mambalaya.einsum import dump_cascade, loads_cascade
from mambalaya.einsum.unroll import unroll_recurrences
from mambalaya.errors import SpecError
from mambalaya.execute import execute
from mambalaya.search.mappings import named_mapping
from mambalaya.cost.traffic import mapping_traffic
from mambalaya.workloads.blocks.mamba1 import Mamba1Config, mamba1_layer
from mambalaya.workloads.blocks.mamba2 import Mamba2Config, mamba2_constants, mamba2_layer

CFG = Mamba1Config(d_model=8, d_state=2, d_conv=3)
CFG2 = Mamba2Config(d_model=8, headdim=4, d_state=2, ngroups=2, chunk_size=3, d_conv=3)
CASCADES = {
    "prefill": lambda: mamba1_layer(CFG, batch=2, seq_len=6),
    "prefill-state": lambda: mamba1_layer(CFG, batch=2, seq_len=5, state_io=True),
    "decode": lambda: mamba1_layer(CFG, batch=3, seq_len=1, phase="decode"),
    "mamba2-recurrent-state": lambda: mamba2_layer(CFG2, batch=2, seq_len=5, scan="recurrent", state_io=True),
    "mamba2-chunked": lambda: mamba2_layer(CFG2, batch=2, seq_len=8, scan="chunked"),
    "mamba2-one-chunk": lambda: mamba2_layer(CFG2, batch=1, seq_len=3, scan="chunked"),
    "mamba2-decode": lambda: mamba2_layer(CFG2, batch=2, seq_len=1, phase="decode"),
}


def arrays_for(c, seed=0):
    rng = np.random.default_rng(seed)
    arrays = {t: rng.standard_normal(c.shape(t)) * 0.4 for t in c.external_tensors()}
    arrays["A"] = -rng.uniform(1, 4, c.shape("A"))
    arrays.update(mamba2_constants(c))
    return arrays


@pytest.mark.parametrize("key", list(CASCADES))
def test_unrolled_cascade_computes_the_same_values(key):
    c = CASCADES[key]()
    u = unroll_recurrences(c)
    assert not any(u.recurrence(e) for e in u.einsums)
    assert set(u.external_tensors()) == set(c.external_tensors())
    arrays = arrays_for(c)
    ref, got = execute(c, arrays), execute(u, arrays)
    for t, value in ref.items():
        # a decode step's outgoing state H is the last (only) step tensor H_0
        unrolled_name = t if t in got else f"{t}_{c.size(c.recurrence(c.einsum(t))[0]) - 1}"
        assert np.allclose(got[unrolled_name].reshape(value.shape), value, rtol=1e-13, atol=1e-15), t


def test_mamba1_scan_unrolls_into_steps_and_selecting_readers():
    c = mamba1_layer(CFG, batch=1, seq_len=4, state_io=True)
    u = unroll_recurrences(c)
    text = {e.name: str(e) for e in u.einsums}
    assert text["H_0"] == "H_0[b,step,e,n] = AD[b,0,e,n]*H0[b,e,n] + BX[b,0,e,n]"
    assert text["H_2"] == "H_2[b,step,e,n] = AD[b,2,e,n]*H_1[b,step,e,n] + BX[b,2,e,n]"
    assert text["YS"] == "YS[b,i,e] = (H_0[b,-i,e,n] + H_1[b,-i+1,e,n] + (H_2[b,-i+2,e,n] + H_3[b,-i+3,e,n]))*CM[b,i,n]"
    assert text["HN"] == "HN[b,e,n] = H_3[b,0,e,n]"  # only the last step can be selected
    assert "H" not in u.tensors and u.size("STEP") == 1
    assert u.tensors["H_0"].ranks == ("B", "STEP", "E", "N")
    assert u.regions["ssm"] == ("AD", "BX", "H_0", "H_1", "H_2", "H_3", "YS")
    assert "recurrences unrolled: H (4 steps)" in u.description


def test_without_state_the_first_step_starts_from_zero():
    u = unroll_recurrences(mamba1_layer(CFG, batch=1, seq_len=3))
    assert str(u.einsum("H_0")) == "H_0[b,step,e,n] = AD[b,0,e,n]*0 + BX[b,0,e,n]"


def test_unread_last_chunk_state_is_not_computed():
    """In a chunked prefill without outgoing state only chunk c+1 reads chunk c's state: the last
    chunk's state is dead and the unrolled cascade drops it (and says so)."""
    c = mamba2_layer(CFG2, batch=1, seq_len=8, scan="chunked")
    chunks = c.size("C")
    u = unroll_recurrences(c, ["HC"])
    assert f"HC_{chunks - 1}" not in u.tensors and f"HC_{chunks - 2}" in u.tensors
    assert f"never read, so not computed: HC_{chunks - 1}" in u.description
    assert u.recurrence(u.einsum("ACS"))  # only HC was asked for
    # with one chunk no chunk reads a previous state: the state and what only fed it go
    one = unroll_recurrences(mamba2_layer(CFG2, batch=1, seq_len=3, scan="chunked"), ["HC"])
    assert {"HC_0", "ST"} <= set(one.description.split(": ")[-1].rstrip("]").split(", "))
    assert "HC_0" not in one.tensors and "ST" not in one.tensors
    assert str(u.einsum("YO")).startswith("YO[b,c,q,g,r,p] = CM[b,256*c+q,g,n]*".replace("256", str(c.size("Q"))))


def test_unrolled_cascade_round_trips_through_the_cascade_file():
    u = unroll_recurrences(mamba1_layer(CFG, batch=1, seq_len=40, state_io=True))
    back = loads_cascade(dump_cascade(u))
    assert back.einsums == u.einsums and back.tensors == u.tensors  # 40 terms parse within the nesting limit


def test_unfused_traffic_moves_the_carried_state_off_chip():
    """The recurrent scan keeps the state on chip between positions; unrolled, each step writes
    H_t and the next reads it back: exactly (T-1) states more, every other tensor unchanged."""
    steps = 5
    c = mamba1_layer(CFG, batch=2, seq_len=steps, state_io=True)
    u = unroll_recurrences(c)
    rec = mapping_traffic(c, named_mapping("unfused", c, None))
    unr = mapping_traffic(u, named_mapping("unfused", u, None))
    state_bytes = c.size("B") * c.size("E") * c.size("N") * c.tensors["H"].bits / 8
    assert unr.offchip_bytes - rec.offchip_bytes == (steps - 1) * state_bytes
    for t, (read, write) in rec.by_tensor.items():
        if t != "H":
            assert unr.by_tensor[t] == (read, write), t
    # the ideal mapping keeps every step on chip: unrolling costs nothing there
    assert mapping_traffic(u, named_mapping("ideal", u, None)).offchip_bytes == \
        mapping_traffic(c, named_mapping("ideal", c, None)).offchip_bytes


def test_refusals_name_the_einsum():
    c = mamba1_layer(CFG, batch=1, seq_len=3)
    with pytest.raises(SpecError, match="'YS'.*not a recurrent Einsum.*\\(recurrences: H\\)"):
        unroll_recurrences(c, ["YS"])
    # a reader reaching the initial value through the recurrence's rank cannot select it
    chunked_state = mamba2_layer(CFG2, batch=1, seq_len=6, scan="chunked", state_io=True)
    with pytest.raises(SpecError, match="YO reads HC\\[b,c-1,g,r,p,n\\].*initial value"):
        unroll_recurrences(chunked_state, ["HC"])
    # max= over a top-level read would be split into separately reduced step terms
    text = (
        "name: m\nranks: {I: 3, J: 2}\ntensors:\n  X: {ranks: [I, J], role: input}\n"
        "  S: {ranks: [I, J], role: intermediate}\n  M: {ranks: [J], role: output}\n"
        "einsums:\n  - S[i,j] = S[i-1,j] + X[i,j]\n  - M[j] max= S[i,j]\n"
    )
    with pytest.raises(SpecError, match="max= Einsum"):
        unroll_recurrences(loads_cascade(text))
    with pytest.raises(SpecError, match="already has a tensor named H_0"):
        clash = loads_cascade(
            "name: c\nranks: {I: 2}\ntensors:\n  X: {ranks: [I], role: input}\n  H: {ranks: [I], role: intermediate}\n"
            "  H_0: {ranks: [I], role: output}\neinsums:\n  - H[i] = H[i-1] + X[i]\n  - H_0[i] = H[i]\n"
        )
        unroll_recurrences(clash)


def test_nothing_to_unroll_returns_the_cascade():
    plain = loads_cascade("name: p\nranks: {I: 2}\ntensors:\n  X: {ranks: [I], role: input}\n"
                          "  Y: {ranks: [I], role: output}\neinsums:\n  - Y[i] = X[i]\n")
    assert unroll_recurrences(plain) is plain
