"""The loader core shared by every model family's real-weights loader.

It reads a checkpoint, whatever its container, as a lazy ``key -> numpy array`` source (a
state_dict in memory, a ``.safetensors`` file read without torch, a ``.bin``/``.pt`` pickle, a
shard index or a model directory), finds the key prefix of one layer, checks that the layer holds
exactly the keys its family models, and offers the checks and layout helpers every family needs
(dtype resolution, ranks, shapes, floating point, C-contiguous layouts). Every failure is a
:class:`WeightLoadError` naming the file and key at fault.

A family module keeps only what is its own: a :class:`LayerKeys` (its parameter names relative to
the layer prefix, the keys it cannot model and why, hints for missing keys), the dimensions it
infers and the reshapes into mambalaya's layouts. Loading a layer is then::

    out_dtype = resolve_dtype(dtype, KEYS.family)
    tensors = read_layer(source, layer, KEYS)   # every key checked present and fetched
    tensors.require_floating()
    tensors.require_ndim("norm.weight", 1)
    ...
    return {"WN": as_layout(tensors["norm.weight"], out_dtype), ...}

torch is imported only to read ``.bin``/``.pt`` files or to convert torch tensors handed in.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mambalaya.errors import MambalayaError, SpecError
from mambalaya.specio import parse_json_text, read_spec_file

__all__ = [
    "LayerKeys",
    "LayerTensors",
    "TensorSource",
    "WeightLoadError",
    "a_from_log",
    "as_layout",
    "fmt_shape",
    "layer_prefix",
    "open_source",
    "read_layer",
    "resolve_dtype",
    "to_numpy",
]


class WeightLoadError(MambalayaError):
    """Real weights, a config or states could not be read into mambalaya's layouts."""


_LAYER_KEY = re.compile(r"^(?P<prefix>(?:.*\.)?layers\.)(?P<index>\d+)\.(?P<rest>.+)$")

_SAFETENSORS_SUFFIXES = (".safetensors",)
_TORCH_SUFFIXES = (".bin", ".pt", ".pth")


# --------------------------------------------------------------------------------------------
# dtype handling
# --------------------------------------------------------------------------------------------


def resolve_dtype(dtype: Any, family: str) -> np.dtype:
    """``dtype`` as a numpy dtype if it is float32 or float64; ``family`` (e.g. "Mamba-1") names
    the model family in the error."""
    try:
        resolved = np.dtype(dtype)
    except TypeError:
        resolved = None
    if resolved is None or resolved not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise WeightLoadError(
            f"Unsupported dtype {dtype!r}: mambalaya loads {family} weights and states as "
            "'float32' or 'float64' only."
        )
    return resolved


def _is_torch_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def to_numpy(value: Any, what: str) -> np.ndarray:
    """A numpy view/copy of a torch tensor or array-like, widened so no precision is lost."""
    if _is_torch_tensor(value):
        import torch  # only reached when a torch tensor was handed in

        tensor = value.detach().cpu()
        if tensor.dtype == torch.float64:
            return tensor.numpy()
        if tensor.is_floating_point():
            # bfloat16/float16/float8 have no (or no safe) numpy twin: widen exactly to float32.
            return tensor.to(torch.float32).numpy()
        return tensor.numpy()
    try:
        return np.asarray(value)
    except Exception as exc:  # pragma: no cover - defensive
        raise WeightLoadError(f"{what} is not an array or tensor ({type(value).__name__}): {exc}")


def fmt_shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _fmt_layers(indices: list[int]) -> str:
    """0,1,2,3,7 -> '0-3, 7'."""
    if not indices:
        return "none"
    indices = sorted(set(indices))
    runs: list[str] = []
    start = prev = indices[0]
    for i in indices[1:] + [None]:  # type: ignore[list-item]
        if i is not None and i == prev + 1:
            prev = i
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ", ".join(runs)


# --------------------------------------------------------------------------------------------
# Tensor sources: a small lazy "key -> array" reader over every supported container
# --------------------------------------------------------------------------------------------


