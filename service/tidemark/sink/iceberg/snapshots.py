"""What tidemark keeps in an Iceberg table's snapshots, and the one way it commits.

Every snapshot tidemark commits carries its table's state in the snapshot summary,
copied forward from the snapshot it is built on and updated (so the newest snapshot
alone says everything, and expiring older ones loses nothing the replay check
needs):

- ``tidemark.offset.<application id>``: the commit LSN of the last transaction
  committed for that stream (``tidemark:<shape>``, ``tidemark:<shape>#<epoch>``);
- ``tidemark.generation``: how often the rows were replaced (a backfill, a resync);
- ``tidemark.retained.<generation>``: the LSN through which retention dropped rows;
- ``tidemark-epoch[:<instance>]``: the newest leader epoch that marked the table.

A commit is built on the snapshot its checks read and asserts that snapshot is still
the table's newest (pyiceberg's ``assert-ref-snapshot-id``, checked by the catalog as
it swaps the metadata pointer): any commit between the check and the swap, another
writer's or a newer leader's mark, makes it fail with ``CommitFailedException``, and
the caller reads the table again and checks again. pyiceberg's own retry (which
would rebase the commit on the newer snapshot without our checks) is off on every
table tidemark creates (``commit.retry.num-retries = 0``).

Other writers: a snapshot whose summary has no key of tidemark's (every key above
starts with ``tidemark``) is another writer's. The table's state is that of
tidemark's newest snapshot, read past others' snapshots after it. tidemark builds on
others' appends (their rows stay in the changelog), and refuses anything else
(``others_change``): an overwrite, a delete, a replace, a schema changed, a history
rolled back past tidemark's snapshots; the shape is in error until the table is
rolled back or the shape resynced (a backfill builds on anything).
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa

from tidemark.errors import SinkError
from tidemark.sink.iceberg.catalog import refusal
from tidemark.state import fencing

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile as IcebergFile
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table, Transaction

OFFSET: Final = "tidemark.offset."
GENERATION: Final = "tidemark.generation"
RETAINED: Final = "tidemark.retained."
CARRIED: Final = (OFFSET, RETAINED, GENERATION, fencing.EPOCH_APP)
COMMIT_ATTEMPTS: Final = 5
# snapshots kept in a table's metadata (each commit rewrites it whole): older ones are
# removed by the commit that passes this many (``[iceberg] max_snapshots``, kept as a
# table property), their files by the next vacuum
MAX_SNAPSHOTS_PROPERTY: Final = "tidemark.max-snapshots"
MAX_SNAPSHOTS: Final = 100
TABLE_PROPERTIES: Final = {
    "commit.retry.num-retries": "0",  # (see the module docstring)
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "20",
    "write.parquet.compression-codec": "zstd",
}


def summary(table: Table, snapshot_id: int | None = None) -> dict[str, str]:
    """The table's state: the summary of tidemark's newest snapshot (``own``), or of
    ``snapshot_id``."""
    snap = own(table)[0] if snapshot_id is None else table.snapshot_by_id(snapshot_id)
    return _properties(snap)


def _properties(snap: Any) -> dict[str, str]:
    if snap is None or snap.summary is None:
        return {}
    return {str(k): str(v) for k, v in snap.summary.additional_properties.items()}


def is_own(found: Mapping[str, str]) -> bool:
    """A snapshot summary tidemark wrote: every key it writes starts with ``tidemark``."""
    return any(k.startswith("tidemark") for k in found)


def own(table: Table) -> tuple[Any, list[Any]]:
    """Tidemark's newest snapshot in the table's history (None if none is left), and
    the other writers' snapshots after it, oldest first."""
    snap = table.current_snapshot()
    others = []
    while snap is not None and not is_own(_properties(snap)):
        others.append(snap)
        parent = snap.parent_snapshot_id
        snap = None if parent is None else table.snapshot_by_id(parent)
    return snap, others[::-1]


