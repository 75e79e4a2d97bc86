"""The sweep result store: one SQLite file, one row per point.

Why SQLite: it ships with Python (no server, no extra dependency), every commit is atomic and
durable (a row is either there whole or not at all, even if the process is killed mid-write),
``PRIMARY KEY`` on the point id makes "every point exactly once" a database guarantee, and
pandas reads it directly. Parquet files cannot be appended to atomically row by row, and DuckDB
would add a dependency for what SQLite already does; ``mambalaya sweep export --format parquet``
gives Parquet to those who want it.

Each row holds the point's id (a hash of its inputs), every input (as JSON and, for the common
axes, as columns), every output figure (as JSON and, for the common ones, as columns: an output
computed is never dropped), its status (``ok`` or ``failed`` with the error), and
timing. The ``meta`` table records the fingerprint of the model code that wrote the store; a
store written by a different model is refused rather than mixed.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import sqlite3
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:  # pandas takes a third of a second to import; a sweep needs it only to export
    import pandas as pd

from mambalaya import __version__
from mambalaya.errors import MambalayaError

INPUT_COLUMNS = ("arch", "model", "phase", "seq_len", "batch", "mapping")
OUTPUT_COLUMNS = (
    "latency_s",
    "model_latency_s",
    "offchip_bytes",
    "compute_util",
    "mem_util",
    "tokens_per_s",
    "groups",
    "peak_footprint_bytes",
    "buffer_bytes",
    "pes",
    "bandwidth_bytes_per_s",
    "attention_share",  # a hybrid model's share of time in attention layers (empty for pure Mamba models)
    # on a design with an energy section (empty otherwise)
    "layer_energy_j",
    "energy_per_token_j",
    "average_power_w",
    "power_budget_w",
    "over_power_budget",  # 1 or 0
    "throttled_latency_s",
)
#: Output columns that hold text: the mapping each point ran (a hybrid model's, per layer type).
TEXT_OUTPUT_COLUMNS = ("mapping_used",)

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS points (
    id TEXT PRIMARY KEY,
    status TEXT NOT NULL CHECK (status IN ('ok', 'failed')),
    error TEXT,
    inputs TEXT NOT NULL,
    {", ".join(f"{c} {'INTEGER' if c in ('seq_len', 'batch') else 'TEXT'}" for c in INPUT_COLUMNS)},
    {", ".join(f"{c} REAL" for c in OUTPUT_COLUMNS)},
    {", ".join(f"{c} TEXT" for c in TEXT_OUTPUT_COLUMNS)},
    outputs TEXT,
    seconds REAL,
    worker TEXT,
    finished_at TEXT NOT NULL
);
"""

#: Packages (and data) whose code decides the numbers a point gets: the precision policies
#: set every tensor's width.
_MODEL_PACKAGES = ("einsum", "workloads", "fusion", "model", "arch", "data/precision")
#: Files of the experiments package that decide them too: a point's evaluation, and the
#: mapping each layer type of a hybrid model runs.
_MODEL_FILES = ("experiments/evaluate.py", "experiments/hybrid.py", "experiments/sweep.py")


def model_fingerprint() -> str:
    """A hash of the model's source code and shipped specs: any change to how numbers are
    computed changes it (a pure refactor does too, and then a new store is needed)."""
    h = hashlib.sha256()
    root = resources.files("mambalaya")
    for pkg in _MODEL_PACKAGES:
        base = root.joinpath(*pkg.split("/"))
        files = sorted((p for p in _walk(base) if p.name.endswith((".py", ".yaml"))), key=lambda p: str(p))
        for f in files:
            h.update(str(f).split("mambalaya", 1)[-1].encode())
            h.update(f.read_bytes())
    for name in _MODEL_FILES:
        h.update(name.encode())
        h.update((root / name).read_bytes())
    return f"{__version__}+{h.hexdigest()[:16]}"


def _walk(node):
    for child in node.iterdir():
        if child.is_dir():
            yield from _walk(child)
        else:
            yield child


