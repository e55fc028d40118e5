"""The compiled per-change path (``tidemark._fastpath``) against the pure-Python reference.

Both decoders get the same message streams (every message kind, stream blocks with
subtransaction aborts, NULLs, unchanged TOAST, binary values, and random mutations of
all of them) and must return equal messages or raise the same ``ProtocolError`` text;
``build_table`` must give equal Arrow tables (or the same refusal) from the same rows
on both paths, for every type family the decoder maps.

In ``make test`` the compiled module must be built: its absence fails here instead of
quietly testing the reference against itself. ``TIDEMARK_PURE_PYTHON=1`` skips the
comparison on purpose (the reference path is then the only one).
"""

from __future__ import annotations

import os

import pgoutput_bytes as pg
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_pgoutput_fuzz import messages

from tidemark.errors import ProtocolError, UnfitValue
from tidemark.pgoutput import (
    UNCHANGED_TOAST,
    BinaryDatum,
    Delete,
    Insert,
    Message,
    PgOutputDecoder,
    StreamAbort,
    StreamStart,
    StreamStop,
    Update,
)
from tidemark.pgoutput.fastpath import ENV, FAST, PATH, load
from tidemark.pgoutput.values import oids
from tidemark.sink.schema import ColumnSpec, table_schema
from tidemark.writers.arrow_batch import build_table
from tidemark.writers.buffer import Rows

PURE = os.environ.get(ENV, "").strip() not in ("", "0")
compiled_only = pytest.mark.skipif(PURE, reason=f"{ENV} is set: only the reference path runs")


def test_the_compiled_module_is_built_unless_the_reference_path_is_forced() -> None:
    if PURE:
        assert FAST is None
        assert PATH.startswith("pure Python")
    else:
        assert FAST is not None, PATH
        assert PATH.startswith("compiled")


def test_the_environment_variable_forces_the_reference_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV, "1")
    module, why = load()
    assert module is None
    assert why == f"pure Python ({ENV} is set)"


def test_asking_for_the_compiled_path_when_it_is_missing_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import tidemark.pgoutput.decoder as decoder_module
    from tidemark.errors import ConfigError

    monkeypatch.setattr(decoder_module, "FAST", None)
    with pytest.raises(ConfigError, match="compiled per-change path is not available"):
        PgOutputDecoder(4, compiled=True)
    assert PgOutputDecoder(4).compiled is False


# --- the decoder ---


def _run(decoder: PgOutputDecoder, stream: list[bytes]) -> list[object]:
    """Each message decoded, or the text of the ProtocolError it raised."""
    out: list[object] = []
    for raw in stream:
        try:
            out.append(decoder.decode(raw))
        except ProtocolError as exc:
            out.append(f"ProtocolError: {exc}")
    return out


def _both(stream: list[bytes], parallel: bool = False) -> tuple[list[object], list[object]]:
    compiled = PgOutputDecoder(4, parallel_streaming=parallel, compiled=True)
    reference = PgOutputDecoder(4, parallel_streaming=parallel, compiled=False)
    return _run(compiled, stream), _run(reference, stream)


def _in_block(message: Message) -> list[bytes]:
    """A change as it may arrive: alone, or inside a stream block when it has an xid."""
    raw = pg.encode(message)
    if getattr(message, "xid", None) is not None and not isinstance(message, StreamStart):
        return [pg.stream_start(1, True), raw, pg.stream_stop()]
    return [raw]


@compiled_only
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(messages, max_size=12))
def test_message_streams_decode_to_the_same_messages(stream: list[Message]) -> None:
    raw = [part for message in stream for part in _in_block(message)]
    compiled, reference = _both(raw)
    assert compiled == reference


