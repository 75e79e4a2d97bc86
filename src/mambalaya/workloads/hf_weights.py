"""Load the real weights (and states) of one Mamba-1 layer into mambalaya's tensor layouts.

A Mamba-1 layer is the transformers ``MambaBlock``: ``RMSNorm -> MambaMixer -> residual add``.
mambalaya expresses it as a cascade of Einsums over these tensors (B=batch, I=positions,
D=d_model, E=intermediate_size=expand*D, N=state_size, R=time_step_rank, K=conv_kernel, J=K-1):

=======  ========  =====================================================================
name     layout    taken from (transformers / state-spaces ``MambaBlock`` state_dict)
=======  ========  =====================================================================
WN       [D]       ``norm.weight``
WX       [D,E]     ``mixer.in_proj.weight`` [2E,D], rows ``[0,E)`` (x branch), transposed
WZ       [D,E]     ``mixer.in_proj.weight`` [2E,D], rows ``[E,2E)`` (gate z), transposed
WC       [E,K]     ``mixer.conv1d.weight`` [E,1,K], squeezed
BC       [E]       ``mixer.conv1d.bias``
WDL      [E,R]     ``mixer.x_proj.weight`` [R+2N,E], rows ``[0,R)``, transposed
WB       [E,N]     ``mixer.x_proj.weight`` rows ``[R,R+N)``, transposed
WCM      [E,N]     ``mixer.x_proj.weight`` rows ``[R+N,R+2N)``, transposed
WDT      [R,E]     ``mixer.dt_proj.weight`` [E,R], transposed
BDT      [E]       ``mixer.dt_proj.bias``
A        [E,N]     ``-exp(mixer.A_log)``, computed in float64 then cast
DS       [E]       ``mixer.D``
WO       [E,D]     ``mixer.out_proj.weight`` [D,E], transposed
=======  ========  =====================================================================

States (see :func:`mamba1_states_from_hf`):

* ``H0[B,E,N]`` is the SSM state, identical to transformers' recurrent state ``[B,E,N]``.
* ``CS0[B,J,E]`` holds the last ``J=K-1`` inputs of the depthwise conv (the x branch of
  ``in_proj``, before the conv) in time order, oldest first. transformers (5.x,
  ``LinearAttentionLayer``) keeps a conv state ``[B,E,K]`` holding the last ``K`` conv inputs,
  oldest first (zero-padded on the left after a prefill shorter than ``K``). On a decode step
  ``causal_conv1d_update`` concatenates it with the new input (``K+1`` columns), convolves with
  ``padding=0`` and keeps the last output, so column 0 (the oldest input) never reaches an
  output: ``CS0 = conv_state[:, :, 1:].transpose(0, 2, 1)``.

Only the Mamba-1 block without ``in_proj``/``out_proj`` biases (``use_bias=False``) and with a
conv bias (``use_conv_bias=True``) is modelled; anything else raises :class:`WeightLoadError`.

torch is imported only to read ``.bin``/``.pt`` files or to convert torch tensors handed in.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from mambalaya.errors import MambalayaError

__all__ = [
    "WEIGHT_NAMES",
    "WeightLoadError",
    "load_mamba1_config",
    "load_mamba1_layer",
    "mamba1_states_from_hf",
    "mamba1_states_to_hf",
]


class WeightLoadError(MambalayaError):
    """Real weights, a config or states could not be read into mambalaya's layouts."""


#: The 13 weight tensors :func:`load_mamba1_layer` returns, in a fixed order.
WEIGHT_NAMES: tuple[str, ...] = (
    "WN", "WX", "WZ", "WC", "BC", "WDL", "WB", "WCM", "WDT", "BDT", "A", "DS", "WO",
)

# The keys of one MambaBlock, relative to the layer prefix.
_REQUIRED_KEYS: tuple[str, ...] = (
    "norm.weight",
    "mixer.in_proj.weight",
    "mixer.conv1d.weight",
    "mixer.conv1d.bias",
    "mixer.x_proj.weight",
    "mixer.dt_proj.weight",
    "mixer.dt_proj.bias",
    "mixer.A_log",
    "mixer.D",
    "mixer.out_proj.weight",
)

_UNSUPPORTED_HINTS: dict[str, str] = {
    "mixer.in_proj.bias": "in_proj has a bias (config use_bias=True), which the mambalaya "
    "Mamba-1 cascade does not model",
    "mixer.out_proj.bias": "out_proj has a bias (config use_bias=True), which the mambalaya "
    "Mamba-1 cascade does not model",
    "mixer.x_proj.bias": "x_proj has a bias, which Mamba-1 never has",
    "norm.bias": "the norm has a bias (LayerNorm instead of RMSNorm), which the mambalaya "
    "Mamba-1 cascade does not model",
    "mixer.norm.weight": "the mixer has a gated norm, which means a Mamba-2 layer, not Mamba-1",
    "mixer.dt_bias": "the mixer has dt_bias, which means a Mamba-2 layer, not Mamba-1",
}