def point_id(point: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(point, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:24]


@dataclass(frozen=True)
class PointResult:
    id: str
    point: dict[str, Any]
    outputs: dict[str, Any] | None
    error: str | None
    seconds: float
    worker: str


class ResultStore:
    def __init__(self, path: str | Path, *, fingerprint: str | None = None, create: bool = True):
        self.path = Path(path)
        if not create and not self.path.exists():
            raise MambalayaError(f"{self.path}: no such sweep store")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.db = sqlite3.connect(self.path, timeout=30)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as err:
            raise MambalayaError(f"{self.path} is not a mambalaya sweep store ({err})") from None
        if fingerprint is not None:
            self._check_fingerprint(fingerprint)

    def _check_fingerprint(self, fingerprint: str) -> None:
        row = self.db.execute("SELECT value FROM meta WHERE key = 'model_fingerprint'").fetchone()
        if row is None:
            with self.db:
                self.db.execute("INSERT INTO meta VALUES ('model_fingerprint', ?)", (fingerprint,))
                self.db.execute("INSERT OR REPLACE INTO meta VALUES ('created', ?)", (_now(),))
        elif row[0] != fingerprint:
            raise MambalayaError(
                f"{self.path} was written by model {row[0]}, but this mambalaya is {fingerprint}: its numbers "
                "would not be comparable, so they are not mixed. Use a new --store (or delete this one)."
            )

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> "ResultStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def done_ids(self) -> set[str]:
        return {r[0] for r in self.db.execute("SELECT id FROM points")}

    def write(self, results: Iterable[PointResult]) -> int:
        """Insert finished points in one transaction; ids already stored are left alone."""
        rows = []
        for r in results:
            out = r.outputs or {}
            rows.append(
                (r.id, "ok" if r.error is None else "failed", r.error, json.dumps(r.point, sort_keys=True),
                 *(r.point.get(c) for c in INPUT_COLUMNS), *(_real(out.get(c)) for c in OUTPUT_COLUMNS),
                 *(out.get(c) for c in TEXT_OUTPUT_COLUMNS), json.dumps(out, sort_keys=True, default=_plain) if out else None,
                 r.seconds, r.worker, _now())
            )
        cols = ("id", "status", "error", "inputs", *INPUT_COLUMNS, *OUTPUT_COLUMNS, *TEXT_OUTPUT_COLUMNS, "outputs",
                "seconds", "worker", "finished_at")
        with self.db:
            cur = self.db.executemany(
                f"INSERT OR IGNORE INTO points ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})", rows
            )
        return cur.rowcount

    def meta(self) -> dict[str, str]:
        return dict(self.db.execute("SELECT key, value FROM meta"))

    def input_columns(self) -> list[str]:
        """The dataframe's columns that are the points' inputs: the common axes and every field
        any point's inputs name (the rest are outputs and bookkeeping)."""
        named = {key for (text,) in self.db.execute("SELECT inputs FROM points") for key in json.loads(text)}
        return [*INPUT_COLUMNS, *sorted(named - set(INPUT_COLUMNS))]

    def dataframe(self) -> "pd.DataFrame":
        """Every row, with every input field and every output (those without a column of their
        own too, such as a hybrid model's share of time in each layer type) in its own column."""
        import pandas as pd

        df = pd.read_sql_query("SELECT * FROM points ORDER BY finished_at, id", self.db)
        if df.empty:
            return df
        parts = [df.drop(columns=[c for c in ("inputs", "outputs") if c in df.columns])]
        for column in ("inputs", "outputs"):
            if column in df.columns:
                flat = pd.json_normalize(df[column].map(lambda text: json.loads(text) if isinstance(text, str) else {}), sep=".")
                parts.append(flat[[c for c in flat.columns if all(c not in p.columns for p in parts)]])
        return pd.concat(parts, axis=1)


def _plain(value: Any) -> Any:
    """A numpy scalar among a point's outputs, as the Python number JSON writes."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"a sweep output of type {type(value).__name__} cannot be stored")


def _real(value: Any) -> Any:
    """A figure as SQLite stores it in a REAL column (a flag as 1 or 0)."""
    return int(value) if isinstance(value, bool) else value


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")