def others_change(
    others: Sequence[tuple[int, str]], own_id: int | None, schema_moved: bool
) -> tuple[str, int] | None:
    """What other writers did since tidemark's newest snapshot ``own_id`` (None: none is
    left) that tidemark may not build on, as (what, snapshot id), or None. ``others``:
    their snapshots after it, (id, operation) oldest first; ``schema_moved``: the table's
    schema is not the one that snapshot was written with. Appends alone are fine."""
    for snapshot_id, operation in others:
        if operation != "append":
            return operation, snapshot_id
    if others and own_id is None:
        return "history", others[0][0]
    if schema_moved:
        return "schema", -1 if own_id is None else own_id
    return None


def others_refusal(shape: str, name: str, what: str, snapshot_id: int, own_id: int | None) -> str:
    """The error of a commit refused by ``others_change``'s answer, saying what to do."""
    if what == "history":
        why = "no snapshot of tidemark's is left in its history"
    elif what == "schema":
        why = "its schema was changed"
    else:
        why = f"snapshot {snapshot_id} is another writer's '{what}'"
    back = (
        f"roll the table back to tidemark's snapshot {own_id} (e.g. Spark's CALL "
        f"<catalog>.system.rollback_to_snapshot('{name}', {own_id})), or "
        if own_id is not None and what not in ("history", "schema")
        else ""
    )
    return (
        f"shape '{shape}': another writer changed the Iceberg table {name} ({why}); tidemark "
        "builds a changelog only on its own commits and other writers' appends. To go on, "
        f"{back}rebuild the shape's rows with `tidemark shapes resync {shape}`"
    )


def check_others(table: Table, shape: str, name: str) -> None:
    """Refuse (``SinkError``) a commit on a table others changed beyond appends."""
    mine, others = own(table)
    own_id = None if mine is None else mine.snapshot_id
    moved = (
        mine is not None
        and mine.schema_id is not None
        and mine.schema_id != table.metadata.current_schema_id
    )
    found = others_change([(s.snapshot_id, _operation(s)) for s in others], own_id, moved)
    if found is not None:
        raise SinkError(others_refusal(shape, name, *found, own_id))


def _operation(snap: Any) -> str:
    operation = None if snap.summary is None else snap.summary.operation
    return str(getattr(operation, "value", operation) or "")


def carried(found: Mapping[str, str]) -> dict[str, str]:
    """What a new snapshot copies from the one it is built on."""
    return {k: v for k, v in found.items() if k.startswith(CARRIED)}


def number(found: Mapping[str, str], key: str) -> int | None:
    value = found.get(key)
    return None if value is None else int(value)


