"""Buffered rows to an Arrow table, one whole column at a time.

The values of each output column are gathered into one Arrow ``binary`` array by the
compiled ``text_columns`` (``tidemark._fastpath``) where it was built, or with one
``zip(*rows)`` into Python lists (the reference), and converted by the column's
``LakeColumn`` (``ColumnSpec.lake``; Arrow casts the text in bulk); per-transaction
metadata runs are expanded with NumPy's ``repeat``. No per-value
Python work happens here except replacing UNCHANGED_TOAST markers by NULL in the
rare batches that have them, and padding rows buffered before a column was added
upstream (columns are only ever appended: a dropped column keeps its place as NULL).

A value the lake column cannot hold exactly raises ``UnfitValue`` naming the column
(and the shape, when the caller passes it): the batch is refused, never rounded.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tidemark.errors import SinkError, UnfitValue
from tidemark.pgoutput.fastpath import FAST
from tidemark.pgoutput.messages import UNCHANGED_TOAST
from tidemark.sink.schema import OP, ColumnSpec
from tidemark.writers.buffer import Rows

PG_EPOCH_US = 946_684_800_000_000  # 2000-01-01 in Unix microseconds
_BINARY = pa.binary()


def build_table(
    schema: pa.Schema,
    specs: Sequence[ColumnSpec],
    rows: Rows,
    shape: str | None = None,
    compiled: bool | None = None,
) -> pa.Table:
    """``compiled``: gather the columns with ``tidemark._fastpath`` (None: if it was
    built; False: the pure-Python reference below)."""
    n = len(rows)
    width = len(specs)
    fast = FAST if compiled is None or compiled else None
    gathered = fast.text_columns(rows.values, width) if fast is not None and n else None
    if gathered is not None:
        arrays = [
            _column(spec, pa.Array.from_buffers(_BINARY, n, _buffers(parts), parts[3]), shape)
            for spec, parts in zip(specs, gathered, strict=True)
        ]
    else:
        arrays = _gather(specs, rows, shape)
    arrays.extend(_metadata(schema, rows))
    return pa.Table.from_arrays(arrays, schema=schema)


def _buffers(parts: tuple[bytes | None, bytes, bytes, int]) -> list[pa.Buffer | None]:
    validity, offsets, data, _ = parts
    return [
        None if validity is None else pa.py_buffer(validity),
        pa.py_buffer(offsets),
        pa.py_buffer(data),
    ]


def _gather(specs: Sequence[ColumnSpec], rows: Rows, shape: str | None) -> list[pa.Array]:
    """The reference: one ``zip(*rows)``, then each column's values as a list."""
    n = len(rows)
    tuples: Sequence[tuple[object, ...]] = rows.values
    width = len(specs)
    widths = set(map(len, tuples))
    if widths and widths != {width}:
        if max(widths) > width:
            raise ValueError(f"rows have {max(widths)} values, the shape has {width} columns")
        # rows buffered before a column was added upstream: it is NULL for them
        tuples = [v + (None,) * (width - len(v)) if len(v) < width else v for v in tuples]
    columns = list(zip(*tuples, strict=True)) if n else [() for _ in specs]
    arrays: list[pa.Array] = []
    for spec, column in zip(specs, columns, strict=True):
        values: Sequence[object] = column
        if rows.has_unchanged:
            values = [None if v is UNCHANGED_TOAST else v for v in column]
        arrays.append(_column(spec, values, shape))
    return arrays


def _metadata(schema: pa.Schema, rows: Rows) -> list[pa.Array]:
    """``_lsn``, ``_op``, ``_kind``, ``_xid``, ``_commit_ts``, ``_unchanged``: the
    per-transaction runs expanded by NumPy, the per-row lists converted by Arrow."""
    n = len(rows)
    # (from a flat iterator: twice as fast as np.array's walk over the tuples, and small
    # transactions make a run a row)
    flat = chain.from_iterable(rows.runs)
    runs = np.fromiter(flat, dtype=np.int64, count=4 * len(rows.runs)).reshape(-1, 4)
    counts = runs[:, 3]
    if int(counts.sum()) != n:
        raise ValueError(f"metadata runs cover {int(counts.sum())} rows, the batch has {n}")
    return [
        pa.array(np.repeat(runs[:, 0], counts)),
        pa.array(rows.ops, schema.field(OP).type),
        pa.array(rows.kinds, pa.string()),
        pa.array(np.repeat(runs[:, 1], counts)),
        pa.array(np.repeat(runs[:, 2] + PG_EPOCH_US, counts)).cast(pa.timestamp("us", tz="UTC")),
        pa.array(rows.unchanged, pa.list_(pa.string())),
    ]


def _column(spec: ColumnSpec, values: Sequence[object] | pa.Array, shape: str | None) -> pa.Array:
    try:
        return spec.lake.to_arrow(values)
    except UnfitValue as refused:
        raise refused.within(column=spec.name, shape=shape) from None


def _counting(first: int, n: int) -> pa.Array:
    """int64 ``first, first + 1, ..., first + n - 1``; pyarrow's own kernels, not a
    Python ``range`` (16 ms per 200k rows against 1 ms)."""
    ones = pa.repeat(pa.scalar(1, pa.int64()), n)
    return pc.add(pc.cumulative_sum(ones), pa.scalar(first - 1, pa.int64()))


def snapshot_table(
    schema: pa.Schema,
    specs: Sequence[ColumnSpec],
    text: pa.Table,
    lsn: int,
    first_op: int,
    shape: str | None = None,
) -> pa.Table:
    """Snapshot rows (text columns from COPY) as a shape table batch: typed columns,
    ``_kind = snapshot``, ``_lsn = lsn``, ``_op`` counting from ``first_op``. A column
    the snapshot did not select (added upstream after it) is NULL."""
    n = text.num_rows
    names = set(text.column_names)
    arrays: list[pa.Array] = [
        _column(spec, text.column(spec.name).combine_chunks(), shape)
        if spec.name in names
        else pa.nulls(n, spec.arrow_type)
        for spec in specs
    ]
    arrays.append(pa.repeat(pa.scalar(lsn, pa.int64()), n))
    op_type = schema.field(OP).type
    if op_type == pa.int32() and first_op + n > 2**31:
        raise SinkError(
            f"shape '{shape}': its table was made by an earlier tidemark, whose _op column "
            "(int32) holds at most 2^31 snapshot rows, and this snapshot has more: resync "
            "the shape (POST /shapes/{name}/resync), which rewrites its table with an int64 "
            "_op"
        )
    arrays.append(_counting(first_op, n).cast(op_type))
    arrays.append(pa.repeat(pa.scalar("snapshot", pa.string()), n))
    arrays.append(pa.nulls(n, pa.int64()))
    arrays.append(pa.nulls(n, pa.timestamp("us", tz="UTC")))
    arrays.append(pa.nulls(n, pa.list_(pa.string())))
    return pa.Table.from_arrays(arrays, schema=schema)
