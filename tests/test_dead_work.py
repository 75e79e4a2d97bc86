"""Masks as skipped work, one mechanism for every cascade (:mod:`mambalaya.einsum.dead_work`).

What is checked: every shipped mask declaration against the values its builder gives the
executor (every family, phase, scan and softmax form); every fact the analysis derives against
the values the numpy executor computes (a dead cell holds the fact's 0, -inf, 1 or carried
value) on small layers of every family in every form; the live-cell count against brute force;
the shares and operation counts of the chunked scans' masked products; a user's cascade file
with its own mask (a sliding window); and the refusals of bad declarations.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mambalaya.einsum.cascade_file import dump_cascade, loads_cascade
from mambalaya.einsum.dead_work import CARRIED, NEG_INF, ONE, ZERO, Band, dead_work, live_mask, masked_variables
from mambalaya.einsum.ir import Role
from mambalaya.einsum.routing import einsum_scale, tensor_scale
from mambalaya.einsum.stats import einsum_ops
from mambalaya.errors import ExecutionError, SpecError
from mambalaya.execute import execute
from mambalaya.workloads.blocks.attention import AttentionConfig, attention_constants, attention_layer
from mambalaya.workloads.blocks.gated_deltanet import GatedDeltaNetConfig, gdn_constants, gdn_layer
from mambalaya.workloads.blocks.mamba2 import Mamba2Config, mamba2_constants, mamba2_layer
from mambalaya.workloads.families.bamba import hybrid_inputs, hybrid_layer
from mambalaya.workloads.families.base import FamilyModel, family_inputs
from mambalaya.workloads.families.olmo_hybrid import OlmoHybridModel
from mambalaya.workloads.layers import PRESETS
from mambalaya.workloads.shipped import shipped_layers
from test_blocked_softmax import BAMBA, FALCON  # small Bamba and Falcon-H1 configs

# --------------------------------------------------------------------------------------------
# declarations are true to the values
# --------------------------------------------------------------------------------------------


def _constants(preset: str, cascade) -> dict[str, np.ndarray]:
    """The constant inputs the builders give a shipped layer (its masks, rotary tables)."""
    config = PRESETS[preset]
    out: dict[str, np.ndarray] = {}
    attention = config.attention_config() if isinstance(config, FamilyModel) else config
    tables = {"COS", "KM"} & set(cascade.tensors) or cascade.tensors.get("CM") and cascade.tensors["CM"].ranks == ("I", "T")
    if tables and (hasattr(attention, "attention") or isinstance(attention, AttentionConfig)):  # Mamba's C is also CM
        out.update(attention_constants(cascade, attention))
    out.update(gdn_constants(cascade) if "EYE" in cascade.tensors else mamba2_constants(cascade))
    if hasattr(config, "constants"):
        out.update(config.constants(cascade))
    return out


def _declaration_holds(cascade, name: str, values: np.ndarray) -> None:
    mask = cascade.tensors[name].mask
    live = live_mask(cascade, name)
    dead_valued = values == mask.dead
    if mask.block is None:  # one key a cell: dead exactly where the declaration says
        assert np.array_equal(dead_valued, ~live), name
        return
    axis = cascade.tensors[name].ranks.index(mask.block)  # whole blocks: a cell is live if any key is
    cell_live = np.any(live, axis=axis, keepdims=True)
    assert np.all(dead_valued[np.broadcast_to(~cell_live, live.shape)]), name
    assert np.all(np.any(~dead_valued, axis=axis, keepdims=True) == cell_live), name


def test_every_shipped_mask_declaration_is_its_values() -> None:
    """Every constant a shipped layer reads that hides keys (holds -inf, or is a 0/1 matrix with
    zeros) declares a mask, and the declaration says exactly where it holds its dead value:
    every family, phase, scan and softmax form, at a length that pads the last key block."""
    seen = set()
    for layer in [*shipped_layers(seq_len=256), *shipped_layers(seq_len=200)]:
        cascade = layer.cascade
        for name, values in _constants(layer.preset, cascade).items():
            if name not in cascade.tensors:
                continue
            spec = cascade.tensors[name]
            hides = bool(np.isneginf(values).any()) or (set(np.unique(values)) <= {0.0, 1.0} and (values == 0).any())
            assert (spec.mask is not None) == hides, (layer.preset, layer.phase, name)
            if spec.mask is not None:
                _declaration_holds(cascade, name, values)
                seen.add(name)
    assert seen == {"LM", "SL", "EYE", "CM", "KM", "AMK", "AKM"}


def test_a_non_causal_or_decode_key_mask_skips_nothing() -> None:
    """A decode step's query sees every cached key, a non-causal prefill every real key: their
    key masks hide only the padded keys, which never fill a block, so no work is skipped."""
    att = AttentionConfig(d_model=32, n_heads=4, n_kv_heads=2, head_dim=8)
    for c in (attention_layer(att, batch=1, seq_len=100, phase="decode", softmax="blocked", key_block=32),
              attention_layer(att, batch=1, seq_len=100, softmax="blocked", key_block=32, causal=False)):
        _declaration_holds(c, "KM", attention_constants(c, att)["KM"])
        assert not dead_work(c).frames and all(tensor_scale(c, t) == 1 for t in c.tensors), c.name


# --------------------------------------------------------------------------------------------
# facts are true to the computed values
# --------------------------------------------------------------------------------------------

GDN = GatedDeltaNetConfig(d_model=32, layer_types=("linear_attention", "full_attention"), num_k_heads=2, num_v_heads=4,
                          k_head_dim=8, v_head_dim=6, chunk_size=4, d_ff=48, n_heads=4, n_kv_heads=2, vocab_size=16)
OLMO = OlmoHybridModel.of(GDN, rope_theta=500.0)
MAMBA2 = Mamba2Config(d_model=16, d_state=4, headdim=8, ngroups=2, chunk_size=4)
L, KEY_BLOCK = 12, 8  # three chunks; the last key block padded


def _small_layers():
    """(name, cascade, constants) of every masked form, small enough to execute."""
    for softmax in ("three-pass", "online", "blocked"):
        c = hybrid_layer(BAMBA, "attention", batch=2, seq_len=L, softmax=softmax, key_block=KEY_BLOCK)
        yield f"bamba-attention-{softmax}", c, hybrid_inputs(c, BAMBA)
        for scan in ("chunked", "recurrent"):
            c = FALCON.layer("parallel", batch=2, seq_len=L, scan=scan, softmax=softmax, key_block=KEY_BLOCK)
            yield f"falcon-h1-{scan}-{softmax}", c, family_inputs(c, FALCON)
        c = OLMO.layer("attention", batch=2, seq_len=L, softmax=softmax, key_block=KEY_BLOCK)
        yield f"olmo-attention-{softmax}", c, family_inputs(c, OLMO)
    c = hybrid_layer(BAMBA, "mamba", batch=2, seq_len=L, scan="chunked")
    yield "bamba-mamba-chunked", c, hybrid_inputs(c, BAMBA)
    c = mamba2_layer(MAMBA2, batch=2, seq_len=L, scan="chunked")
    yield "mamba2-chunked", c, mamba2_constants(c)
    c = gdn_layer(GDN, batch=2, seq_len=L, scan="chunked")
    yield "gdn-chunked", c, gdn_constants(c)


def _weights(cascade, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {t: rng.normal(0, 0.4, cascade.shape(t)) for t, s in cascade.tensors.items()
           if s.role == Role.WEIGHT and t in cascade.external_tensors()}
    return {t: -np.abs(a) if t == "A" else a for t, a in out.items()}


def _dead_cells(cascade, tensor: str, fact) -> np.ndarray:
    """Where a fact's cells are dead, broadcast to the tensor's shape."""
    shape = cascade.shape(tensor)
    rows = shape[fact.row_dim] if fact.row_dim is not None else 1
    dead = np.array([[fact.band.live_cells(1, 1, first_row=r, first_col=k, row_limit=rows, col_limit=shape[fact.col_dim]) == 0 for k in range(shape[fact.col_dim])]
                     for r in range(rows)])
    index = [np.newaxis] * len(shape)
    if fact.row_dim is not None and fact.row_dim > fact.col_dim:
        dead = dead.T
    for d in sorted(x for x in (fact.row_dim, fact.col_dim) if x is not None):
        index[d] = slice(None)
    return np.broadcast_to(dead[tuple(index)] if fact.row_dim is not None else dead[0][tuple(index)], shape)


@pytest.mark.parametrize("name,cascade,constants", list(_small_layers()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_fact_holds_on_the_executed_values(name, cascade, constants) -> None:
    """Run the layer (random weights and input, float64) and read every tensor the analysis
    gives a fact: at each dead cell it holds exactly the fact's value (0, -inf, 1, or its value
    one key cell back). The skipped work is work whose result is known."""
    work = dead_work(cascade)
    assert work.frames, name
    x = np.random.default_rng(1).standard_normal(cascade.shape("X"))
    values = execute(cascade, {"X": x, **_weights(cascade, 2), **constants}, dtype="float64", keep="all")
    for tensor, fact in work.facts.items():
        got = values[tensor]
        dead = _dead_cells(cascade, tensor, fact)
        assert dead.any(), (name, tensor)
        if fact.value == CARRIED:
            previous = np.roll(got, 1, axis=fact.col_dim)
            first = [slice(None)] * got.ndim
            first[fact.col_dim] = 0
            assert not dead[tuple(first)].any(), (name, tensor)  # the first key cell is always seen here
            assert np.array_equal(got[dead], previous[dead]), (name, tensor)
        else:
            expected = {ZERO: 0.0, NEG_INF: -np.inf, ONE: 1.0}[fact.value]
            assert np.all(got[dead] == expected), (name, tensor, fact.value)


# --------------------------------------------------------------------------------------------
# counts
# --------------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(lower=st.one_of(st.none(), st.integers(-12, 4)), span=st.integers(0, 12), upper_open=st.booleans(),
       offset=st.integers(0, 6), relative=st.booleans(), width=st.integers(1, 4), row_tile=st.integers(1, 4),
       col_tile=st.integers(1, 3), n_rows=st.integers(1, 10), n_cols=st.integers(1, 7), data=st.data())
def test_live_cells_count_every_cell_of_a_tile_with_a_seen_key(lower, span, upper_open, offset, relative, width,
                                                               row_tile, col_tile, n_rows, n_cols, data) -> None:
    """The closed count equals a walk over every (row, cell) pair of a box: live when its tile
    (``row_tile`` rows by ``col_tile`` cells of the tensor, aligned at 0, cut at its edges)
    holds a key some query of the tile sees."""
    upper = None if upper_open else (lower if lower is not None else -6) + span
    band = Band(lower, upper, offset if relative else 0, relative, width, row_tile, col_tile)
    first_row = data.draw(st.integers(0, n_rows - 1))
    rows = data.draw(st.integers(1, n_rows - first_row))
    first_col = data.draw(st.integers(0, n_cols - 1))
    cols = data.draw(st.integers(1, n_cols - first_col))

    def seen(r: int, cell: int) -> bool:
        query = r + band.offset if relative else 0
        return any((lower is None or k - query >= lower) and (upper is None or k - query <= upper)
                   for k in range(cell * width, (cell + 1) * width))

    def tile_live(r: int, cell: int) -> bool:
        top, left = r // row_tile * row_tile, cell // col_tile * col_tile
        return any(seen(rr, cc) for rr in range(top, min(top + row_tile, n_rows))
                   for cc in range(left, min(left + col_tile, n_cols)))

    brute = sum(tile_live(r, c) for r in range(first_row, first_row + rows) for c in range(first_col, first_col + cols))
    assert band.live_cells(rows, cols, first_row=first_row, first_col=first_col, row_limit=n_rows,
                           col_limit=n_cols) == brute


def test_the_chunked_scans_skip_their_masked_in_chunk_work() -> None:
    """Mamba-2: the segment decay and the in-chunk product run on the (q, s) pairs with
    s <= q, (Q + 1) / (2Q) of them. The gated delta rule: its strictly lower AS on s < q; the
    forward substitution's product AS[q,t]*TI[t,s] on t < q, its identity term whole; QE's
    product on s <= q, its QN*DO term per output point, unscaled."""
    c = mamba2_layer(MAMBA2, batch=2, seq_len=L, scan="chunked")
    q = c.size("Q")
    causal = Fraction(q + 1, 2 * q)
    assert {e: share for e, (_, share) in dead_work(c).frames.items()} == {"LD": causal, "YDG": causal}
    assert tensor_scale(c, "LD") == tensor_scale(c, "LM") == causal and tensor_scale(c, "CB") == 1
    dense = c.size("B") * c.size("C") * q * q * c.size("G") * c.size("R") * c.size("P")
    assert einsum_ops(c, c.einsum("YDG"))["mac"] == dense * causal
    g = gdn_layer(GDN, batch=2, seq_len=L, scan="chunked")
    strict = Fraction(q - 1, 2 * q)
    frames = dead_work(g).frames
    assert frames["AS"][1] == strict and frames["TI"][1] == strict and frames["QE"][1] == causal
    assert masked_variables(g, "TI") == (frozenset({"q", "t"}), strict)
    b, c_, h, r, n = (g.size(x) for x in ("B", "C", "G", "R", "N"))
    ti = einsum_ops(g, g.einsum("TI"))
    assert ti["mac"] == b * c_ * h * r * q * q * q * strict  # AS[q,t]*TI[t,s] over t < q
    assert ti["add"] == b * c_ * h * r * q * q  # EYE - (the sum): every (q, s)
    qe = einsum_ops(g, g.einsum("QE"))
    assert qe["mul"] == b * c_ * h * r * q * n + b * c_ * h * r * q * q * causal  # QN*DO whole, QK*LD masked
    assert einsum_scale(g, "KK") == 1 and einsum_scale(g, "U") == 1


# --------------------------------------------------------------------------------------------
# a user's cascade, and refusals
# --------------------------------------------------------------------------------------------

WINDOW = """
name: sliding-window-scores
params: {scale: 0.5}
ranks: {I: 10, T: 10, E: 4}
tensors:
  Q:  {ranks: [I, E], role: input}
  K:  {ranks: [T, E], role: input}
  V:  {ranks: [T, E], role: input}
  A:  {ranks: [I], role: input}
  WM: {ranks: [I, T], role: input, mask: {row: I, col: T, lower: -2, upper: 0, dead: -inf}}
  SC: {ranks: [I, T], role: intermediate}
  EX: {ranks: [I, T], role: intermediate}
  O:  {ranks: [I, E], role: output}
  Z:  {ranks: [I, T], role: output}
  Z2: {ranks: [I, T], role: output}
