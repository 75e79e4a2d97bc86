"""Numbers that must not depend on how a cascade is written. The expert rank of a MoE block is
found by its role (the one rank of ``moe_experts`` positions every Einsum of the experts region
runs over and their weights have), never by its name: a cascade file that called it ``Z`` read
every expert's weights whole while its operations were routed (a Granite 4 decode step at 2.4x its
latency and bytes). A product's operation count does not depend on the order of its factors. And
``cascade dump`` writes a file ``cascade check`` reads back, for every shipped layer (a chained
layer's ranks named a block's own parameters, which it dropped)."""

from __future__ import annotations

import math
import re

import pytest

from mambalaya.arch import load_arch
from mambalaya.cost.latency import layer_latency
from mambalaya.einsum.cascade_file import dump_cascade, loads_cascade
from mambalaya.errors import SpecError
from mambalaya.einsum.routing import expert_rank
from mambalaya.search.mappings import ideal
from mambalaya.workloads import PRESETS, build_layer
from mambalaya.workloads.shipped import shipped_layers


def _renamed(text: str, old: str, new: str) -> str:
    return re.sub(rf"\b{old.lower()}\b", new.lower(), re.sub(rf"\b{old}\b", new, text))


def test_a_renamed_expert_rank_costs_the_same() -> None:
    arch = load_arch("mambalaya")
    layer = build_layer(PRESETS["granite-4.0-h-tiny"], phase="decode", seq_len=256, batch=4, layer_type="attention-moe")
    text = dump_cascade(layer)
    assert "\n  Z:" not in text and "\n  X:" in text
    costs = []
    for c in (loads_cascade(text), loads_cascade(_renamed(text, "X", "Z"))):
        result = layer_latency(arch, c, ideal(c))
        costs.append((result.latency_s, result.offchip_bytes))
    assert expert_rank(loads_cascade(_renamed(text, "X", "Z"))) == "Z"
    assert costs[0] == pytest.approx(costs[1], rel=1e-12)


def test_an_experts_region_without_one_expert_rank_is_refused() -> None:
    layer = build_layer(PRESETS["granite-4.0-h-tiny"], phase="decode", seq_len=256, batch=4, layer_type="attention-moe")
    text = dump_cascade(layer).replace("  moe_experts: 64", "  moe_experts: 63")
    with pytest.raises(SpecError, match="expert rank") as info:  # (read, not first met by the cost model)
        loads_cascade(text, source="moe.yaml")
    assert "moe.yaml" in str(info.value)


@pytest.mark.slow
def test_every_shipped_layer_dumps_to_a_file_that_reads_back_equal() -> None:
    checked = 0
    for layer in shipped_layers(seq_len=64, batch=2):
        c = layer.cascade
        back = loads_cascade(dump_cascade(c))
        assert [e.name for e in back.einsums] == [e.name for e in c.einsums], c.name
        assert {r: back.size(r) for r in back.ranks} == {r: c.size(r) for r in c.ranks}, c.name
        assert back.params == c.params, c.name
        checked += 1
    assert checked > 40


def test_a_size_with_a_leading_zero_is_refused_as_a_param_is() -> None:
    layer = build_layer(PRESETS["mamba-130m"], phase="prefill", seq_len=64, batch=1)
    text = dump_cascade(layer)
    assert "\n  I: L\n" in text
    assert loads_cascade(text.replace("\n  I: L\n", "\n  I: 1*64\n")).size("I") == 64
    for size in ("064", "1*064"):
        with pytest.raises(SpecError, match="leading zero"):
            loads_cascade(text.replace("\n  I: L\n", f"\n  I: {size}\n"))


def _reversed_products(text: str) -> tuple[str, list[str]]:
    """``text`` with every Einsum that is a product of three or more tensors written backwards."""
    names, lines = [], []
    for line in text.splitlines():
        m = re.fullmatch(r"(  - )(\w+)(\[[^\]]*\]) = ((?:\w+\[[^\]]*\]\*){2,}\w+\[[^\]]*\])", line)
        if m:
            factors = re.findall(r"\w+\[[^\]]*\]", m.group(4))
            line = f"{m.group(1)}{m.group(2)}{m.group(3)} = {'*'.join(reversed(factors))}"
            names.append(m.group(2))
        lines.append(line)
    return "\n".join(lines) + "\n", names


@pytest.mark.slow
def test_a_products_operation_count_does_not_depend_on_the_order_it_is_written_in() -> None:
    """The multiplies of a reduced product are those of the split the array runs
    (einsum.products.product_sides): the chunked delta rule's W = TI*BETA*KN*DO counted 32x the
    multiplies written TI*BETA*KN*DO as written TI*(BETA*KN*DO)."""
    from mambalaya.einsum.stats import einsum_ops

    checked = 0
    for layer in shipped_layers(seq_len=64, batch=2):
        text, names = _reversed_products(dump_cascade(layer.cascade))
        if not names:
            continue
        back = loads_cascade(text)
        for name in names:
            c = layer.cascade
            ops = einsum_ops(c, c.einsum(name))
            if "mac" in ops:
                assert einsum_ops(back, back.einsum(name)) == ops, (c.name, name)
                checked += 1
    assert checked >= 12  # (15 products of three or more tensors with MACs over the shipped layers)


@pytest.mark.parametrize("product", ["A[m]*B[m]*C[n,m]", "C[n,m]*A[m]*B[m]", "C[n,m]*(A[m]*B[m])",
                                     "(C[n,m]*A[m])*B[m]"])
def test_a_product_without_a_matrix_split_is_counted_in_its_fewest_multiplies(product: str) -> None:
    """A matrix-vector product scaled per key joins the per-key factors first however it is
    written (the parentheses were once dropped, and the written order kept)."""
    from mambalaya.einsum.stats import einsum_ops

    text = ("name: t\nranks: {N: 256, M: 4}\ntensors:\n  A: {ranks: [M], role: input}\n"
            "  B: {ranks: [M], role: input}\n  C: {ranks: [N, M], role: input}\n  O: {ranks: [N], role: output}\n"
            f"einsums:\n  - O[n] = {product}\n")
    c = loads_cascade(text)
    assert einsum_ops(c, c.einsum("O")) == {"mac": 256 * 4, "mul": 4}


def test_chain_multiplies_is_the_least_over_every_order() -> None:
    from itertools import permutations

    from mambalaya.einsum.products import chain_multiplies

    sizes = {"a": 2, "b": 3, "c": 2, "d": 4, "e": 3}
    parts = [frozenset("b"), frozenset("abe"), frozenset("de"), frozenset("ce")]
    points = lambda ranks: math.prod(sizes[r] for r in ranks)  # noqa: E731
    counts = {chain_multiplies(list(order), points) for order in permutations(parts)}
    assert len(counts) == 1
