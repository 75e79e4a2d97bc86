"""Fusion classes and dependency kinds of the Mamba-1 edges (DESIGN.md §4), checked by hand."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from mambalaya.cli import app
from mambalaya.fusion.edges import classify_edges, fusion_class
from mambalaya.workloads.blocks.mamba1 import PRESETS, mamba1_layer


def edges_by_key(phase="prefill"):
    c = mamba1_layer(PRESETS["mamba-130m"], batch=2, seq_len=16 if phase == "prefill" else 1, phase=phase)
    return {(e.producer, e.consumer, e.tensor): e for e in classify_edges(c)}


def test_class_rule() -> None:
    assert fusion_class(set(), set()) == "RI"
    assert fusion_class({"D"}, set()) == "RSb"
    assert fusion_class(set(), {"E"}) == "RSp"
    assert fusion_class({"E"}, {"E"}) == "RD"


def test_mamba1_edges_by_hand() -> None:
    e = edges_by_key()
    expect = {
        ("SS", "RS", "SS"): ("RSb", "aligned", ()),
        ("XN", "XI", "XN"): ("RSp", "aligned", ()),  # XI sweeps E for each XN element
        ("XI", "XC", "XI"): ("RSb", "window", ()),  # XI reduces D; the conv has a K-1 halo on I
        ("AD", "H", "AD"): ("RI", "aligned", ()),
        ("H", "H", "H"): ("RI", "recurrent", ()),
        ("H", "YS", "H"): ("RI", "aligned", ()),
        ("CM", "YS", "CM"): ("RD", "aligned", ("E",)),  # reduced over E, then reused over E
        ("BM", "BX", "BM"): ("RD", "aligned", ("E",)),
        ("YG", "O", "YG"): ("RSp", "aligned", ()),
        ("O", "XO", "O"): ("RSb", "aligned", ()),
        (None, "XN", "X"): ("RI", "reduce-then-reuse", ("D",)),  # X around RMSNorm
        ("U", "YD", "U"): ("RI", "reduce-then-reuse", ("E",)),  # U around x_proj
    }
    for key, (cls, dep, boundary) in expect.items():
        assert e[key].fusion_class == cls, key
        assert e[key].dependency == dep, key
        assert e[key].pass_boundary == boundary, key
    assert "window(I, halo 3)" in e[("XI", "XC", "XI")].dependencies
    assert "recurrent(I, distance 1)" in e[("H", "H", "H")].dependencies


def test_decode_conv_state_out_is_a_select() -> None:
    e = edges_by_key("decode")
    csn = e[("XI", "CSN", "XI")]
    assert csn.dependency == "select" and csn.consumer_only == ()


def test_fusion_classes_cli_json() -> None:
    r = CliRunner().invoke(app, ["fusion", "classes", "--model", "mamba-1.4b", "--phase", "prefill", "--seq-len", "2048", "--batch", "64", "--format", "json"])
    assert r.exit_code == 0, r.output
    edges = json.loads(r.stdout)
    for edge in edges:
        for key in ("producer", "consumer", "tensor", "fusion_class", "dependency"):
            assert key in edge
    classes = {edge["fusion_class"] for edge in edges}
    assert classes == {"RI", "RSb", "RSp", "RD"}


def test_a_tensor_read_in_one_additive_term_is_swept_only_by_that_term() -> None:
    """Each additive term is reduced over the variables it has, so a rank only another term
    sweeps is not the read tensor's P_V: the chunked delta rule's ``ST`` in ``HC = CD*HC[c-1] + ST
    - KW*HC[c-1,..,m]`` is RSb (it printed RD, M in P_V); the blocked softmax's running output
    ``OR = OR[tb-1]*CF + PE*V`` reads itself in a term without TQ (it printed RD with a pass
    boundary on TQ); the rotary's other half is a reflection, not a select."""
    from mambalaya.workloads import PRESETS as ALL, build_layer

    gdn = build_layer(ALL["olmo-hybrid"], phase="prefill", seq_len=256, batch=1, scan="chunked")
    st = next(e for e in classify_edges(gdn) if (e.producer, e.consumer, e.tensor) == ("ST", "HC", "ST"))
    assert (st.fusion_class, st.consumer_only) == ("RSb", ())
    blocked = build_layer(ALL["bamba-9b"], phase="prefill", seq_len=256, batch=1, layer_type="attention",
                          softmax="blocked")
    edges = {(e.producer, e.consumer, e.tensor): e for e in classify_edges(blocked)}
    running = edges[("OR", "OR", "OR")]
    assert (running.fusion_class, running.pass_boundary) == ("RSb", ())
    assert edges[("QA", "QR", "QA")].dependencies == ("reflect(U)",)


def test_the_layer_commands_take_the_softmax_form() -> None:
    """``cascade show`` and ``fusion classes`` build an attention layer's online and blocked forms
    too (they were reachable from Python only), and refuse ``--softmax`` on a layer without
    attention, naming the option."""
    run = CliRunner().invoke
    base = ["--model", "bamba-9b", "-L", "256", "--format", "csv"]
    online = run(app, ["fusion", "classes", *base, "--layer-type", "attention", "--softmax", "online"])
    three = run(app, ["fusion", "classes", *base, "--layer-type", "attention"])
    assert online.exit_code == three.exit_code == 0
    assert "OR,OR,OR" in online.output and "OR,OR,OR" not in three.output
    blocked = run(app, ["cascade", "show", *base, "--layer-type", "attention", "--softmax", "blocked"])
    assert blocked.exit_code == 0 and ",OR,recurrent," in blocked.output and ",KBX," in blocked.output
    refused = run(app, ["fusion", "classes", *base, "--layer-type", "mamba", "--softmax", "online"])
    assert refused.exit_code == 1 and "--softmax online" in refused.output


def test_a_state_read_as_an_initial_value_has_its_own_edge() -> None:
    """A decode step reads its states as the values below position 0 of what it computes (the
    scan's H0, the conv's window over CS0, the scores over the KV cache): each has an edge from
    no producer, ``initial(I)``; they were not listed though the docs said incoming state was. A
    read that never reaches below 0 (the readout H[b,i,..]) has none."""
    e = edges_by_key("decode")
    assert e[(None, "H", "H0")].dependencies == ("initial(I)",)
    assert e[(None, "XC", "CS0")].dependencies == ("initial(I)",)
    assert (None, "YS", "H0") not in e
    from mambalaya.workloads import PRESETS as ALL, build_layer

    attention = build_layer(ALL["bamba-9b"], phase="decode", seq_len=64, batch=1, layer_type="attention")
    cached = {(x.consumer, x.tensor) for x in classify_edges(attention) if x.dependency == "initial"}
    assert {("SC", "KC0A"), ("SC", "KC0B"), ("AO", "VC0")} <= cached