_LAYER_KEY = re.compile(r"^(?P<prefix>(?:.*\.)?layers\.)(?P<index>\d+)\.(?P<rest>.+)$")

_SAFETENSORS_SUFFIXES = (".safetensors",)
_TORCH_SUFFIXES = (".bin", ".pt", ".pth")


# --------------------------------------------------------------------------------------------
# dtype handling
# --------------------------------------------------------------------------------------------


def _resolve_dtype(dtype: Any) -> np.dtype:
    try:
        resolved = np.dtype(dtype)
    except TypeError:
        resolved = None
    if resolved is None or resolved not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise WeightLoadError(
            f"Unsupported dtype {dtype!r}: mambalaya loads Mamba-1 weights and states as "
            "'float32' or 'float64' only."
        )
    return resolved


def _is_torch_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def _to_numpy(value: Any, what: str) -> np.ndarray:
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


def _fmt_shape(shape: tuple[int, ...]) -> str:
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


class _Source:
    """Lists keys and fetches single tensors (as numpy, float32 or wider) from a container."""

    def __init__(self, description: str, keys: list[str]) -> None:
        self.description = description
        self.keys = keys

    def get(self, key: str) -> np.ndarray:  # pragma: no cover - overridden
        raise NotImplementedError


class _MappingSource(_Source):
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
        return _to_numpy(self._mapping[key], f"Entry {key!r} of {self.description}")


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
            header = json.loads(fh.read(header_len).decode("utf-8"))
            if not isinstance(header, dict):
                raise ValueError("header is not a JSON object")
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise WeightLoadError(
            f"Cannot read {path} as a safetensors file: {exc}. The file is corrupt, truncated, "
            "or not in the safetensors format."
        ) from None
    header.pop("__metadata__", None)
    return header, 8 + header_len