class TensorSource:
    """Lists keys and fetches single tensors (as numpy, float32 or wider) from a container."""

    def __init__(self, description: str, keys: list[str]) -> None:
        self.description = description
        self.keys = keys

    def get(self, key: str) -> np.ndarray:  # pragma: no cover - overridden
        raise NotImplementedError


class _MappingSource(TensorSource):
    def __init__(self, mapping: Mapping[str, Any], description: str) -> None:
        bad = [k for k in mapping if not isinstance(k, str)]
        if bad:
            raise WeightLoadError(
                f"The state_dict given as {description} has non-string keys (e.g. {bad[0]!r}); "
                "expected a mapping of parameter names to tensors or arrays."
            )
        super().__init__(description, list(mapping.keys()))
        self._mapping = mapping

    def get(self, key: str) -> np.ndarray:
        return to_numpy(self._mapping[key], f"Entry {key!r} of {self.description}")


_ST_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2",
    "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?",
}


def _read_safetensors_header(path: Path) -> tuple[dict[str, Any], int]:
    try:
        with open(path, "rb") as fh:
            raw_len = fh.read(8)
            if len(raw_len) != 8:
                raise ValueError("file is shorter than the 8-byte header length")
            header_len = int.from_bytes(raw_len, "little")
            if header_len <= 0 or header_len > 100_000_000:
                raise ValueError(f"implausible header length {header_len}")
            header = parse_json_text(fh.read(header_len).decode("utf-8"), source="its header")
            if not isinstance(header, dict):
                raise ValueError("header is not a JSON object")
    except (OSError, ValueError, UnicodeDecodeError, SpecError) as exc:
        raise WeightLoadError(
            f"Cannot read {path} as a safetensors file: {exc}. The file is corrupt, truncated, "
            "or not in the safetensors format."
        ) from None
    header.pop("__metadata__", None)
    return header, 8 + header_len


class _SafetensorsSource(TensorSource):
    """Reads tensors one at a time; bfloat16 is widened to float32 without torch."""

    def __init__(self, paths: dict[str, Path], description: str) -> None:
        # ``paths`` maps every key to the file holding it (one file, or the shards of a model).
        super().__init__(description, list(paths.keys()))
        self._paths = paths
        self._headers: dict[Path, tuple[dict[str, Any], int]] = {}

    @classmethod
    def from_file(cls, path: Path) -> _SafetensorsSource:
        header, _ = _read_safetensors_header(path)
        return cls({k: path for k in header}, str(path))

    def _header(self, path: Path) -> tuple[dict[str, Any], int]:
        if path not in self._headers:
            self._headers[path] = _read_safetensors_header(path)
        return self._headers[path]

    def get(self, key: str) -> np.ndarray:
        path = self._paths[key]
        header, data_start = self._header(path)
        if key not in header:
            raise WeightLoadError(
                f"{path} does not contain {key!r} although the shard index says it does."
            )
        info = header[key]
        shape_list, offsets = (info.get("shape", ()), info.get("data_offsets")) if isinstance(info, dict) else ((), ())
        if not (isinstance(offsets, list) and len(offsets) == 2 and isinstance(shape_list, list)
                and all(type(x) is int and x >= 0 for x in (*shape_list, *offsets))):
            raise WeightLoadError(f"The safetensors header of {path} describes tensor {key!r} as {info!r:.200}, not "
                                  "an object with a dtype, a shape and two data_offsets (non-negative integers).")
        st_dtype = info.get("dtype")
        shape = tuple(shape_list)
        begin, end = offsets
        if st_dtype not in _ST_DTYPES:
            raise WeightLoadError(
                f"Tensor {key!r} in {path} has dtype {st_dtype}, which mambalaya cannot read "
                "(expected F64, F32, F16 or BF16)."
            )
        np_dtype = np.dtype(_ST_DTYPES[st_dtype])
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if end - begin != count * np_dtype.itemsize:
            raise WeightLoadError(
                f"Tensor {key!r} in {path} is corrupt: shape {fmt_shape(shape)} of {st_dtype} "
                f"needs {count * np_dtype.itemsize} bytes but the header gives {end - begin}."
            )
        try:
            arr = np.fromfile(path, dtype=np_dtype, count=count, offset=data_start + begin)
        except (OSError, ValueError) as exc:
            raise WeightLoadError(f"Cannot read tensor {key!r} from {path}: {exc}") from None
        if arr.size != count:
            raise WeightLoadError(
                f"{path} is truncated: tensor {key!r} needs {count} elements, found {arr.size}."
            )
        if st_dtype == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        return arr.reshape(shape)