einsums:
  - SC[i,t] = Q[i,e]*K[t,e]*scale + WM[i,t]
  - EX[i,t] = exp(SC[i,t])
  - O[i,e] = EX[i,t]*V[t,e]
  - Z[i,t] = EX[i,t] + A[i]
  - Z2[i,t] = EX[i,t]*SC[i,t-1]
"""


def test_a_cascade_file_declares_its_own_mask() -> None:
    """A sliding window of three keys, written by a user: its scores, exponent and value product
    run on the 27 of 100 pairs it sees; an Einsum whose dead value is not known runs whole
    (``EX + A``; ``EX * SC[t-1]``, where the earlier score may be -inf and ``0 * -inf`` is not 0);
    the mask reads back from the text it writes."""
    c = loads_cascade(WINDOW)
    live = Fraction(10 + 9 + 8, 100)
    assert {e: share for e, (_, share) in dead_work(c).frames.items()} == {"SC": live, "EX": live, "O": live}
    assert tensor_scale(c, "Z") == 1 and einsum_scale(c, "Z") == 1 and tensor_scale(c, "EX") == live
    assert einsum_scale(c, "Z2") == 1 and "Z2" not in dead_work(c).facts
    assert einsum_ops(c, c.einsum("O"))["mac"] == 27 * 4
    again = loads_cascade(dump_cascade(c))
    assert again.tensors["WM"].mask == c.tensors["WM"].mask and again == c
    window = np.where(live_mask(c, "WM"), 0.0, -np.inf)
    rng = np.random.default_rng(0)
    with np.errstate(invalid="ignore"):  # Z2's 0 * -inf
        values = execute(c, {t: rng.standard_normal(c.shape(t)) for t in ("Q", "K", "V", "A")} | {"WM": window},
                         dtype="float64", keep="all")
    assert np.all(values["EX"][~live_mask(c, "WM")] == 0.0)
    assert np.isnan(values["Z2"]).any()  # what skipping Z2's dead cells as zeros would have hidden


MASK = "mask: {row: I, col: T, lower: -2, upper: 0, dead: -inf}"


@pytest.mark.parametrize("old,new,message", [
    ("SC: {ranks: [I, T], role: intermediate}", "SC: {ranks: [I, T], role: intermediate, " + MASK + "}",
     "only a constant input"),
    (MASK, "mask: {row: I, col: E, upper: 0, dead: -inf}", "three of its ranks"),
    (MASK, "mask: {row: I, col: T, lower: 1, upper: 0, dead: -inf}", "above upper"),
    (MASK, "mask: {row: I, col: T, dead: -inf}", "bounds no key"),
    (MASK, "mask: {col: T, offset: 2, upper: 0, dead: -inf}", "no row rank"),
    (MASK, "mask: {row: I, col: T, upper: 0, dead: 1}", "must be 0 or -inf"),
    (MASK, "mask: {row: I, col: T, upper: 0.5, dead: -inf}", "must be an integer"),
    (MASK, "mask: {row: I, col: T, upper: 0, dead: -inf, window: 3}", "unknown field 'window'"),
    (MASK, "mask: {row: I, upper: 0}", "needs 'col'"),
    (MASK, "mask: {row: I, col: T, upper: 0, dead: -inf, row_tile: 0}", "not a positive integer"),
    (MASK, "mask: {row: I, col: T, upper: 0}", "needs 'dead'"),
])
def test_a_bad_mask_is_refused_naming_the_tensor(old: str, new: str, message: str) -> None:
    """Each wrong declaration is refused with one message naming the tensor and its mask."""
    with pytest.raises(SpecError, match=message) as err:
        loads_cascade(WINDOW.replace(old, new))
    assert "mask" in str(err.value) and ("SC" in str(err.value) or "WM" in str(err.value))


# --------------------------------------------------------------------------------------------
# the algebra on random programs
# --------------------------------------------------------------------------------------------

_ATOMS = ("WM[i,t]", "A[i,t]", "B[i]", "0", "1", "{prev}[i,t]", "{prev}[i,t-1]")


def _expression(draw, depth: int, prev: str) -> str:
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        return draw(st.sampled_from(_ATOMS)).format(prev=prev)
    kind = draw(st.sampled_from(("+", "-", "*", "/", "exp", "max")))
    a = _expression(draw, depth - 1, prev)
    if kind == "exp":
        return f"exp({a})"
    if kind == "/":
        return f"({a})/D[i,t]"
    b = _expression(draw, depth - 1, prev)
    return f"max({a}, {b})" if kind == "max" else f"({a}) {kind} ({b})"


@st.composite
def _masked_programs(draw):
    """A cascade over [I, T] with a random mask (band, dead value, tiles) and four random
    Einsums, each pointwise, a reduction over the keys (sum or max) or a recurrence along them."""
    lower = draw(st.one_of(st.none(), st.integers(-4, 0)))
    upper = draw(st.integers(lower if lower is not None else -3, 2))
    dead = draw(st.sampled_from(("-inf", "0")))
    tiles = {"row_tile": draw(st.integers(1, 3)), "col_tile": draw(st.integers(1, 3))}  # a kernel's tiles
    bounds = ", ".join(f"{k}: {v}" for k, v in (("lower", lower), ("upper", upper), *tiles.items()) if v is not None)
    tensors = [f"  WM: {{ranks: [I, T], role: input, mask: {{row: I, col: T, {bounds}, dead: {dead}}}}}",
               "  A: {ranks: [I, T], role: input}", "  B: {ranks: [I], role: input}",
               "  D: {ranks: [I, T], role: input}"]
    lines, prev = [], "A"
    for n in range(4):
        name = f"P{n}"
        shape = draw(st.sampled_from(("pointwise", "sum", "max", "carried-max", "carried-sum")))
        expr = _expression(draw, 3, prev)
        if shape == "pointwise":
            lines.append(f"{name}[i,t] = {expr}")
        elif shape in ("sum", "max"):
            name = f"R{n}"
            lines.append(f"{name}[i] {'max=' if shape == 'max' else '='} {expr}")
        elif shape == "carried-max":
            lines.append(f"{name}[i,t] = max({name}[i,t-1], {expr})")
        else:
            lines.append(f"{name}[i,t] = {name}[i,t-1]*exp({expr}) + {_expression(draw, 2, prev)}")
        ranks = "[I]" if name.startswith("R") else "[I, T]"
        tensors.append(f"  {name}: {{ranks: {ranks}, role: output}}")
        if name.startswith("P"):
            prev = name
    return ("name: random-masked\nranks: {I: 6, T: 6}\ntensors:\n" + "\n".join(tensors)
            + "\neinsums:\n" + "\n".join(f"  - {line}" for line in lines) + "\n")


@settings(max_examples=150, deadline=None)
@given(text=_masked_programs(), seed=st.integers(0, 2**16))
def test_every_fact_holds_on_random_masked_programs(text: str, seed: int) -> None:
    """Random Einsums over a random mask (0 or -inf where it hides a key, any band): at every
    dead cell the analysis gives a tensor, the executed values (float64, random finite inputs)
    hold exactly its value: the algebra's rules, the -inf that 0 does not annihilate, the
    carried recurrences, for any program, not only the shipped ones."""
    try:
        c = loads_cascade(text)
    except SpecError:
        return  # a program the IR refuses (a shifted read of a tensor with no such rank, ...)
    rng = np.random.default_rng(seed)
    live = live_mask(c, "WM")
    dead_value = c.tensors["WM"].mask.dead
    inputs = {"WM": np.where(live, 0.0 if dead_value < 0 else rng.uniform(0.5, 1.5, live.shape), dead_value),
              "A": rng.uniform(-1, 1, (6, 6)), "B": rng.uniform(-1, 1, 6), "D": rng.uniform(1, 2, (6, 6))}
    with np.errstate(all="ignore"):
        values = execute(c, inputs, dtype="float64", keep="all")
    for tensor, fact in dead_work(c).facts.items():
        if tensor == "WM":
            continue
        got, dead = values[tensor], _dead_cells(c, tensor, fact)
        if fact.value == CARRIED:
            previous = np.concatenate([np.zeros_like(got[:, :1]), got[:, :-1]], axis=1)  # a read below 0 is 0
            assert np.array_equal(got[dead], previous[dead]), (tensor, text)
        else:
            expected = {ZERO: 0.0, NEG_INF: -np.inf, ONE: 1.0}[fact.value]
            assert np.all(got[dead] == expected), (tensor, fact.value, text)


def test_the_cascade_table_says_what_share_of_each_einsum_runs() -> None:
    """``mambalaya cascade show`` names, per Einsum, the share of its dense work that runs and
    why: the mask's frame and its live share, or all of it."""
    from mambalaya.einsum.stats import cascade_stats
    from mambalaya.report.tables import cascade_rows

    c = mamba2_layer(MAMBA2, batch=2, seq_len=L, scan="chunked")
    rows = {r["einsum"]: r for r in cascade_rows(cascade_stats(c))}
    assert rows["YDG"]["runs"] == rows["LD"]["runs"] == "mask q,s live 5/8"  # chunks of 4: (4+1)/(2*4)
    assert rows["CB"]["runs"] == "all" and rows["total"]["runs"] == ""


