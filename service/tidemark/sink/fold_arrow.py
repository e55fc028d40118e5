"""The fold without Spark: the same rules as ``tidemark.sink.fold``, on Arrow tables.

For readers that have no JVM (pandas, Polars, DuckDB users; ``tidemark read``). The
rules (see ``tidemark.sink.fold``): rows with ``_lsn <= L``, ordered by (snapshot rows
first, ``_lsn``, ``_op``); a ``truncate`` removes every row ordered before it; per
primary key the last row wins and a ``delete`` removes the key; a column a row lists in
``_unchanged`` takes the key's previous value.

A shape whose key is every one of its columns (a table without a primary key, under
REPLICA IDENTITY FULL: the whole row is the key) folds as a multiset instead, as
``tidemark.sink.fold`` says: each distinct row as many times as its inserts outnumber
its deletes.

Pure: Arrow tables in, an Arrow table out. Sorting is Arrow's; only the rows whose
winning change left columns unchanged (unchanged TOAST) are looked at one by one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tidemark.sink.schema import KIND, LSN, METADATA_NAMES, OP, UNCHANGED, is_row_key

SNAPSHOT = "snapshot"
TRUNCATE = "truncate"
DELETE = "delete"
_STREAM = "__tm_stream"


def fold_arrow(changes: pa.Table, primary_key: Sequence[str], as_of: int | None = None) -> pa.Table:
    """The state of a changelog table as of ``as_of``: the shape's columns and ``_lsn``,
    one row per key (in key order)."""
    out_columns = [n for n in changes.column_names if n not in METADATA_NAMES]
    if as_of is not None:
        changes = changes.filter(pc.less_equal(changes[LSN], pa.scalar(as_of, pa.int64())))
    stream = pc.cast(pc.not_equal(changes[KIND], pa.scalar(SNAPSHOT)), pa.int8())
    changes = changes.append_column(_STREAM, stream)
    order = [(_STREAM, "ascending"), (LSN, "ascending"), (OP, "ascending")]

    truncates = changes.filter(pc.equal(changes[KIND], pa.scalar(TRUNCATE)))
    if truncates.num_rows:
        last = truncates.take(pc.sort_indices(truncates, sort_keys=order)[-1:]).to_pylist()[0]
        after = (last[_STREAM], last[LSN], last[OP])
        changes = changes.filter(_ordered_after(changes, after))
    changes = changes.filter(pc.not_equal(changes[KIND], pa.scalar(TRUNCATE)))

    key_order = [(k, "ascending") for k in primary_key]
    changes = changes.take(pc.sort_indices(changes, sort_keys=key_order + order))
    n = changes.num_rows
    if n == 0:
        return _select(changes, out_columns)
    # the last row of each key: where the next row's key differs
    last_of_key = np.ones(n, dtype=bool)
    if n > 1:
        same = np.ones(n - 1, dtype=bool)
        for k in primary_key:
            same &= _same_as_next(changes[k].combine_chunks())
        last_of_key[:-1] = ~same
    winners = np.flatnonzero(last_of_key)
    if is_row_key(out_columns, primary_key):
        return _select(_copies(changes, winners), out_columns)
    state = changes.take(pa.array(winners))
    state = _carry_unchanged(changes, state, winners, primary_key)
    state = state.filter(pc.not_equal(state[KIND], pa.scalar(DELETE)))
    return _select(state, out_columns)


def fold_arrow_onto(base: pa.Table | None, tail: pa.Table, primary_key: Sequence[str]) -> pa.Table:
    """The state after the changelog rows ``tail`` are applied to the state ``base``
    (shape columns and ``_lsn``, one row per key; None: empty). Base rows fold before
    every tail row, as a snapshot's do."""
    if base is None:
        return fold_arrow(tail, primary_key)
    tail = tail.set_column(tail.schema.get_field_index(OP), OP, pc.cast(tail[OP], pa.int64()))
    n = base.num_rows
    filler = {
        OP: pa.array(np.zeros(n, dtype=np.int64)),
        KIND: pa.array(np.full(n, SNAPSHOT, dtype=object), pa.string()),
    }
    columns = []
    for field in tail.schema:
        if field.name in filler:
            columns.append(filler[field.name])
        elif field.name in base.column_names:
            columns.append(pc.cast(base[field.name], field.type))
        else:  # not in the state's table (e.g. _xid, or a column added since)
            columns.append(pa.nulls(n, field.type))
    as_rows = pa.Table.from_arrays(columns, schema=tail.schema)
    return fold_arrow(pa.concat_tables([as_rows, tail]), primary_key)