def _load_torch_file(path: Path) -> Mapping[str, Any]:
    try:
        import torch
    except ImportError:
        raise WeightLoadError(
            f"Reading {path} needs torch (it is a pickled PyTorch checkpoint), but torch is not "
            "installed. Install torch, or convert the checkpoint to .safetensors."
        ) from None
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise WeightLoadError(
            f"Cannot read {path} as a PyTorch state_dict (torch.load with weights_only=True "
            f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}). The "
            "file is corrupt, not a checkpoint, or pickles objects other than tensors."
        ) from None
    if isinstance(obj, Mapping):
        for wrapper in ("state_dict", "model"):
            inner = obj.get(wrapper)
            if len(obj) == 1 and isinstance(inner, Mapping):
                obj = inner
    if not isinstance(obj, Mapping):
        raise WeightLoadError(
            f"{path} holds a {type(obj).__name__}, not a state_dict (a mapping of parameter "
            "names to tensors)."
        )
    return obj


def _source_from_file(path: Path) -> TensorSource:
    if path.suffix in _SAFETENSORS_SUFFIXES:
        return _SafetensorsSource.from_file(path)
    if path.suffix in _TORCH_SUFFIXES:
        return _MappingSource(_load_torch_file(path), str(path))
    # Unknown suffix: sniff. safetensors starts with an 8-byte little-endian length and '{'.
    try:
        with open(path, "rb") as fh:
            head = fh.read(9)
    except OSError as exc:
        raise WeightLoadError(f"Cannot open weight file {path}: {exc.strerror}.") from None
    if len(head) == 9 and head[8:9] == b"{":
        return _SafetensorsSource.from_file(path)
    return _MappingSource(_load_torch_file(path), str(path))


def _source_from_index(index_path: Path) -> TensorSource:
    try:
        index = parse_json_text(read_spec_file(index_path, "shard index"), source=str(index_path))
        weight_map = index["weight_map"]
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise TypeError("weight_map is not an object of file names")
    except (OSError, ValueError, KeyError, TypeError, SpecError) as exc:
        raise WeightLoadError(
            f"Cannot read the shard index {index_path}: {exc}. Expected a JSON object with a "
            "'weight_map' of parameter name -> shard file."
        ) from None
    base = index_path.parent
    if index_path.name.endswith(".safetensors.index.json"):
        return _SafetensorsSource({k: base / v for k, v in weight_map.items()}, str(index_path))
    # Sharded pytorch_model-XXXXX-of-YYYYY.bin: load every shard (they are pickles).
    merged: dict[str, Any] = {}
    for shard in sorted(set(weight_map.values())):
        merged.update(_load_torch_file(base / shard))
    return _MappingSource(merged, str(index_path))