def test_a_kernels_tiles_compute_every_tile_the_diagonal_touches() -> None:
    """Masks skipped by a kernel's tiles (``with_mask_tiles``): with one tile per chunk, as FLA
    computes its chunk's in-chunk products, nothing is skipped; with half-chunk tiles, the tiles
    below and on the diagonal run (3 of 4); back to one key, the least work. A tile must hold
    whole cells of a blocked mask."""
    from mambalaya.einsum.dead_work import with_mask_tiles

    c = mamba2_layer(MAMBA2, batch=2, seq_len=L, scan="chunked")  # chunks of 4
    assert masked_variables(with_mask_tiles(c, 4, 4), "YDG") is None
    assert masked_variables(with_mask_tiles(c, 2, 2), "YDG")[1] == Fraction(3, 4)
    assert dead_work(with_mask_tiles(with_mask_tiles(c, 2, 2))).frames == dead_work(c).frames
    att = AttentionConfig(d_model=32, n_heads=4, n_kv_heads=2, head_dim=8)
    blocked = attention_layer(att, batch=1, seq_len=100, softmax="blocked", key_block=32)
    with pytest.raises(SpecError, match="whole cells of mask KM"):
        with_mask_tiles(blocked, 64, 48)
    # query tiles of 64 rows: rows 0-63 see blocks 0-1, rows 64-99 blocks 0-3 (of 4)
    assert masked_variables(with_mask_tiles(blocked, 64, 32), "SC")[1] == Fraction(64 * 2 + 36 * 4, 100 * 4)


