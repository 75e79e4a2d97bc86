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

A store is recognised by the marker the tool writes in the SQLite header of every store it
creates (``PRAGMA application_id`` = :data:`STORE_APPLICATION_ID`, ``PRAGMA user_version`` =
:data:`STORE_FORMAT`), read before the file is opened for writing. Anything else is refused
untouched (no table added, no byte changed): a file that is not SQLite, another application's
database, a store of a newer format. A store written before the marker existed (its tables
exactly ``meta`` and ``points``, its columns the store's own, a model fingerprint in ``meta``)
is recognised as the tool's and gets the marker the first time a sweep writes to it. Every
store is checked on opening (``PRAGMA quick_check``): a damaged one is refused with one
paragraph naming it, not a traceback in the middle of a sweep.

Every row's output columns are filled, or empty for a stated reason (:func:`check_point_outputs`):
a column a point should have filled and did not (a hybrid MoE point's ``attention_share``,
once) is refused, not stored empty.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import math
import numbers
import os
import sqlite3
import stat
import urllib.parse
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

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
#: The output columns a design with an energy section fills, all of them (and one without, none).
ENERGY_OUTPUT_COLUMNS = ("layer_energy_j", "energy_per_token_j", "average_power_w", "power_budget_w",
                         "over_power_budget", "throttled_latency_s")
#: The output columns every point fills: the rest are a hybrid model's (``attention_share``) or
#: an energy section's (:data:`ENERGY_OUTPUT_COLUMNS`).
REQUIRED_OUTPUT_COLUMNS = tuple(c for c in OUTPUT_COLUMNS if c != "attention_share" and c not in ENERGY_OUTPUT_COLUMNS)

#: The SQLite ``application_id`` of a mambalaya sweep store ("MMBL"), in every store's header.
STORE_APPLICATION_ID = 0x4D4D424C
#: The store's format (its ``user_version``): 1, the schema below. A store of a larger number
#: was written by a newer mambalaya and is refused.
STORE_FORMAT = 1
#: The first 16 bytes of every SQLite database file.
_SQLITE_MAGIC = b"SQLite format 3\x00"
#: The columns of the ``points`` table every store has (a store of an earlier mambalaya may
#: lack some output columns, never these).
_BOOKKEEPING_COLUMNS = ("id", "status", "error", "inputs", *INPUT_COLUMNS, "outputs", "seconds", "worker", "finished_at")

#: The columns of the ``points`` table, in order.
POINTS_COLUMNS = ("id", "status", "error", "inputs", *INPUT_COLUMNS, *OUTPUT_COLUMNS, *TEXT_OUTPUT_COLUMNS, "outputs",
                  "seconds", "worker", "finished_at")

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
_MODEL_PACKAGES = ("einsum", "workloads", "fusion", "cost", "search", "arch", "data/precision")
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
    """A sweep's result store, opened (or created) at ``path``; see the module doc for what is
    refused. ``fingerprint``: the model's (:func:`model_fingerprint`), checked against the one
    the store was written by. ``create=False`` opens an existing store to read it (``sweep
    export``, ``sweep plot``) and writes nothing to it."""

    def __init__(self, path: str | Path, *, fingerprint: str | None = None, create: bool = True):
        self.path = Path(path)
        kind = store_kind(self.path, must_exist=not create)
        if kind == "new":
            _create_store(self.path)
        with self._database_errors("opened"):
            self.db = sqlite3.connect(self.path, timeout=30)
        try:
            self._check_integrity()
            if create:
                with self._database_errors("written"):
                    self._prepare(kind, fingerprint)
            elif fingerprint is not None:
                self._check_fingerprint(fingerprint)
        except BaseException:
            self.db.close()
            raise

    @contextlib.contextmanager
    def _database_errors(self, doing: str) -> Iterator[None]:
        """SQLite's errors while the store is ``doing`` (opened, read, written), as one
        :class:`MambalayaError` naming the store."""
        try:
            yield
        except sqlite3.DatabaseError as err:
            raise MambalayaError(f"{self.path}: the sweep store cannot be {doing}: {err} (SQLite); if it is damaged, "
                                 "restore a copy or give --store a new file") from None

    def _check_integrity(self) -> None:
        """SQLite's quick check of every page (``PRAGMA quick_check``): a damaged store is refused."""
        try:
            problems = [row[0] for row in self.db.execute("PRAGMA quick_check")]
        except sqlite3.DatabaseError as err:
            problems = [str(err)]
        if problems != ["ok"]:
            raise MambalayaError(
                f"{self.path} is a damaged sweep store (SQLite's quick_check: {_first_line(problems)}); its rows "
                "cannot be trusted, so nothing is read from or added to it: restore a copy, or give --store a new file "
                "(its points are computed again)")

    def _prepare(self, kind: str, fingerprint: str | None) -> None:
        """Ready an existing store of the tool's for a sweep: the fingerprint checked (nothing
        written to a store that is refused), then the marker added to a store written before
        it, the tables created if missing, and the fingerprint recorded in a new store."""
        if fingerprint is not None:
            self._check_fingerprint(fingerprint)
        if kind == "unmarked":
            self.db.execute(f"PRAGMA application_id = {STORE_APPLICATION_ID}")
            self.db.execute(f"PRAGMA user_version = {STORE_FORMAT}")
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(_SCHEMA)
        if fingerprint is not None and self._fingerprint() is None:
            with self.db:
                self.db.execute("INSERT INTO meta VALUES ('model_fingerprint', ?)", (fingerprint,))
                self.db.execute("INSERT OR REPLACE INTO meta VALUES ('created', ?)", (_now(),))

    def _fingerprint(self) -> str | None:
        """The fingerprint of the model that wrote the store (None: a new store)."""
        tables = {name for (name,) in self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "meta" not in tables:
            return None
        row = self.db.execute("SELECT value FROM meta WHERE key = 'model_fingerprint'").fetchone()
        return None if row is None else row[0]

    def _check_fingerprint(self, fingerprint: str) -> None:
        with self._database_errors("read"):
            written_by = self._fingerprint()
        if written_by is not None and written_by != fingerprint:
            raise MambalayaError(
                f"{self.path} was written by model {written_by}, but this mambalaya is {fingerprint}: its numbers "
                "would not be comparable, so they are not mixed. Use a new --store (or delete this one)."
            )

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> "ResultStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def done_ids(self) -> set[str]:
        with self._database_errors("read"):
            return {r[0] for r in self.db.execute("SELECT id FROM points")}

    def write(self, results: Iterable[PointResult]) -> int:
        """Insert finished points in one transaction; ids already stored are left alone. A
        point whose outputs leave a column empty that it should fill is refused (nothing of
        the batch is written): :func:`check_point_outputs`."""
        rows = []
        for r in results:
            out = r.outputs or {}
            if r.error is None:
                check_point_outputs(out, point=r.id)
            rows.append(
                (r.id, "ok" if r.error is None else "failed", r.error, json.dumps(r.point, sort_keys=True),
                 *(r.point.get(c) for c in INPUT_COLUMNS), *(_real(out.get(c)) for c in OUTPUT_COLUMNS),
                 *(out.get(c) for c in TEXT_OUTPUT_COLUMNS), json.dumps(out, sort_keys=True, default=_plain) if out else None,
                 r.seconds, r.worker, _now())
            )
        cols = POINTS_COLUMNS
        with self._database_errors("written"), self.db:
            cur = self.db.executemany(
                f"INSERT OR IGNORE INTO points ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})", rows
            )
        return cur.rowcount

    def meta(self) -> dict[str, str]:
        with self._database_errors("read"):
            return dict(self.db.execute("SELECT key, value FROM meta"))

    def input_columns(self) -> list[str]:
        """The dataframe's columns that are the points' inputs: the common axes and every field
        any point's inputs name (the rest are outputs and bookkeeping)."""
        with self._database_errors("read"):
            named = {key for (text,) in self.db.execute("SELECT inputs FROM points") for key in self._row_json(text)}
        return [*INPUT_COLUMNS, *sorted(named - set(INPUT_COLUMNS))]

    def dataframe(self) -> "pd.DataFrame":
        """Every row, with every input field and every output (those without a column of their
        own too, such as a hybrid model's share of time in each layer type) in its own column."""
        import pandas as pd

        try:
            with self._database_errors("read"):
                df = pd.read_sql_query("SELECT * FROM points ORDER BY finished_at, id", self.db)
        except pd.errors.DatabaseError as err:  # pandas' wrapping of SQLite's errors
            raise MambalayaError(f"{self.path}: the sweep store cannot be read: {err} (SQLite); if it is damaged, "
                                 "restore a copy or give --store a new file") from None
        if df.empty:
            return df
        for record in df.to_dict("records"):
            self._check_stored_row(record)
        parts = [df.drop(columns=[c for c in ("inputs", "outputs") if c in df.columns])]
        for column in ("inputs", "outputs"):
            if column in df.columns:
                flat = pd.json_normalize(df[column].map(self._row_json), sep=".")
                parts.append(flat[[c for c in flat.columns if all(c not in p.columns for p in parts)]])
        return pd.concat(parts, axis=1)


    def _check_stored_row(self, record: dict[str, Any]) -> None:
        """A :class:`MambalayaError` naming the store and the row if the row is not as
        :meth:`write` left it: its id is the hash of its inputs (:func:`point_id`), each column
        equals the value of its inputs or outputs, and a finished point's outputs pass
        :func:`check_point_outputs`. A row edited by hand (a latency of ``9e999`` typed into
        its column) is refused, not plotted."""
        inputs = self._row_json(record["inputs"])
        problem = None
        if point_id(inputs) != record["id"]:
            problem = "its inputs are not those its id was made from"
        else:
            outputs = self._row_json(record.get("outputs")) if record["status"] == "ok" else {}
            expected = {**{c: inputs.get(c) for c in INPUT_COLUMNS},
                        **{c: _real(outputs.get(c)) for c in (*OUTPUT_COLUMNS, *TEXT_OUTPUT_COLUMNS)}}
            differing = [c for c, value in expected.items() if c in record and not _same_cell(record[c], value)]
            if differing:
                problem = (f"its column {differing[0]} holds {record[differing[0]]!r} but the row's record says "
                           f"{expected[differing[0]]!r}")
            elif record["status"] == "ok":
                try:
                    check_point_outputs(outputs, point=record["id"])
                except MambalayaError as err:
                    problem = str(err).replace("; the row is refused", "")
        if problem:
            raise MambalayaError(f"{self.path}: the row of point {record['id']} was changed after mambalaya wrote it "
                                 f"({problem}); its numbers are not read. Restore a copy of the store, or delete "
                                 "the row and run the sweep again to recompute it")

    def _row_json(self, text: Any) -> dict[str, Any]:
        """A row's inputs or outputs (JSON text; empty for a failed point's outputs), or a
        :class:`MambalayaError` naming the store if the text is not what the store wrote."""
        if not isinstance(text, str):
            return {}
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise MambalayaError(f"{self.path}: a row holds {text[:40]!r}, not the JSON the store writes; the store is "
                                 "damaged: restore a copy, or give --store a new file")
        return value


# ----------------------------------------------------------------------------------------------
# recognising a store


def store_kind(path: Path, *, must_exist: bool = False) -> str:
    """What ``path`` is, read from its header without writing anything: ``"new"`` (no file
    there yet), ``"marked"`` (a store with the tool's marker) or ``"unmarked"`` (a store written
    before the marker, :func:`_is_unmarked_store`). Anything else is a :class:`MambalayaError`
    naming it, the file left untouched."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        if must_exist:
            raise MambalayaError(f"{path}: no such sweep store") from None
        return "new"
    except OSError as err:
        raise MambalayaError(f"{path}: cannot be read as a sweep store: {err.strerror or err}") from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise MambalayaError(f"{path} is {kind}, not a sweep store; give --store the path of a store file (a new one "
                             "is created)")
    try:
        with open(path, "rb") as f:
            header = f.read(100)
    except OSError as err:
        raise MambalayaError(f"{path}: cannot be read as a sweep store: {err.strerror or err}") from None
    if len(header) < 100 or not header.startswith(_SQLITE_MAGIC):
        what = "an empty file" if not header else "not an SQLite database"
        raise _not_a_store(path, what)
    application_id = int.from_bytes(header[68:72], "big")
    version = int.from_bytes(header[60:64], "big", signed=True)
    if application_id == STORE_APPLICATION_ID:
        if version > STORE_FORMAT:
            raise MambalayaError(f"{path} is a sweep store of format {version}, written by a newer mambalaya (this one "
                                 f"reads format {STORE_FORMAT}); it is left untouched: use that mambalaya, or a new --store")
        return "marked"
    if application_id != 0:
        raise _not_a_store(path, f"another application's SQLite database (application_id {application_id:#010x})")
    tables = _unmarked_store_tables(path, version)
    if tables is not None:
        raise _not_a_store(path, "an SQLite database without the sweep store's marker"
                           + (f" (its tables: {', '.join(tables[:8])}{', ...' if len(tables) > 8 else ''})" if tables
                              else " (and no tables)"))
    return "unmarked"


def _not_a_store(path: Path, what: str) -> MambalayaError:
    return MambalayaError(f"{path} is not a mambalaya sweep store: it is {what}. It is left untouched; give --store a "
                          "new file (or a store a sweep wrote)")


def _unmarked_store_tables(path: Path, version: int) -> list[str] | None:
    """None if ``path`` (an SQLite database with no application id) is a store written before
    the marker: user_version 0, exactly the tables ``meta`` (key, value; a model fingerprint in
    it) and ``points`` (every bookkeeping column, and only the store's columns). Else its
    tables, to name in the refusal. Read without writing (SQLite's read-only or immutable
    mode: no journal or lock file is left beside a database that is not the tool's)."""
    wal = Path(f"{path}-wal").exists()  # a store killed before its log was folded in: read through the log
    uri = f"file:{urllib.parse.quote(str(path.resolve()))}?{'mode=ro' if wal else 'immutable=1'}"
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
            tables = sorted(name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
            if version != 0 or tables != ["meta", "points"]:
                return tables
            meta = [row[1] for row in db.execute("PRAGMA table_info(meta)")]
            points = [row[1] for row in db.execute("PRAGMA table_info(points)")]
            known = meta == ["key", "value"] and set(_BOOKKEEPING_COLUMNS) <= set(points) <= set(POINTS_COLUMNS)
            if known and db.execute("SELECT 1 FROM meta WHERE key = 'model_fingerprint'").fetchone():
                return None
            return tables
    except sqlite3.DatabaseError as err:
        raise _not_a_store(path, f"an SQLite database that cannot be read ({err})") from None


def _create_store(path: Path) -> None:
    """A new, empty store at ``path``: made beside it under a temporary name with the marker,
    the format and the tables, then linked into place (a store killed while being created
    leaves no half-made file at ``path``; one made meanwhile by another sweep is kept)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.new")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.closing(sqlite3.connect(temporary)) as db:
            db.execute(f"PRAGMA application_id = {STORE_APPLICATION_ID}")
            db.execute(f"PRAGMA user_version = {STORE_FORMAT}")
            db.executescript(_SCHEMA)
            db.commit()
        try:
            os.link(temporary, path)
        except FileExistsError:
            pass
        except OSError:  # a file system without hard links
            if not path.exists():
                os.replace(temporary, path)
    except (OSError, sqlite3.DatabaseError) as err:
        raise MambalayaError(f"{path}: cannot create the sweep store: {getattr(err, 'strerror', None) or err}") from None
    finally:
        with contextlib.suppress(OSError):
            temporary.unlink()
    store_kind(path)  # (another sweep's file, made meanwhile, is checked like any other)


def _first_line(problems: list[str]) -> str:
    first = " ".join(str(problems[0]).split()) if problems else "no answer"
    return first + (f"; and {len(problems) - 1} more" if len(problems) > 1 else "")


# ----------------------------------------------------------------------------------------------
# what a row must hold


#: Output columns that may hold null, and what it means: no budget (power_budget_w); a hybrid
#: model whose attention is inside another layer type, not a layer type of its own (attention_share).
NULLABLE_OUTPUT_COLUMNS = ("power_budget_w", "attention_share")


def check_point_outputs(outputs: dict[str, Any], *, point: str = "") -> None:
    """A :class:`MambalayaError` if a point's ``outputs`` leave a store column empty that the
    point should fill, or fill one with something that is not a finite figure. Every point fills
    :data:`REQUIRED_OUTPUT_COLUMNS` and ``mapping_used``; a design with an energy section fills
    every one of :data:`ENERGY_OUTPUT_COLUMNS` (one without, none); a hybrid model's point
    (which has each layer type's share of the time, ``<type>_share``) fills ``attention_share``
    (null where its attention is inside another layer type). ``point`` names it in the message."""
    missing = [c for c in (*REQUIRED_OUTPUT_COLUMNS, *TEXT_OUTPUT_COLUMNS) if c not in outputs]
    if any(c in outputs for c in ENERGY_OUTPUT_COLUMNS):
        missing += [c for c in ENERGY_OUTPUT_COLUMNS if c not in outputs]
    if any(k.endswith("_share") and k != "attention_share" for k in outputs) and "attention_share" not in outputs:
        missing.append("attention_share")
    who = f"point {point}" if point else "a point"
    if missing:
        raise MambalayaError(f"{who}'s outputs leave the store's column(s) {', '.join(missing)} empty (outputs: "
                             f"{', '.join(sorted(outputs))}); the row is refused rather than stored incomplete")
    for column in OUTPUT_COLUMNS:
        if column not in outputs or outputs[column] is None and column in NULLABLE_OUTPUT_COLUMNS:
            continue
        value = outputs[column]
        if column == "over_power_budget":
            good = isinstance(value, bool)
        else:
            good = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
        if not good:
            raise MambalayaError(f"{who}'s output {column} is {value!r}, not a finite figure; the row is refused")
    if not isinstance(outputs["mapping_used"], str) or not outputs["mapping_used"]:
        raise MambalayaError(f"{who}'s output mapping_used is {outputs['mapping_used']!r}, not a mapping's name")


def _plain(value: Any) -> Any:
    """A numpy scalar among a point's outputs, as the Python number JSON writes."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"a sweep output of type {type(value).__name__} cannot be stored")


def _real(value: Any) -> Any:
    """A figure as SQLite stores it in a REAL column (a flag as 1 or 0)."""
    return int(value) if isinstance(value, bool) else value


def _same_cell(cell: Any, value: Any) -> bool:
    """Whether a stored cell (as pandas reads it: a null as None or NaN, a REAL as a float)
    holds ``value``."""
    if cell is None or (isinstance(cell, float) and math.isnan(cell)):
        return value is None
    if isinstance(cell, numbers.Real) and isinstance(value, numbers.Real):
        return float(cell) == float(value)
    return cell == value


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")
