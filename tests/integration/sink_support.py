"""Drive writers the way the collector does, and model what a fold must return."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tidemark.flush.tracker import CommitFragment, FlushTracker
from tidemark.lsn import LogOffset
from tidemark.sink import ChangelogTable, TableFormat, table_format
from tidemark.sink.schema import ColumnSpec, table_schema
from tidemark.writers.writer import ShapeWriter

ITEM_COLUMNS = [ColumnSpec("id", 23), ColumnSpec("name", 25), ColumnSpec("big", 25)]

Row = tuple[str, tuple[object, ...], list[str] | None]  # (kind, values, unchanged)


@dataclass
class Feeder:
    """A stand-in for the collector: one tracker, several writers."""

    tracker: FlushTracker
    writers: dict[str, ShapeWriter] = field(default_factory=dict)
    notified: list[int] = field(default_factory=list)

    def txn(
        self,
        lsn: int,
        per_shape: dict[str, Sequence[Row]],
        total_ops: int | None = None,
        xid: int = 1,
        commit_ts: int = 0,
    ) -> None:
        """One transaction; ops are numbered across shapes like a real transaction."""
        affected = []
        op = 0
        for shape, rows in per_shape.items():
            writer = self.writers[shape]
            if not writer.begin_txn(lsn, xid, commit_ts):
                op += len(rows)
                continue
            affected.append(shape)
            for kind, values, unchanged in rows:
                writer.append(op, kind, values, unchanged, 32)  # type: ignore[arg-type]
                op += 1
        last = LogOffset(lsn, max(op, total_ops or 0))
        self.tracker.handle_txn_fragment(CommitFragment(last), affected)
        for shape in affected:
            self.writers[shape].end_txn(last)


def make_feeder() -> Feeder:
    notified: list[int] = []
    tracker = FlushTracker(lambda lsn, _caught_up: notified.append(lsn), clock=lambda: 0.0)
    feeder = Feeder(tracker, notified=notified)
    return feeder


def open_writer(
    feeder: Feeder,
    root: str,
    shape: str,
    columns: list[ColumnSpec] = ITEM_COLUMNS,
    tables: TableFormat | None = None,
) -> ShapeWriter:
    table = (tables or table_format()).changelog(root, shape)
    table.create(table_schema(columns), [columns[0].name], {"name": shape})
    writer = ShapeWriter(table, columns, feeder.tracker.handle_flush_notification)
    feeder.writers[shape] = writer
    return writer


def rows_of(table: ChangelogTable) -> list[dict[str, object]]:
    """Every row of the table, read with the format's own library (deltalake,
    pyiceberg), independent of tidemark's and Spark's readers."""
    from tidemark.sink.iceberg.table import IcebergChangelog

    if isinstance(table, IcebergChangelog):
        loaded = table.catalog.load_table(table.ident)
        return loaded.scan().to_arrow().to_pylist()  # type: ignore[no-any-return]
    from deltalake import DeltaTable

    from tidemark.state import objectstore

    dt = DeltaTable(table.uri, storage_options=objectstore.storage_options(table.uri))
    return dt.to_pyarrow_table().to_pylist()  # type: ignore[no-any-return]