@compiled_only
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.one_of(
            st.builds(
                Insert,
                st.integers(0, 2**32 - 1),
                st.lists(st.one_of(st.none(), st.binary()), max_size=8).map(tuple),
                st.integers(0, 9),
            ),
            st.builds(
                Update,
                st.integers(0, 2**32 - 1),
                st.one_of(st.none(), st.lists(st.binary(max_size=4), max_size=3).map(tuple)),
                st.none(),
                st.lists(st.one_of(st.just(UNCHANGED_TOAST), st.binary()), max_size=8).map(tuple),
                st.integers(0, 9),
            ).map(lambda u: Update(u.relation_oid, u.old, "O" if u.old else None, u.new, u.xid)),
            st.builds(
                Delete,
                st.integers(0, 2**32 - 1),
                st.lists(st.binary(max_size=6), max_size=4).map(tuple),
                st.sampled_from(["K", "O"]),
                st.integers(0, 9),
            ),
            st.builds(StreamAbort, st.integers(0, 9), st.integers(0, 9)),
        ),
        max_size=20,
    )
)
def test_streamed_transactions_with_subtransaction_aborts_decode_alike(
    changes: list[Message],
) -> None:
    raw = [pg.stream_start(7, True)]
    for change in changes:
        if isinstance(change, StreamAbort):  # ends the block, as Postgres sends it
            raw += [pg.stream_stop(), pg.encode(change), pg.stream_start(7, False)]
        else:
            raw.append(pg.encode(change))
    raw.append(pg.stream_stop())
    compiled, reference = _both(raw)
    assert compiled == reference
    assert not [m for m in compiled if isinstance(m, str)]
    assert sum(isinstance(m, StreamStop) for m in compiled) == raw.count(pg.stream_stop())


@compiled_only
@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(messages, st.data())
def test_mutated_messages_decode_or_fail_alike(message: Message, data: st.DataObject) -> None:
    parts = _in_block(message)
    target = 1 if len(parts) == 3 else 0
    raw = bytearray(parts[target])
    for _ in range(data.draw(st.integers(1, 4), label="edits")):
        how = data.draw(st.sampled_from(["flip", "cut", "grow"]), label="how")
        at = data.draw(st.integers(0, max(len(raw) - 1, 0)), label="at")
        if how == "flip" and raw:
            raw[at] = data.draw(st.integers(0, 255), label="byte")
        elif how == "cut":
            del raw[at:]
        else:
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=6), label="bytes")
    parts[target] = bytes(raw)
    parallel = isinstance(message, StreamAbort) and message.abort_lsn is not None
    compiled, reference = _both(parts, parallel)
    assert compiled == reference


@compiled_only
def test_binary_values_and_empty_rows_decode_alike() -> None:
    stream = [
        pg.encode(Insert(5, (BinaryDatum(b"\x00\x01"), None, b"", UNCHANGED_TOAST))),
        pg.encode(Insert(5, ())),
        pg.encode(Update(5, (b"1",), "K", (BinaryDatum(b""),))),
        pg.encode(Delete(5, (None,), "O")),
    ]
    compiled, reference = _both(stream)
    assert compiled == reference
    assert isinstance(compiled[0], Insert)
    assert compiled[0].new == (BinaryDatum(b"\x00\x01"), None, b"", UNCHANGED_TOAST)


# --- the batch ---

# Text as Postgres outputs it, per type family the decoder maps (and one it does not).
SAMPLES: dict[int, list[bytes]] = {
    oids.INT4: [b"0", b"-2147483648", b"2147483647", b"42"],
    oids.INT8: [b"9223372036854775807", b"-1"],
    oids.INT2: [b"-32768", b"7"],
    oids.FLOAT8: [b"1.5", b"NaN", b"-Infinity", b"1e+300"],
    oids.NUMERIC: [b"0", b"123.4500", b"-0.001", b"NaN"],
    oids.BOOL: [b"t", b"f"],
    oids.TEXT: [b"", "h\u00e9llo \u2603".encode(), b"a\x01b"],
    oids.VARCHAR: [b"x" * 40],
    oids.BYTEA: [b"\\x", b"\\x00ff10"],
    oids.DATE: [b"2024-02-29", b"infinity", b"0001-01-01 BC"],
    oids.TIMESTAMPTZ: [b"2024-05-06 07:08:09.123456+00", b"2000-01-01 00:00:00+02:30"],
    oids.TIMESTAMP: [b"1999-12-31 23:59:59"],
    oids.TIME: [b"13:14:15.5"],
    oids.UUID_OID: [b"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"],
    oids.JSONB: [b'{"a": [1, 2, null]}', b"3"],
    oids.INTERVAL: [b"1 year 2 mons 3 days 04:05:06.5", b"-00:00:01"],
    1007: [b"{1,2,NULL}", b"{}"],  # int4[]
    1009: [b'{"a b",c,NULL}'],  # text[]
    oids.INT4RANGE: [b"[1,5)", b"empty"],
    oids.POINT: [b"(1,2)"],
    600_000: [b"whatever a user type prints"],  # unknown: stays text
}
WRONG: dict[int, list[bytes]] = {
    oids.INT4: [b"2147483648", b"x"],
    oids.NUMERIC: [b"1e"],
    oids.DATE: [b"2024-13-01"],
}