def marked(found: Mapping[str, str], extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """``found``'s carried state, then ``extra``, then this leader's mark and writer."""
    fence = fencing.current()
    out = carried(found) | dict(extra or {}) | fence.commit_info()
    if fence.epoch is not None:
        out[fence.app_id] = str(fence.epoch)
    return out


def check_fence(found: Mapping[str, str], where: str) -> None:
    """Refuse a commit built on a snapshot a newer leader marked (``Deposed``)."""
    fence = fencing.current()
    if fence.epoch is not None:
        fence.check_table(number(found, fence.app_id), where)


def data_files(
    table: Table, snapshot_id: int | None = None, *, cached: bool = True
) -> list[IcebergFile]:
    """The data files of the newest snapshot (or of ``snapshot_id``). Manifest lists and
    manifests never change once written: what was read of them is kept (``_Kept``), so a
    table read again after a commit reads only the commit's new ones; ``cached=False``
    reads every one again (a start's check of what survived a power loss)."""
    from pyiceberg.manifest import ManifestContent

    snap = table.current_snapshot() if snapshot_id is None else table.snapshot_by_id(snapshot_id)
    if snap is None:
        return []
    if (
        snap.summary is not None
        and snap.summary.additional_properties.get("total-data-files") == "0"
    ):  # (a new table's: no manifest list to read)
        return []
    if not cached:
        _LISTS.forget(snap.manifest_list)
    out: list[IcebergFile] = []
    for manifest in _LISTS.get(snap.manifest_list, lambda: tuple(snap.manifests(table.io))):
        if manifest.content != ManifestContent.DATA:
            continue
        if not cached:
            _ENTRIES.forget(manifest.manifest_path)
        out += _ENTRIES.get(
            manifest.manifest_path,
            lambda m=manifest: tuple(  # type: ignore[misc]
                e.data_file for e in m.fetch_manifest_entry(table.io, discard_deleted=True)
            ),
        )
    return out


class _Kept:
    """What was read of files that never change, by path: the newest ``size`` kept."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, path: str, read: Callable[[], Any]) -> Any:
        with self._lock:
            if path in self._items:
                self._items.move_to_end(path)
                return self._items[path]
        value = read()  # (outside the lock: two threads may read one file, both alike)
        with self._lock:
            self._items[path] = value
            while len(self._items) > self._size:
                self._items.popitem(last=False)
        return value

    def forget(self, path: str) -> None:
        with self._lock:
            self._items.pop(path, None)


# (a manifest list per table and its few manifests: 1000 shapes' tables fit)
_LISTS: Final = _Kept(4096)
_ENTRIES: Final = _Kept(16384)


def relative(table: Table, file_path: str) -> str:
    """A data file's path relative to the table's folder (as Delta's log has it)."""
    base = table.location().rstrip("/") + "/"
    return file_path[len(base) :] if file_path.startswith(base) else file_path


def absolute(table: Table, rel: str) -> str:
    return rel if "://" in rel or rel.startswith("/") else f"{table.location().rstrip('/')}/{rel}"


def commit(
    table: Table,
    snapshot: Mapping[str, str],
    *,
    add: Sequence[str] = (),
    delete: Iterable[IcebergFile] = (),
    schema: Schema | None = None,
    properties: Mapping[str, str] | None = None,
    evolve: Any = None,
) -> Table:
    """One commit on ``table`` as loaded: the new schema ``schema`` (fresh field ids) or
    ``evolve(update_schema)``, then ``properties``, then a snapshot that deletes
    ``delete``, adds the Parquet files ``add`` (absolute URIs) and has the summary
    ``snapshot``. Returns the table after it; ``CommitFailedException`` when another
    commit landed since ``table`` was loaded."""
    from pyiceberg.io.pyarrow import parquet_file_to_data_file
    from pyiceberg.table.update import (
        AddSchemaUpdate,
        AssertCurrentSchemaId,
        RemoveSnapshotsUpdate,
        SetCurrentSchemaUpdate,
    )

    tx = new_transaction(table)
    # (a schema another writer changed meanwhile fails the commit too: no snapshot shows it)
    schema_id = table.metadata.current_schema_id
    tx._apply((), (AssertCurrentSchemaId.model_validate({"current-schema-id": schema_id}),))
    if schema is not None:
        tx._apply(
            (
                AddSchemaUpdate.model_validate({"schema": schema}),
                SetCurrentSchemaUpdate.model_validate({"schema-id": -1}),
            )
        )
    if evolve is not None:
        with tx.update_schema() as update:
            evolve(update)
    if schema is not None or evolve is not None:
        mapping = tx.table_metadata.schema().name_mapping.model_dump_json()
        tx.set_properties({"schema.name-mapping.default": mapping})
    if properties:
        tx.set_properties(dict(properties))
    deleting = list(delete)
    producer = tx.update_snapshot(snapshot_properties=dict(snapshot))
    with producer.overwrite() if deleting else producer.merge_append() as files:
        for gone in deleting:
            files.delete_data_file(gone)
        for uri in add:
            files.append_data_file(parquet_file_to_data_file(table.io, tx.table_metadata, uri))
    old = sorted(table.snapshots(), key=lambda s: s.timestamp_ms)
    keep = int(table.properties.get(MAX_SNAPSHOTS_PROPERTY) or MAX_SNAPSHOTS)
    if len(old) >= keep:
        current = table.current_snapshot()
        expire = [s.snapshot_id for s in old[: len(old) - keep + 1]]
        expire = [s for s in expire if current is None or s != current.snapshot_id]
        if expire:
            tx._apply((RemoveSnapshotsUpdate.model_validate({"snapshot-ids": expire}),))
    try:
        return tx.commit_transaction()
    except Exception as exc:
        refused = refusal(exc)
        if refused is None:
            raise
        name = ".".join(table.name())
        raise SinkError(
            f"shape '{table.name()[-1]}': the Iceberg catalog refused the commit to {name} "
            f"({type(exc).__name__}: {exc}); {refused}"
        ) from exc


def _transaction_class() -> type:
    from pyiceberg.table import Transaction
    from pyiceberg.table.update import update_table_metadata

    class CachedTransaction(Transaction):
        """pyiceberg's transaction, but its ``table_metadata`` (the base metadata with
        the staged updates applied, and deep-copied) is computed once per set of
        updates, not on every read: a commit read it ~16 times, each a deep copy of
        the whole metadata, which made a commit cost grow by ~0.7 ms a snapshot."""

        _cache: tuple[int, int, Any] | None = None

        @property
        def table_metadata(self) -> Any:
            key = (id(self._table.metadata), len(self._updates))
            if self._cache is None or self._cache[:2] != key:
                self._cache = (*key, update_table_metadata(self._table.metadata, self._updates))
            return self._cache[2]

    return CachedTransaction


def new_transaction(table: Table) -> Transaction:
    """A transaction on ``table`` as loaded (``CachedTransaction``)."""
    global _TRANSACTION
    if _TRANSACTION is None:
        _TRANSACTION = _transaction_class()
    tx: Transaction = _TRANSACTION(table)
    return tx


_TRANSACTION: type | None = None


def arrow_schema(table: Table) -> pa.Schema:
    """The table's schema in Arrow, as tidemark's writers name types (``string``, not
    ``large_string``; no field-id metadata)."""
    return normalized(table.schema().as_arrow())


def normalized(schema: pa.Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, _plain(f.type), f.nullable) for f in schema])