def open_source(source: Any) -> TensorSource:
    if isinstance(source, Mapping):
        return _MappingSource(source, "an in-memory state_dict")
    if not isinstance(source, (str, os.PathLike)):
        raise WeightLoadError(
            f"Cannot load weights from a {type(source).__name__}: give a state_dict (a mapping "
            "of names to tensors/arrays), or the path of a .safetensors/.bin file or of a "
            "model directory."
        )
    path = Path(source).expanduser()
    if path.is_dir():
        candidates = (
            "model.safetensors",
            "model.safetensors.index.json",
            "pytorch_model.bin",
            "pytorch_model.bin.index.json",
        )
        for name in candidates:
            if (path / name).is_file():
                if name.endswith(".index.json"):
                    return _source_from_index(path / name)
                return _source_from_file(path / name)
        singles = sorted(path.glob("*.safetensors"))
        if len(singles) == 1:
            return _source_from_file(singles[0])
        raise WeightLoadError(
            f"The directory {path} holds no weights mambalaya can read: looked for "
            f"{', '.join(candidates)} (or a single *.safetensors file)."
        )
    if not path.exists():
        raise WeightLoadError(f"The weight file {path} does not exist.")
    if path.name.endswith(".index.json"):
        return _source_from_index(path)
    return _source_from_file(path)


# --------------------------------------------------------------------------------------------
# Layer resolution
# --------------------------------------------------------------------------------------------


def layer_prefix(src: TensorSource, layer: int) -> str:
    """The key prefix of layer ``layer`` in ``src`` ('' for a bare MambaBlock state_dict)."""
    by_prefix: dict[str, set[int]] = {}
    keyset = set(src.keys)
    for key in src.keys:
        m = _LAYER_KEY.match(key)
        if m:
            by_prefix.setdefault(m.group("prefix"), set()).add(int(m.group("index")))
    if not by_prefix:
        if any(key in keyset for key in ("norm.weight", "mixer.in_proj.weight", "mixer.A_log")):
            return ""  # a bare MambaBlock state_dict: ``layer`` only labels messages
        shown = ", ".join(repr(k) for k in src.keys[:8]) + (
            f" (+{len(src.keys) - 8} more)" if len(src.keys) > 8 else ""
        )
        raise WeightLoadError(
            f"{src.description} does not look like a Mamba checkpoint: no key matches "
            "'backbone.layers.<i>.', 'layers.<i>.' or a bare MambaBlock ('norm.weight', "
            f"'mixer.in_proj.weight', ...); it holds {len(src.keys)} keys: {shown or 'none'}."
        )
    # Prefer the prefix whose layers carry a Mamba mixer (a model could hold other 'layers.').
    mamba_prefixes = [
        p for p in by_prefix
        if any(f"{p}{i}.mixer.in_proj.weight" in keyset for i in by_prefix[p])
    ] or list(by_prefix)
    if len(mamba_prefixes) > 1:
        raise WeightLoadError(
            f"{src.description} holds layers under several prefixes "
            f"({', '.join(repr(p) for p in sorted(mamba_prefixes))}); mambalaya cannot tell which "
            f"one is the Mamba backbone for layer {layer}. Pass a state_dict restricted to one."
        )
    prefix = mamba_prefixes[0]
    if layer not in by_prefix[prefix]:
        raise WeightLoadError(
            f"Layer {layer} is not in {src.description}: no key starts with '{prefix}{layer}.'. "
            f"The layers present are {_fmt_layers(sorted(by_prefix[prefix]))} "
            f"({len(by_prefix[prefix])} layers)."
        )
    return f"{prefix}{layer}."


