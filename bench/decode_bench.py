"""Decode throughput of the pgoutput hot path.

``decode_synthetic(n)`` builds one transaction of ``n`` Insert messages (columns int8,
text of about 20 characters, timestamptz, numeric(12,2), all in text format as
pgoutput sends them), framed Begin / Relation / n x Insert / Commit, and times
``PgOutputDecoder.decode`` over it (best of 5 runs). It also times the same messages
wrapped in XLogData frames and unwrapped first, with ``parse_copy_data`` (typed) and
with ``xlogdata_parts`` (plain tuple), as the replication client does per message.
``convert_synthetic(n)`` times the writer's half of the hot path on the same rows:
``build_table`` turning ``n`` buffered rows of text into the typed Arrow batch
(``to_arrow`` per column), as a flush does before Spark writes it.

The payloads are built up front, so with large ``n`` they no longer fit in the CPU
caches and the figure includes memory stalls that a live stream (each payload fresh
from the socket) does not have; compare n=10_000 with n=200_000.

Run: ``.venv/bin/python bench/decode_bench.py [n]``
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit"))

import pgoutput_bytes as pg

from tidemark.pgoutput.decoder import PgOutputDecoder
from tidemark.pgoutput.framing import XLogData, parse_copy_data, xlogdata_parts
from tidemark.sink.schema import ColumnSpec, table_schema
from tidemark.writers.arrow_batch import build_table
from tidemark.writers.buffer import Rows

INT8, TEXT, TIMESTAMPTZ, NUMERIC = 20, 25, 1184, 1700
NUMERIC_12_2 = ((12 << 16) | 2) + 4
RELATION_OID = 16384


def _row(i: int) -> list[str]:
    return [
        str(1_000_000 + i),
        f"order title {i:08d}",  # 20 characters
        f"2024-05-06 07:{i % 60:02d}:09.{i % 1_000_000:06d}+00",
        f"{i % 100_000}.{i % 100:02d}",
    ]


def _transaction(n: int) -> list[bytes]:
    columns = [
        ("id", INT8, -1, True),
        ("title", TEXT, -1, False),
        ("created_at", TIMESTAMPTZ, -1, False),
        ("amount", NUMERIC, NUMERIC_12_2, False),
    ]
    messages = [
        pg.begin(0x16_B374_D848, 770_000_000_000_000, 4242),
        pg.relation(RELATION_OID, "public", "orders", columns),
    ]
    for i in range(n):
        messages.append(pg.insert(RELATION_OID, _row(i)))
    messages.append(pg.commit(0x16_B374_D848, 0x16_B374_D900, 770_000_000_000_000))
    return messages


def _best_of(repeats: int, run: Callable[[], None]) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def decode_synthetic(n: int) -> dict[str, float]:
    """Time decoding a synthetic transaction of ``n`` Inserts; return the figures."""
    payloads = _transaction(n)
    frames = [pg.xlogdata(i, i, 0, payload) for i, payload in enumerate(payloads)]

    def decode_payloads() -> None:
        decode = PgOutputDecoder(proto_version=1).decode
        for payload in payloads:
            decode(payload)

    def decode_frames() -> None:
        decode = PgOutputDecoder(proto_version=1).decode
        for frame in frames:
            message = parse_copy_data(frame)
            assert isinstance(message, XLogData)
            decode(message.payload)

    def decode_frame_parts() -> None:
        decode = PgOutputDecoder(proto_version=1).decode
        for frame in frames:
            decode(xlogdata_parts(frame)[3])

    messages = len(payloads)
    seconds = _best_of(5, decode_payloads)
    framed_seconds = _best_of(5, decode_frames)
    parts_seconds = _best_of(5, decode_frame_parts)
    return {
        "messages": messages,
        "seconds": seconds,
        "messages_per_s": messages / seconds,
        "us_per_message": seconds / messages * 1e6,
        "framed_us_per_message": framed_seconds / messages * 1e6,
        "parts_us_per_message": parts_seconds / messages * 1e6,
    }


def convert_synthetic(n: int) -> dict[str, float]:
    """Time ``build_table`` over ``n`` buffered rows of the same four columns."""
    specs = [
        ColumnSpec("id", INT8),
        ColumnSpec("title", TEXT),
        ColumnSpec("created_at", TIMESTAMPTZ),
        ColumnSpec("amount", NUMERIC, NUMERIC_12_2),
    ]
    schema = table_schema(specs)
    rows = Rows(
        values=[tuple(v.encode() for v in _row(i)) for i in range(n)],
        ops=list(range(n)),
        kinds=["insert"] * n,
        unchanged=[None] * n,
        runs=[(0x16_B374_D848, 4242, 770_000_000_000_000, n)],
    )
    seconds = _best_of(5, lambda: build_table(schema, specs, rows))
    return {"rows": n, "seconds": seconds, "us_per_row": seconds / n * 1e6}


def main(n: int = 200_000) -> None:
    print("== decode: synthetic Begin/Relation/N x Insert/Commit, 4 columns ==")
    result = decode_synthetic(n)
    print(
        f"decoded {result['messages']:.0f} messages: "
        f"{result['messages_per_s']:,.0f} messages/s, "
        f"{result['us_per_message']:.3f} us/message "
        f"(with XLogData framing: {result['framed_us_per_message']:.3f} us/message through "
        f"parse_copy_data, {result['parts_us_per_message']:.3f} through xlogdata_parts)"
    )
    converted = convert_synthetic(n)
    print(
        f"converted {converted['rows']:.0f} rows to an Arrow batch (build_table): "
        f"{converted['rows'] / converted['seconds']:,.0f} rows/s, "
        f"{converted['us_per_row']:.3f} us/row"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200_000)