def test_the_executor_refuses_mask_values_its_declaration_contradicts() -> None:
    """The cost model skips what a mask's declaration makes dead, so the executor refuses an
    array that disagrees with it, naming the tensor: a causal mask given for a three-key window,
    a window with a seen key at -inf, and a blocked key mask with a seen block all -inf."""
    c = loads_cascade(WINDOW)
    rng = np.random.default_rng(0)
    inputs = {t: rng.standard_normal(c.shape(t)) for t in ("Q", "K", "V", "A")}
    causal = np.where(np.tril(np.ones((10, 10))) > 0, 0.0, -np.inf)
    with pytest.raises(ExecutionError, match="array WM is not the mask tensor WM declares.*hides does not hold -inf"):
        execute(c, inputs | {"WM": causal}, dtype="float64")
    window = np.where(live_mask(c, "WM"), 0.0, -np.inf)
    window[5, 5] = -np.inf
    with pytest.raises(ExecutionError, match="a key its declaration says a query sees holds -inf"):
        execute(c, inputs | {"WM": window}, dtype="float64")
    att = AttentionConfig(d_model=32, n_heads=4, n_kv_heads=2, head_dim=8)
    blocked = attention_layer(att, batch=1, seq_len=100, softmax="blocked", key_block=32)
    km = attention_constants(blocked, att)["KM"]
    km[70, 2, :] = -np.inf  # query 70 sees block 2 (keys 64-95) in part
    with pytest.raises(ExecutionError, match="a block of keys its declaration says a query sees holds -inf throughout"):
        from mambalaya.execute.numpy_exec import check_arrays
        check_arrays(blocked, {t: np.zeros(blocked.shape(t)) for t in blocked.external_tensors()} | {"KM": km},
                     np.dtype("float64"))