class _SafetensorsSource(_Source):
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
        st_dtype = info.get("dtype")
        shape = tuple(int(s) for s in info.get("shape", ()))
        begin, end = (int(x) for x in info.get("data_offsets", (0, 0)))
        if st_dtype not in _ST_DTYPES:
            raise WeightLoadError(
                f"Tensor {key!r} in {path} has dtype {st_dtype}, which mambalaya cannot read "
                "(expected F64, F32, F16 or BF16)."
            )
        np_dtype = np.dtype(_ST_DTYPES[st_dtype])
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if end - begin != count * np_dtype.itemsize:
            raise WeightLoadError(
                f"Tensor {key!r} in {path} is corrupt: shape {_fmt_shape(shape)} of {st_dtype} "
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


def _source_from_file(path: Path) -> _Source:
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


def _source_from_index(index_path: Path) -> _Source:
    try:
        index = json.loads(index_path.read_text())
        weight_map = index["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
    except (OSError, ValueError, KeyError, TypeError) as exc:
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


def _open_source(source: Any) -> _Source:
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


def _layer_prefix(src: _Source, layer: int) -> str:
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
# Public API
# --------------------------------------------------------------------------------------------


def load_mamba1_layer(source: Any, layer: int = 0, dtype: Any = "float32") -> dict[str, np.ndarray]:
    """Load layer ``layer`` of a Mamba-1 checkpoint into mambalaya's 13 weight arrays.

    ``source`` is a state_dict in memory (name -> torch tensor or numpy array), or a path to a
    ``.safetensors`` file, a ``.bin``/``.pt`` file, a shard index ``*.index.json``, or a model
    directory (``model.safetensors``, sharded ``model-0000X-of-0000Y.safetensors`` with
    ``model.safetensors.index.json``, or ``pytorch_model.bin``). Keys may be prefixed
    ``backbone.layers.{i}.`` (MambaForCausalLM / state-spaces), ``layers.{i}.`` (MambaModel) or
    be those of a bare ``MambaBlock`` (then ``layer`` only labels error messages).

    Returns ``{name: array}`` for :data:`WEIGHT_NAMES` (layouts in the module docstring), each
    C-contiguous of ``dtype`` (float32 or float64). ``A = -exp(A_log)`` is computed in float64
    before the cast. Raises :class:`WeightLoadError` when the checkpoint does not hold exactly
    a Mamba-1 layer without in/out-projection biases and with a conv bias, or shapes disagree.
    """
    out_dtype = _resolve_dtype(dtype)
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or layer < 0:
        raise WeightLoadError(f"The layer index must be a non-negative integer, got {layer!r}.")
    layer = int(layer)
    src = _open_source(source)
    prefix = _layer_prefix(src, layer)
    where = f"layer {layer} of {src.description}" + (f" (key prefix '{prefix}')" if prefix else "")

    keyset = set(src.keys)
    present_rel = sorted(k[len(prefix):] for k in src.keys if k.startswith(prefix))
    if not prefix:
        present_rel = sorted(src.keys)
    # Unmodelled parameters first: they explain a mismatch better than a missing key would.
    unexpected = [k for k in present_rel if k not in _REQUIRED_KEYS]
    if unexpected:
        key = unexpected[0]
        why = _UNSUPPORTED_HINTS.get(
            key, "it is not a parameter of the Mamba-1 block (RMSNorm -> MambaMixer) mambalaya models"
        )
        more = f" (also unexpected: {', '.join(repr(prefix + k) for k in unexpected[1:])})" if len(unexpected) > 1 else ""
        raise WeightLoadError(
            f"Unexpected key '{prefix}{key}' in {where}: {why}{more}. mambalaya models only a "
            "Mamba-1 layer with use_bias=False and use_conv_bias=True."
        )
    missing = [k for k in _REQUIRED_KEYS if prefix + k not in keyset]
    if missing:
        key = missing[0]
        hint = ""
        if key == "mixer.conv1d.bias":
            hint = " (the checkpoint has use_conv_bias=False, which mambalaya does not model)"
        raise WeightLoadError(
            f"Missing key '{prefix}{key}' in {where}{hint}; missing in all: "
            f"{', '.join(repr(prefix + k) for k in missing)}. A Mamba-1 layer needs "
            f"{', '.join(_REQUIRED_KEYS)}."
        )

    raw = {k: src.get(prefix + k) for k in _REQUIRED_KEYS}

    # Dimensions: D from the norm, E and N from A_log, K from the conv, R from dt_proj.
    def need_rank(key: str, rank: int) -> None:
        if raw[key].ndim != rank:
            raise WeightLoadError(
                f"Key '{prefix}{key}' in {where} has shape {_fmt_shape(raw[key].shape)}; expected "
                f"a {rank}-d tensor."
            )

    need_rank("norm.weight", 1)
    need_rank("mixer.A_log", 2)
    need_rank("mixer.conv1d.weight", 3)
    need_rank("mixer.dt_proj.weight", 2)
    D = raw["norm.weight"].shape[0]
    E, N = raw["mixer.A_log"].shape
    K = raw["mixer.conv1d.weight"].shape[-1]
    R = raw["mixer.dt_proj.weight"].shape[1]
    dims = f"D={D}, E={E}, N={N}, R={R}, K={K}"
    expected = {
        "mixer.in_proj.weight": (2 * E, D),
        "mixer.conv1d.weight": (E, 1, K),
        "mixer.conv1d.bias": (E,),
        "mixer.x_proj.weight": (R + 2 * N, E),
        "mixer.dt_proj.weight": (E, R),
        "mixer.dt_proj.bias": (E,),
        "mixer.D": (E,),
        "mixer.out_proj.weight": (D, E),
    }
    for key, shape in expected.items():
        if tuple(raw[key].shape) != shape:
            raise WeightLoadError(
                f"Key '{prefix}{key}' in {where} has shape {_fmt_shape(raw[key].shape)}, expected "
                f"{_fmt_shape(shape)} (dimensions inferred from norm.weight, A_log, conv1d.weight "
                f"and dt_proj.weight: {dims})."
            )
    for key, arr in raw.items():
        if not np.issubdtype(arr.dtype, np.floating):
            raise WeightLoadError(
                f"Key '{prefix}{key}' in {where} has dtype {arr.dtype}; expected floating point."
            )

    def lay(arr: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(arr, dtype=out_dtype)

    w_in = raw["mixer.in_proj.weight"]
    w_x = raw["mixer.x_proj.weight"]
    a_log = raw["mixer.A_log"].astype(np.float64)
    return {
        "WN": lay(raw["norm.weight"]),
        "WX": lay(w_in[:E].T),
        "WZ": lay(w_in[E:].T),
        "WC": lay(raw["mixer.conv1d.weight"][:, 0, :]),
        "BC": lay(raw["mixer.conv1d.bias"]),
        "WDL": lay(w_x[:R].T),
        "WB": lay(w_x[R:R + N].T),
        "WCM": lay(w_x[R + N:].T),
        "WDT": lay(raw["mixer.dt_proj.weight"].T),
        "BDT": lay(raw["mixer.dt_proj.bias"]),
        "A": lay(-np.exp(a_log)),
        "DS": lay(raw["mixer.D"]),
        "WO": lay(raw["mixer.out_proj.weight"].T),
    }



def read_config_json(path_or_dict: Any, label: str) -> tuple[dict[str, Any], str]:
    """A model config as a dict, from a dict or a local ``config.json`` (or its directory), and
    where it came from (for error messages); ``label`` names the model family in errors."""
    if isinstance(path_or_dict, Mapping):
        return dict(path_or_dict), "the config dict"
    if not isinstance(path_or_dict, (str, os.PathLike)):
        raise WeightLoadError(
            f"Cannot read a {label} config from a {type(path_or_dict).__name__}: give a dict or the "
            "path of a config.json (or of its directory)."
        )
    path = Path(path_or_dict).expanduser()
    if path.is_dir():
        path = path / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except OSError as exc:
        raise WeightLoadError(f"Cannot read the {label} config {path}: {exc.strerror}.") from None
    except ValueError as exc:
        raise WeightLoadError(f"The {label} config {path} is not valid JSON: {exc}.") from None
    if not isinstance(cfg, dict):
        raise WeightLoadError(f"The {label} config {path} is not a JSON object.")
    return cfg, str(path)

def load_mamba1_config(path_or_dict: Any) -> dict[str, Any]:
    """Read a Mamba-1 ``config.json`` (path, model directory, or dict) into mambalaya's names.

    Returns ``{"d_model", "d_state", "expand", "d_conv", "dt_rank", "n_layers", "vocab_size",
    "norm_eps"}``. Accepts transformers keys (hidden_size, state_size, expand, conv_kernel,
    time_step_rank, num_hidden_layers, vocab_size, layer_norm_epsilon) and state-spaces/mamba
    keys (d_model, n_layer, vocab_size, pad_vocab_size_multiple, ssm_cfg={d_state, d_conv,
    expand, dt_rank}). ``dt_rank="auto"`` becomes ``ceil(d_model/16)``. For state-spaces configs
    ``vocab_size`` is padded up to ``pad_vocab_size_multiple`` (the embedding's row count), as
    mamba_ssm and the transformers conversion do.
    """
    cfg, where = read_config_json(path_or_dict, "Mamba")

    model_type = cfg.get("model_type")
    ssm_cfg = cfg.get("ssm_cfg") or {}
    if not isinstance(ssm_cfg, Mapping):
        raise WeightLoadError(f"In {where}, 'ssm_cfg' is not an object: {ssm_cfg!r}.")
    if (model_type not in (None, "mamba")) or ssm_cfg.get("layer", "Mamba1") != "Mamba1":
        kind = model_type if model_type not in (None, "mamba") else ssm_cfg.get("layer")
        raise WeightLoadError(
            f"{where} describes a {kind!r} model; mambalaya loads Mamba-1 ('mamba') layers only."
        )
    if cfg.get("use_bias", False):
        raise WeightLoadError(
            f"{where} has use_bias=true (in_proj/out_proj biases), which the mambalaya Mamba-1 "
            "cascade does not model."
        )
    if not cfg.get("use_conv_bias", ssm_cfg.get("conv_bias", True)):
        raise WeightLoadError(
            f"{where} has use_conv_bias=false; the mambalaya Mamba-1 cascade models a conv bias."
        )

    def pick(*candidates: tuple[Mapping[str, Any], str], default: Any = None, name: str) -> Any:
        for mapping, key in candidates:
            if key in mapping and mapping[key] is not None:
                return mapping[key]
        if default is not None:
            return default
        raise WeightLoadError(
            f"{where} has no {name}: looked for "
            f"{', '.join(repr(k) for _, k in candidates)}."
        )

    def as_int(value: Any, name: str) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value or value <= 0:
            raise WeightLoadError(f"In {where}, {name} must be a positive integer, got {value!r}.")
        return int(value)

    d_model = as_int(pick((cfg, "hidden_size"), (cfg, "d_model"), name="d_model"), "d_model")
    d_state = as_int(pick((cfg, "state_size"), (ssm_cfg, "d_state"), (cfg, "d_state"), default=16,
                          name="d_state"), "d_state")
    expand_raw = pick((cfg, "expand"), (ssm_cfg, "expand"), default=2, name="expand")
    d_conv = as_int(pick((cfg, "conv_kernel"), (ssm_cfg, "d_conv"), (cfg, "d_conv"), default=4,
                         name="d_conv"), "d_conv")
    n_layers = as_int(pick((cfg, "num_hidden_layers"), (cfg, "n_layer"), (cfg, "n_layers"),
                           name="n_layers"), "n_layers")
    vocab_size = as_int(pick((cfg, "vocab_size"), name="vocab_size"), "vocab_size")
    norm_eps = float(pick((cfg, "layer_norm_epsilon"), (cfg, "norm_epsilon"), (cfg, "rms_norm_eps"),
                          default=1e-5, name="norm_eps"))
    dt_rank_raw = pick((cfg, "time_step_rank"), (ssm_cfg, "dt_rank"), (cfg, "dt_rank"),
                       default="auto", name="dt_rank")
    dt_rank = math.ceil(d_model / 16) if dt_rank_raw == "auto" else as_int(dt_rank_raw, "dt_rank")

    if isinstance(expand_raw, bool) or not isinstance(expand_raw, (int, float)) or expand_raw <= 0:
        raise WeightLoadError(f"In {where}, expand must be a positive number, got {expand_raw!r}.")
    expand = int(expand_raw) if float(expand_raw).is_integer() else float(expand_raw)
    if "intermediate_size" in cfg and cfg["intermediate_size"] != int(expand * d_model):
        raise WeightLoadError(
            f"{where} is inconsistent: intermediate_size={cfg['intermediate_size']} but "
            f"expand*hidden_size={expand}*{d_model}={int(expand * d_model)}."
        )
    if "hidden_size" not in cfg and "pad_vocab_size_multiple" in cfg:
        mult = as_int(cfg["pad_vocab_size_multiple"], "pad_vocab_size_multiple")
        vocab_size = -(-vocab_size // mult) * mult
    return {
        "d_model": d_model,
        "d_state": d_state,
        "expand": expand,
        "d_conv": d_conv,
        "dt_rank": dt_rank,
        "n_layers": n_layers,
        "vocab_size": vocab_size,
        "norm_eps": norm_eps,
    }


def mamba1_states_from_hf(conv_state: Any, ssm_state: Any, dtype: Any = "float32") -> dict[str, np.ndarray]:
    """transformers' per-layer Mamba cache states -> ``{"CS0": [B,J,E], "H0": [B,E,N]}``.

    ``conv_state`` is ``cache.get_conv_state(layer)`` (``[B,E,K]``: the last K conv inputs,
    oldest first; column 0 never reaches an output, so it is dropped) and ``ssm_state`` is
    ``cache.get_recurrent_state(layer)`` (``[B,E,N]``, taken as is). Torch tensors or arrays.
    """
    out_dtype = _resolve_dtype(dtype)
    conv = _to_numpy(conv_state, "conv_state")
    ssm = _to_numpy(ssm_state, "ssm_state")
    if conv.ndim != 3 or conv.shape[-1] < 2:
        raise WeightLoadError(
            f"conv_state has shape {_fmt_shape(conv.shape)}; expected transformers' [B, E, K] "
            "with K >= 2."
        )
    if ssm.ndim != 3 or ssm.shape[:2] != conv.shape[:2]:
        raise WeightLoadError(
            f"ssm_state has shape {_fmt_shape(ssm.shape)}; expected [B, E, N] with B, E = "
            f"{conv.shape[0]}, {conv.shape[1]} as in conv_state {_fmt_shape(conv.shape)}."
        )
    return {
        "CS0": np.ascontiguousarray(conv[:, :, 1:].transpose(0, 2, 1), dtype=out_dtype),
        "H0": np.ascontiguousarray(ssm, dtype=out_dtype),
    }


def mamba1_states_to_hf(CS: Any, H: Any) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`mamba1_states_from_hf`: ``(conv_state [B,E,K], ssm_state [B,E,N])``.

    The oldest conv column (index 0), which transformers keeps but never uses, is zero. The
    arrays keep the input dtype.
    """
    cs = _to_numpy(CS, "CS")
    h = _to_numpy(H, "H")
    if cs.ndim != 3 or h.ndim != 3 or cs.shape[0] != h.shape[0] or cs.shape[2] != h.shape[1]:
        raise WeightLoadError(
            f"States do not fit: CS has shape {_fmt_shape(cs.shape)} (expected [B, J, E]) and H "
            f"has shape {_fmt_shape(h.shape)} (expected [B, E, N])."
        )
    B, J, E = cs.shape
    conv = np.zeros((B, E, J + 1), dtype=cs.dtype)
    conv[:, :, 1:] = cs.transpose(0, 2, 1)
    return conv, np.ascontiguousarray(h)