TYPES = sorted(SAMPLES)


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[ColumnSpec], Rows]:
    width = draw(st.integers(1, 5))
    types = draw(st.lists(st.sampled_from(TYPES), min_size=width, max_size=width))
    specs = [ColumnSpec(f"c{i}", oid) for i, oid in enumerate(types)]
    wrong = draw(st.integers(0, 5)) == 0
    n = draw(st.integers(0, 40))
    rows = Rows()
    op = 0
    left = n
    lsn = 1000
    while left:
        count = draw(st.integers(1, left))
        for _ in range(count):
            short = draw(st.integers(0, 12)) == 0  # buffered before a column was added
            k = draw(st.integers(0, width)) if short else width
            values: list[object] = []
            for oid in types[:k]:
                choice = draw(st.integers(0, 9))
                if choice == 0:
                    values.append(None)
                elif choice == 1:
                    values.append(UNCHANGED_TOAST)
                elif wrong and oid in WRONG and choice == 2:
                    values.append(draw(st.sampled_from(WRONG[oid])))
                else:
                    values.append(draw(st.sampled_from(SAMPLES[oid])))
            unchanged = [specs[i].name for i, v in enumerate(values) if v is UNCHANGED_TOAST]
            rows.add(op, "update" if unchanged else "insert", tuple(values), unchanged or None, 8)
            op += 1
        rows.runs.append((lsn, draw(st.integers(1, 2**31)), draw(st.integers(0, 10**15)), count))
        lsn += draw(st.integers(1, 10**6))
        left -= count
    return specs, rows


def _table_or_refusal(specs: list[ColumnSpec], rows: Rows, compiled: bool) -> object:
    try:
        return build_table(table_schema(specs), specs, rows, "s", compiled=compiled)
    except (UnfitValue, ProtocolError) as refused:
        return f"{type(refused).__name__}: {refused}"


def _ipc(table: pa.Table) -> bytes:
    """The table's bytes in one chunk: equal bytes, equal values (NaN included, which
    ``Table.equals`` calls unequal to itself)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table.combine_chunks())
    return sink.getvalue().to_pybytes()


@compiled_only
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_batches_build_the_same_table_on_both_paths(batch: tuple[list[ColumnSpec], Rows]) -> None:
    specs, rows = batch
    compiled = _table_or_refusal(specs, rows, True)
    reference = _table_or_refusal(specs, rows, False)
    if isinstance(reference, pa.Table):
        assert isinstance(compiled, pa.Table)
        assert compiled.schema == reference.schema
        assert _ipc(compiled) == _ipc(reference)
    else:
        assert compiled == reference


@compiled_only
def test_rows_holding_a_binary_value_take_the_reference_path() -> None:
    assert FAST is not None
    specs = [ColumnSpec("b", oids.BYTEA)]
    assert FAST.text_columns([(BinaryDatum(b"\x01"),)], 1) is None
    assert FAST.text_columns([(b"\\x01",), (None,), ()], 1) is not None
    rows = Rows()
    rows.add(0, "insert", (b"\\x01",), None, 8)
    rows.runs.append((1, 2, 3, 1))
    table = build_table(table_schema(specs), specs, rows, compiled=True)
    assert table.column("b").to_pylist() == [b"\x01"]