def _plain(t: pa.DataType) -> pa.DataType:
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_large_list(t) or pa.types.is_list(t):
        return pa.list_(pa.field("element", _plain(t.value_type), t.value_field.nullable))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _plain(f.type), f.nullable) for f in t])
    if pa.types.is_map(t):
        return pa.map_(_plain(t.key_type), _plain(t.item_type))
    return t


def _optional(schema: pa.Schema) -> pa.Schema:
    """Every column optional: Spark writes some files (a backfill's) with the metadata
    columns nullable, and Iceberg refuses a file whose column is optional where the
    table's is required."""
    return pa.schema([pa.field(f.name, f.type, True) for f in schema])


def iceberg_schema(schema: pa.Schema) -> Schema:
    """An Iceberg schema for an Arrow one, with field ids from 1 (a new table's)."""
    # (pyiceberg's conversion is ~1.5 ms of Python, and every shape of one table asks it
    # for the same schema: 1000 shapes start with one conversion, not thousands)
    return _iceberg_schema(schema.serialize().to_pybytes())


@functools.lru_cache(maxsize=256)
def _iceberg_schema(serialized: bytes) -> Schema:
    from pyiceberg.io.pyarrow import _pyarrow_to_schema_without_ids
    from pyiceberg.schema import assign_fresh_schema_ids

    plain = _optional(pa.ipc.read_schema(pa.py_buffer(serialized)))
    try:
        return assign_fresh_schema_ids(_pyarrow_to_schema_without_ids(plain))
    except Exception as exc:  # (pyiceberg: UnsupportedPyArrowTypeException, ValueError)
        raise SinkError(f"a column type Iceberg cannot hold: {exc}") from exc


def fresh_schema(schema: pa.Schema, table: Table) -> Schema:
    """A replacement schema for ``table``: field ids after every id it used, so no
    old file's column is read as a new one."""
    from pyiceberg.io.pyarrow import _pyarrow_to_schema_without_ids
    from pyiceberg.schema import Schema, assign_fresh_schema_ids

    last = table.metadata.last_column_id
    counter = iter(range(last + 1, last + 100_000))
    plain = _optional(schema)
    fresh = assign_fresh_schema_ids(_pyarrow_to_schema_without_ids(plain), lambda: next(counter))
    # a schema id of its own too: "set the schema last added" picks by id, and an id
    # the table already has would set that older schema back
    schema_id = max(s.schema_id for s in table.metadata.schemas) + 1
    return Schema(*fresh.fields, schema_id=schema_id)


def round_trip(schema: pa.Schema) -> pa.Schema:
    """``schema`` as an Iceberg table would give it back (e.g. int16 as int32)."""
    return _round_trip(schema.serialize().to_pybytes())


@functools.lru_cache(maxsize=1024)
def _round_trip(serialized: bytes) -> pa.Schema:
    return normalized(_iceberg_schema(serialized).as_arrow())
