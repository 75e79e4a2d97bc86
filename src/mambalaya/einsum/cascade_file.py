"""Cascade files: YAML with parameters, ranks, tensors and one Einsum a line.

.. code-block:: yaml

    name: rmsnorm
    params: {d_model: 768, eps: 1.0e-05}
    ranks: {B: 1, I: 16, D: d_model}          # sizes: integers or expressions of params/ranks
    tensors:
      X:  {ranks: [B, I, D], role: input, bits: 16}
      WN: {ranks: [D], role: weight}
      SS: {ranks: [B, I], role: intermediate}
      Y:  {ranks: [B, I, D], role: output}
    einsums:
      - SS[b,i] = X[b,i,d]*X[b,i,d]
      - Y[b,i,d] = X[b,i,d]*rsqrt(SS[b,i]/D + eps)*WN[d]

A constant mask input says which keys it hides (``mask``, :class:`~mambalaya.einsum.ir.Mask`:
``LM: {ranks: [Q, S], role: input, mask: {row: Q, col: S, upper: 0, dead: -inf}}`` is a causal
mask in log space), so that the cost model skips the work it makes dead.

The file is read with PyYAML's safe composer, so every error can name the line and column of
the node at fault. :func:`dump_cascade` writes text that :func:`load_cascade` reads back to an
equal cascade.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from mambalaya.arch.quantities import MAX_ELEMENT_BITS
from mambalaya.errors import SpecError
from mambalaya.specio import compose_yaml_text, dump_yaml, read_spec_file
from mambalaya.einsum.cascade import Cascade, build_cascade
from mambalaya.einsum.dead_work import check_history_reads
from mambalaya.einsum.routing import expert_rank
from mambalaya.einsum.ir import MASK_DEAD_VALUES, Einsum, Mask, Rank, Role, TensorSpec
from mambalaya.einsum.parse import Where, evaluate_size, parse_einsum

_TOP_KEYS = {"name", "description", "params", "ranks", "tensors", "einsums", "regions"}
_TENSOR_KEYS = {"ranks", "role", "bits", "initial", "updates", "description", "mask"}
_MASK_KEYS = ("row", "col", "block", "lower", "upper", "offset", "dead", "row_tile", "col_tile")


class _Reader:
    """Turns composed YAML nodes into values, with errors that point into the file."""

    def __init__(self, source: str) -> None:
        self.source = source

    def error(self, node: yaml.Node | None, message: str) -> SpecError:
        if node is None:
            return SpecError(message, source=self.source)
        return SpecError(
            message, source=self.source, line=node.start_mark.line + 1, column=node.start_mark.column + 1
        )

    def mapping(self, node: yaml.Node, what: str) -> list[tuple[yaml.ScalarNode, yaml.Node]]:
        if not isinstance(node, yaml.MappingNode):
            raise self.error(node, f"{what} must be a mapping")
        keys: set[str] = set()
        for k, _ in node.value:
            if not isinstance(k, yaml.ScalarNode):
                raise self.error(k, f"keys of {what} must be plain names")
            if k.value in keys:
                raise self.error(k, f"{what} has key {k.value!r} twice")
            keys.add(k.value)
        return list(node.value)

    def sequence(self, node: yaml.Node, what: str) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.error(node, f"{what} must be a list")
        return list(node.value)

    def scalar(self, node: yaml.Node, what: str) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            raise self.error(node, f"{what} must be a single value")
        if node.tag == "tag:yaml.org,2002:str":
            return node.value
        try:
            return yaml.safe_load(yaml.serialize(node))
        except Exception:  # PyYAML's constructors raise ConstructorError, ValueError, KeyError, ...
            raise self.error(node, f"{what}: cannot read {node.value!r} as {node.tag}") from None

    def string(self, node: yaml.Node, what: str) -> str:
        value = self.scalar(node, what)
        if not isinstance(value, str):
            raise self.error(node, f"{what} must be text, found {value!r}")
        return value

    def name(self, node: yaml.Node, what: str) -> str:
        """A name, as written: ``NO`` and ``ON`` are names here, not YAML 1.1 booleans."""
        if not isinstance(node, yaml.ScalarNode):
            raise self.error(node, f"{what} must be a name")
        return node.value

    def text_position(self, node: yaml.ScalarNode) -> Where:
        quoted = 1 if node.style in ("'", '"') else 0
        return Where(self.source, node.start_mark.line + 1, node.start_mark.column + 1 + quoted)


def load_cascade(path: str | Path) -> Cascade:
    """Read and validate a cascade file."""
    path = Path(path)
    return loads_cascade(read_spec_file(path, "cascade file"), source=str(path))


def loads_cascade(text: str, *, source: str = "<string>") -> Cascade:
    r = _Reader(source)
    root = compose_yaml_text(text, source=source)
    if root is None:
        raise SpecError("the cascade file is empty", source=source, line=1, column=1)
    top = {k.value: (k, v) for k, v in r.mapping(root, "the cascade file")}
    for key, (knode, _) in top.items():
        if key not in _TOP_KEYS:
            raise r.error(knode, f"unknown field {key!r}; the fields are {', '.join(sorted(_TOP_KEYS))}")
    for key in ("ranks", "tensors", "einsums"):
        if key not in top:
            raise r.error(root, f"the cascade file needs a field {key!r}")

    name = r.string(top["name"][1], "name") if "name" in top else Path(source).stem
    description = r.string(top["description"][1], "description") if "description" in top else ""

    params: dict[str, float] = {}
    param_lines: dict[str, int] = {}
    if "params" in top:
        for k, v in r.mapping(top["params"][1], "params"):
            value = r.scalar(v, f"params.{k.value}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:  # NaN
                raise r.error(v, f"params.{k.value} must be a number, found {value!r}")
            params[k.value] = value
            param_lines[k.value] = k.start_mark.line + 1

    env: dict[str, float] = dict(params)
    ranks: list[Rank] = []
    rank_lines: dict[str, int] = {}
    for k, v in r.mapping(top["ranks"][1], "ranks"):
        rank_lines[k.value] = k.start_mark.line + 1
        raw = r.scalar(v, f"ranks.{k.value}")
        if isinstance(raw, bool):
            raise r.error(v, f"ranks.{k.value} must be a positive integer or a size expression")
        if isinstance(raw, int):
            if raw < 1:
                raise r.error(v, f"ranks.{k.value} = {raw}: a size is a positive integer")
            ranks.append(Rank(k.value, raw))
        else:
            expr = str(raw)
            if _LEADING_ZERO.search(expr):  # (0100 was read as 100 here, while params refuse it as text)
                raise r.error(v, f"ranks.{k.value} = {expr!r}: a number with a leading zero is text in a cascade "
                                 "file (YAML reads 0100 as octal or text, never as 100); write it without the zero")
            size = evaluate_size(expr, env, where=r.text_position(v))
            ranks.append(Rank(k.value, size, expr))
        env[k.value] = ranks[-1].size
    sizes = {rk.name: rk.size for rk in ranks}

    tensor_items = r.mapping(top["tensors"][1], "tensors")
    tensors = [_read_tensor(r, k, v) for k, v in tensor_items]
    tensor_lines = {k.value: k.start_mark.line + 1 for k, _ in tensor_items}

    einsums: list[Einsum] = []
    lines: dict[str, int] = {}
    by_name: dict[str, Einsum] = {}
    for item in r.sequence(top["einsums"][1], "einsums"):
        line = r.string(item, "an Einsum")
        e = parse_einsum(line, sizes=sizes, where=r.text_position(item))  # type: ignore[arg-type]
        if e.name in lines:
            raise SpecError(
                f"output tensor {e.name} is defined twice (line {lines[e.name]}: '{by_name[e.name]}', "
                f"and here: '{e}')",
                source=source,
                line=item.start_mark.line + 1,
                column=item.start_mark.column + 1,
                einsum=e.name,
            )
        einsums.append(e)
        lines[e.name] = item.start_mark.line + 1
        by_name[e.name] = e

    regions: dict[str, list[str]] = {}
    if "regions" in top:
        for k, v in r.mapping(top["regions"][1], "regions"):
            regions[k.value] = [r.string(n, f"regions.{k.value}") for n in r.sequence(v, f"regions.{k.value}")]

    cascade = build_cascade(
        name=name,
        params=params,
        ranks=ranks,
        tensors=tensors,
        einsums=einsums,
        description=description,
        regions=regions,
        source=source,
        einsum_lines=lines,
        tensor_lines=tensor_lines,
        rank_lines=rank_lines,
        param_lines=param_lines,
    )
    try:
        check_history_reads(cascade)
    except SpecError as err:
        raise SpecError(getattr(err, "message", str(err)), source=source, line=lines.get(err.einsum or ""),
                        einsum=err.einsum) from None
    try:  # an experts region needs its expert rank: refused here, naming the file (cascade check said "valid")
        expert_rank(cascade)
    except SpecError as err:
        raise SpecError(getattr(err, "message", str(err)), source=source) from None
    return cascade


_YAML_BREAK = re.compile("\r\n|[\r\n\x85\u2028\u2029]")


def _line_column(text: Any, position: int) -> tuple[int, int | None]:
    """1-based line and column of a character offset, counting line breaks as YAML does."""
    if not isinstance(text, str):
        return 1, None
    breaks = list(_YAML_BREAK.finditer(text, 0, position))
    start = breaks[-1].end() if breaks else 0
    return len(breaks) + 1, position - start + 1


def _char_name(character: Any) -> str:
    code = character if isinstance(character, int) else ord(character) if len(character) == 1 else None
    return repr(character) if code is None else f"#x{code:04x}"


def _read_tensor(r: _Reader, key: yaml.ScalarNode, node: yaml.Node) -> TensorSpec:
    name = key.value
    fields = {k.value: (k, v) for k, v in r.mapping(node, f"tensors.{name}")}
    for f, (knode, _) in fields.items():
        if f not in _TENSOR_KEYS:
            raise r.error(knode, f"tensors.{name} has unknown field {f!r}; fields: {', '.join(sorted(_TENSOR_KEYS))}")
    if "ranks" not in fields or "role" not in fields:
        raise r.error(node, f"tensors.{name} needs 'ranks' and 'role'")
    rank_nodes = r.sequence(fields["ranks"][1], f"tensors.{name}.ranks")
    tensor_ranks = tuple(r.name(n, f"tensors.{name}.ranks") for n in rank_nodes)
    role_node = fields["role"][1]
    role_text = r.string(role_node, f"tensors.{name}.role")
    try:
        role = Role(role_text)
    except ValueError:
        raise r.error(role_node, f"tensors.{name}.role is {role_text!r}; roles: {', '.join(x.value for x in Role)}") from None
    bits = 16
    if "bits" in fields:
        bits = r.scalar(fields["bits"][1], f"tensors.{name}.bits")
        if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= MAX_ELEMENT_BITS:
            raise r.error(fields["bits"][1], f"tensors.{name}.bits must be an integer from 1 to {MAX_ELEMENT_BITS} "
                          f"(IEEE double precision is the widest element), found {bits!r}")
    initial = r.name(fields["initial"][1], f"tensors.{name}.initial") if "initial" in fields else None
    updates = r.name(fields["updates"][1], f"tensors.{name}.updates") if "updates" in fields else None
    description = r.string(fields["description"][1], f"tensors.{name}.description") if "description" in fields else ""
    mask = _read_mask(r, fields["mask"][1], f"tensors.{name}.mask") if "mask" in fields else None
    return TensorSpec(name, tensor_ranks, role, bits, initial, updates, description, mask)


def _read_mask(r: _Reader, node: yaml.Node, what: str) -> Mask:
    """``{row: Q, col: S, upper: 0, dead: -inf}`` (:class:`~mambalaya.einsum.ir.Mask`): ranks
    by name, bounds and offset integers, ``dead`` 0 or -inf; the cascade checks the rest."""
    fields = {k.value: (k, v) for k, v in r.mapping(node, what)}
    for f, (knode, _) in fields.items():
        if f not in _MASK_KEYS:
            raise r.error(knode, f"{what} has unknown field {f!r}; fields: {', '.join(_MASK_KEYS)}")
    for needed, why in (("col", "the rank of the keys it masks"), ("dead", "0 or -inf: what it holds where it hides a key")):
        if needed not in fields:
            raise r.error(node, f"{what} needs '{needed}' ({why})")
    values: dict[str, Any] = {}
    for f in ("row", "col", "block"):
        if f in fields:
            values[f] = r.name(fields[f][1], f"{what}.{f}")
    for f in ("lower", "upper", "offset", "row_tile", "col_tile"):
        if f in fields:
            value = r.scalar(fields[f][1], f"{what}.{f}")
            if isinstance(value, bool) or not isinstance(value, int):
                raise r.error(fields[f][1], f"{what}.{f} must be an integer, found {value!r}")
            values[f] = value
    if "dead" in fields:
        dead = r.scalar(fields["dead"][1], f"{what}.dead")
        if dead == "-inf":
            dead = float("-inf")
        if isinstance(dead, bool) or not isinstance(dead, (int, float)) or float(dead) not in MASK_DEAD_VALUES:
            raise r.error(fields["dead"][1], f"{what}.dead must be 0 or -inf (what the mask holds where it hides a key), "
                          f"found {dead!r}")
        values["dead"] = float(dead)
    return Mask(**values)


def _mask_text(m: Mask) -> str:
    fields = [f"{f}: {getattr(m, f)}" for f in ("row", "col", "block", "lower", "upper") if getattr(m, f) is not None]
    if m.offset:
        fields.append(f"offset: {m.offset}")
    fields += [f"{f}: {getattr(m, f)}" for f in ("row_tile", "col_tile") if getattr(m, f) != 1]
    fields.append(f"dead: {'-inf' if m.dead < 0 else 0}")
    return "{" + ", ".join(fields) + "}"


def _scalar_text(value: Any) -> str:
    return dump_yaml(value, default_flow_style=True, width=10**9).strip().removesuffix("...").strip()


def _quoted_text(value: str) -> str:
    """``value`` as one double-quoted YAML line (``json.dumps`` would split characters outside
    the BMP into surrogate pairs, which YAML reads back as two broken characters)."""
    text = yaml.safe_dump(value, default_style='"', width=10**9, allow_unicode=True)
    return text.strip().removesuffix("...").strip()


#: A number written with a leading zero (``0100``, not ``0`` or ``0.5``) inside a size expression.
_LEADING_ZERO = re.compile(r"(?<![\w.])0\d")


def _rank_size_text(rank, env: dict[str, float]) -> str:
    """A rank's size as a dumped file writes it: its expression where the file's params and the
    ranks before it give it its size, else the number (a chained layer's ranks may name a block's
    own parameter, ``num_experts``, that the layer's params do not carry)."""
    if rank.size_expr:
        try:
            if evaluate_size(rank.size_expr, env) == rank.size:
                return _scalar_text(rank.size_expr)
        except SpecError:
            pass
    return str(rank.size)


def dump_cascade(c: Cascade) -> str:
    """The cascade as a YAML cascade file that loads back to an equal cascade."""
    out = [f"name: {_scalar_text(c.name)}"]
    if c.description:
        out.append(f"description: {_quoted_text(c.description)}")
    if c.params:
        out.append("params:")
        out += [f"  {k}: {_scalar_text(v)}" for k, v in c.params.items()]
    out.append("ranks:")
    env: dict[str, float] = dict(c.params)
    for rk in c.ranks.values():
        out.append(f"  {rk.name}: {_rank_size_text(rk, env)}")
        env[rk.name] = rk.size
    out.append("tensors:")
    for t in c.tensors.values():
        fields = [f"ranks: [{', '.join(t.ranks)}]", f"role: {t.role.value}", f"bits: {t.bits}"]
        if t.initial:
            fields.append(f"initial: {t.initial}")
        if t.updates:
            fields.append(f"updates: {t.updates}")
        if t.mask is not None:
            fields.append(f"mask: {_mask_text(t.mask)}")
        if t.description:
            fields.append(f"description: {_quoted_text(t.description)}")
        out.append(f"  {t.name}: {{{', '.join(fields)}}}")
    out.append("einsums:")
    out += [f"  - {_scalar_text(str(e))}" for e in c.einsums]
    if c.regions:
        out.append("regions:")
        out += [f"  {name}: [{', '.join(members)}]" for name, members in c.regions.items()]
    return "\n".join(out) + "\n"
