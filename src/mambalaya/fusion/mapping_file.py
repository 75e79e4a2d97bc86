"""Mapping files: a mapping as plain data and YAML (:func:`mapping_to_dict`, :func:`dump_mapping`),
read back with one-paragraph errors naming the field (:func:`mapping_from_dict`,
:func:`load_mapping`), and buffer sizes written with units (:func:`parse_bytes`)."""

from __future__ import annotations

from pathlib import Path


from mambalaya.arch.quantities import parse_byte_count
from mambalaya.errors import SpecError
from mambalaya.einsum.cascade import Cascade
from mambalaya.fusion.mapping import FusionGroup, Loop, Mapping, check_mapping, window_halos
from mambalaya.specio import dump_yaml, parse_yaml_text, read_spec_file


def parse_bytes(text: str | int, *, what: str = "buffer") -> int:
    """``32MiB`` -> 33554432; plain integers are bytes. Read as an architecture spec reads a byte
    size (:func:`~mambalaya.arch.quantities.parse_byte_count`: its units, case included, exact):
    ``1Mb``, a megabit, is refused, where it was once read as a megabyte."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        try:
            value = parse_byte_count(str(text))
        except ValueError as err:
            raise SpecError(f"{what} {text!r} is not a size ({err}): write e.g. 32MiB, 24MB, 1048576") from None
    if value < 1:
        raise SpecError(f"{what} must be positive, not {text!r}")
    return value


def mapping_to_dict(mapping: Mapping) -> dict:
    return {
        "name": mapping.name,
        **({"description": mapping.description} if mapping.description else {}),
        **({"buffer_bytes": mapping.buffer_bytes} if mapping.buffer_bytes else {}),
        "groups": [
            {
                "name": g.name,
                "einsums": list(g.einsums),
                "loops": [{"rank": lp.rank, "tile": lp.tile} for lp in g.loops],
                "halo": g.halo,
                **({"resident": list(g.resident)} if g.resident else {}),
            }
            for g in mapping.groups
        ],
    }


def dump_mapping(mapping: Mapping) -> str:
    return dump_yaml(mapping_to_dict(mapping), sort_keys=False, default_flow_style=None, width=100)


def _field(d: dict, key: str, kinds, where: str, source: str, default=...):
    if key not in d:
        if default is ...:
            raise SpecError(f"{where} needs the field {key!r}", source=source)
        return default
    value = d[key]
    if not isinstance(value, kinds) or isinstance(value, bool):
        raise SpecError(f"{where}.{key} has the wrong type ({type(value).__name__})", source=source)
    return value


def mapping_from_dict(data: object, *, source: str = "<mapping>") -> Mapping:
    if not isinstance(data, dict):
        raise SpecError("a mapping file is a YAML mapping with 'groups'", source=source)
    unknown = set(data) - {"name", "description", "buffer_bytes", "buffer", "groups"}
    if unknown:
        raise SpecError(f"unknown mapping field(s) {', '.join(sorted(map(str, unknown)))}", source=source)
    groups = []
    for n, gd in enumerate(_field(data, "groups", list, "mapping", source)):
        where = f"groups[{n}]"
        if not isinstance(gd, dict):
            raise SpecError(f"{where} must be a mapping with 'einsums' and 'loops'", source=source)
        extra = set(gd) - {"name", "einsums", "loops", "halo", "resident"}
        if extra:
            raise SpecError(f"{where} has unknown field(s) {', '.join(sorted(map(str, extra)))}", source=source)
        einsums = _field(gd, "einsums", list, where, source)
        if not all(isinstance(e, str) for e in einsums):
            raise SpecError(f"{where}.einsums must be Einsum names", source=source)
        loops = []
        for m, ld in enumerate(_field(gd, "loops", list, where, source, default=[])):
            lw = f"{where}.loops[{m}]"
            if not isinstance(ld, dict):
                raise SpecError(f"{lw} must be {{rank: R, tile: t}}", source=source)
            extra = set(ld) - {"rank", "tile"}
            if extra:  # (a group's `resident` written into a loop was read as no residency at all)
                raise SpecError(f"{lw} has unknown field(s) {', '.join(sorted(map(str, extra)))}; a loop is "
                                f"{{rank: R, tile: t}} (halo and resident belong to the group)", source=source)
            loops.append(Loop(_field(ld, "rank", str, lw, source), _field(ld, "tile", int, lw, source)))
        halo = _field(gd, "halo", str, where, source, default="retain")
        resident = _field(gd, "resident", list, where, source, default=[])
        if not all(isinstance(t, str) for t in resident):
            raise SpecError(f"{where}.resident must list tensor names", source=source)
        groups.append(FusionGroup(_field(gd, "name", str, where, source, default=f"G{n + 1}"), tuple(einsums), tuple(loops), halo,  # type: ignore[arg-type]
                                  tuple(resident)))
    if "buffer_bytes" in data and "buffer" in data:
        raise SpecError("buffer_bytes and buffer both give the buffer; give one", source=source)
    buffer = _field(data, "buffer_bytes", (int, str), "mapping", source, default=None) if "buffer_bytes" in data \
        else _field(data, "buffer", (int, str), "mapping", source, default=None)
    try:
        buffer_bytes = None if buffer is None else parse_bytes(buffer)
    except SpecError as err:
        raise SpecError(err.message, source=source) from None
    return Mapping(
        name=_field(data, "name", str, "mapping", source, default=Path(source).stem),
        groups=tuple(groups),
        buffer_bytes=buffer_bytes,
        description=_field(data, "description", str, "mapping", source, default=""),
    )


def check_mapping_file(cascade: Cascade, mapping: Mapping, source: str) -> Mapping:
    """:func:`~mambalaya.fusion.mapping.check_mapping` of a mapping read from the file ``source``:
    a rule it breaks is an error naming the file, not only the group. A group asking for
    ``halo: recompute`` whose fused loops cross no window (no
    :func:`~mambalaya.fusion.mapping.window_halos`) is refused: no halo is read, so both
    policies give the same numbers, and the file's choice would be ignored without a word."""
    try:
        checked = check_mapping(cascade, mapping)
    except SpecError as err:
        raise (err.at_source(source) if err.source is None else err) from None
    for g in checked.groups:
        if g.halo == "recompute" and not window_halos(cascade, g):
            fused = ", ".join(g.fused_ranks) or "none"
            raise SpecError(f"group {g.name}: halo: recompute, but its fused ranks ({fused}) cross no window of a tensor "
                            "it reads (a convolution's reach over a tiled rank), so no halo is read or recomputed and "
                            "retain and recompute give the same numbers; drop halo, or tile the windowed rank",
                            source=source)
    return checked


def load_mapping(path: str | Path) -> Mapping:
    source = str(path)
    data = parse_yaml_text(read_spec_file(source, "mapping file"), source=source)
    return mapping_from_dict(data, source=source)