def _same_as_next(col: pa.Array) -> np.ndarray:
    """For each value but the last, whether the next one is the same value: NULL is the
    same as NULL and NaN as NaN, as a group of rows sees them (a keyless row's columns
    may be NULL)."""
    n = len(col)
    a, b = col.slice(0, n - 1), col.slice(1)
    same = pc.fill_null(pc.equal(a, b), False)
    same = pc.or_(same, pc.and_(pc.is_null(a), pc.is_null(b)))
    if pa.types.is_floating(col.type):
        same = pc.or_(same, pc.fill_null(pc.and_(pc.is_nan(a), pc.is_nan(b)), False))
    return same.to_numpy(zero_copy_only=False).astype(bool)


def _copies(changes: pa.Table, last_rows: np.ndarray) -> pa.Table:
    """The multiset fold of rows sorted by key then order (``last_rows``: each key's last
    row): a snapshot row or an insert adds a copy, a delete removes one (an update of a
    row keyed by all its columns leaves it as it was: a changed row comes as a delete and
    an insert). Each copy carries the ``_lsn`` of the row's last change."""
    kinds = changes[KIND].to_numpy(zero_copy_only=False)
    step = np.where(kinds == DELETE, -1, np.where(kinds == "update", 0, 1)).astype(np.int64)
    firsts = np.concatenate(([0], last_rows[:-1] + 1))
    counts = np.maximum(np.add.reduceat(step, firsts), 0)
    return changes.take(pa.array(np.repeat(last_rows, counts), pa.int64()))


def _ordered_after(changes: pa.Table, point: tuple[int, int, int]) -> pa.Array:
    """Rows ordered after ``point`` = (stream flag, lsn, op)."""
    s = pa.scalar(point[0], pa.int8())
    lsn, op = pa.scalar(point[1], pa.int64()), pa.scalar(point[2], pa.int64())
    col_s, col_l, col_o = changes[_STREAM], changes[LSN], pc.cast(changes[OP], pa.int64())
    return pc.or_(
        pc.greater(col_s, s),
        pc.and_(
            pc.equal(col_s, s),
            pc.or_(pc.greater(col_l, lsn), pc.and_(pc.equal(col_l, lsn), pc.greater(col_o, op))),
        ),
    )


def _carry_unchanged(
    changes: pa.Table, state: pa.Table, winners: np.ndarray, primary_key: Sequence[str]
) -> pa.Table:
    """Columns a winning row left unchanged take the key's latest earlier value that was
    sent (NULL when none was)."""
    if UNCHANGED not in changes.column_names:
        return state
    lengths = pc.list_value_length(state[UNCHANGED]).to_numpy(zero_copy_only=False)
    lengths = np.nan_to_num(lengths.astype(float), nan=0.0)
    pending = np.flatnonzero(lengths > 0)
    if not len(pending):
        return state
    unchanged = changes[UNCHANGED].to_pylist()
    first_of_key = np.concatenate(([0], winners[:-1] + 1))
    patches: dict[str, dict[int, int | None]] = {}
    for i in pending:
        row = int(winners[i])
        for name in unchanged[row] or ():
            source = None
            for earlier in range(row - 1, int(first_of_key[i]) - 1, -1):
                if name not in (unchanged[earlier] or ()):
                    source = earlier
                    break
            patches.setdefault(name, {})[int(i)] = source
    for name, rows in patches.items():
        if name in primary_key or name not in state.column_names:
            continue
        column = changes[name]
        values = state[name].to_pylist()
        for at, source in rows.items():
            values[at] = None if source is None else column[source].as_py()
        index = state.schema.get_field_index(name)
        state = state.set_column(index, state.schema.field(index), pa.array(values, column.type))
    return state


def _select(table: pa.Table, columns: Sequence[str]) -> pa.Table:
    return table.select([*columns, LSN])