# --------------------------------------------------------------------------------------------
# One layer of a family: its keys checked, fetched and validated
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerKeys:
    """What one layer of a model family holds, keys relative to the layer prefix.

    ``family`` names it in messages ("Mamba-1"); ``required`` are the keys the layer must hold
    and the only ones it may hold; ``unsupported`` says why a known extra key is not modelled;
    ``missing_hints`` add a reason to a missing key; ``block`` completes "it is not a parameter
    of ..." for an unknown extra key; ``scope`` is the sentence saying what mambalaya models.
    """

    family: str
    required: tuple[str, ...]
    block: str
    scope: str
    unsupported: Mapping[str, str] = field(default_factory=dict)
    missing_hints: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LayerTensors:
    """The required tensors of one layer (as read, float32 or wider), with where they came from
    for error messages: ``prefix`` is the layer's key prefix, ``where`` names layer and file."""

    tensors: dict[str, np.ndarray]
    prefix: str
    where: str

    def __getitem__(self, key: str) -> np.ndarray:
        return self.tensors[key]

    def require_floating(self) -> None:
        for key, arr in self.tensors.items():
            if not np.issubdtype(arr.dtype, np.floating):
                raise WeightLoadError(
                    f"Key '{self.prefix}{key}' in {self.where} has dtype {arr.dtype}; expected floating point."
                )

    def require_ndim(self, key: str, ndim: int) -> None:
        if self.tensors[key].ndim != ndim:
            raise WeightLoadError(
                f"Key '{self.prefix}{key}' in {self.where} has shape {fmt_shape(self.tensors[key].shape)}; "
                f"expected a {ndim}-d tensor."
            )

    def require_shapes(self, expected: Mapping[str, tuple[int, ...]], context: str) -> None:
        """Every ``key -> shape`` of ``expected`` holds; ``context`` (how the shapes were inferred)
        closes the message."""
        for key, shape in expected.items():
            if tuple(self.tensors[key].shape) != shape:
                raise WeightLoadError(
                    f"Key '{self.prefix}{key}' in {self.where} has shape {fmt_shape(self.tensors[key].shape)}, "
                    f"expected {fmt_shape(shape)} ({context})."
                )


def _check_layer_keys(present: list[str], prefix: str, where: str, keys: LayerKeys) -> None:
    """Unmodelled parameters first: they explain a mismatch better than a missing key would."""
    unexpected = [k for k in present if k not in keys.required]
    if unexpected:
        key = unexpected[0]
        why = keys.unsupported.get(key, f"it is not a parameter of {keys.block}")
        more = (f" (also unexpected: {', '.join(repr(prefix + k) for k in unexpected[1:])})"
                if len(unexpected) > 1 else "")
        raise WeightLoadError(f"Unexpected key '{prefix}{key}' in {where}: {why}{more}. {keys.scope}")
    present_set = set(present)
    missing = [k for k in keys.required if k not in present_set]
    if missing:
        key = missing[0]
        raise WeightLoadError(
            f"Missing key '{prefix}{key}' in {where}{keys.missing_hints.get(key, '')}; missing in all: "
            f"{', '.join(repr(prefix + k) for k in missing)}. A {keys.family} layer needs "
            f"{', '.join(keys.required)}."
        )


def read_layer(source: Any, layer: Any, keys: LayerKeys) -> LayerTensors:
    """Open ``source`` (see :func:`open_source`), find layer ``layer``, check it holds exactly
    ``keys.required`` and fetch those tensors. A bare block state_dict (no ``layers.<i>.``
    prefix) is taken as the layer; ``layer`` then only labels messages."""
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or layer < 0:
        raise WeightLoadError(f"The layer index must be a non-negative integer, got {layer!r}.")
    layer = int(layer)
    src = open_source(source)
    prefix = layer_prefix(src, layer)
    where = f"layer {layer} of {src.description}" + (f" (key prefix '{prefix}')" if prefix else "")
    present = sorted(k[len(prefix):] for k in src.keys if k.startswith(prefix)) if prefix else sorted(src.keys)
    _check_layer_keys(present, prefix, where, keys)
    return LayerTensors({k: src.get(prefix + k) for k in keys.required}, prefix, where)


# --------------------------------------------------------------------------------------------
# Layouts
# --------------------------------------------------------------------------------------------


def as_layout(arr: np.ndarray, dtype: np.dtype, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """``arr`` (reshaped to ``shape`` if given) as a C-contiguous array of ``dtype``."""
    return np.ascontiguousarray(arr if shape is None else np.reshape(arr, shape), dtype=dtype)


def a_from_log(a_log: np.ndarray) -> np.ndarray:
    """The SSM's ``A = -exp(A_log)``, computed in float64 (cast to the layout dtype later)."""
    return -np.exp(a_log.astype(np.float64))
