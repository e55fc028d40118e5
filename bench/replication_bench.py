"""Receive and decode throughput against pg_recvlogical, on the same WAL, in one run.

A table gets ``rows`` inserts in transactions of ``txn_rows``. Before the workload a
pgoutput slot is created; afterwards it is copied (``pg_copy_logical_replication_slot``)
once per reader, so every reader starts at the same position and stops at the same
end LSN. Readers:

* ``pg_recvlogical`` writing to /dev/null (the reference: bounded by the walsender);
* tidemark's ``ReplicationClient`` receiving raw XLogData into its queue;
* tidemark's ``PgOutputDecoder`` decoding the payloads that client received.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from dataclasses import dataclass

import psycopg

from tidemark.demo.postgres import EmbeddedPostgres
from tidemark.lsn import Lsn
from tidemark.pgoutput.decoder import PgOutputDecoder
from tidemark.replication.client import ReplicationClient, SourceConfig
from tidemark.replication.protocol import KeepaliveMark, WalBatch


@dataclass
class Workload:
    pg: EmbeddedPostgres
    dsn: str
    end_lsn: int
    rows: int
    slot_index: int = 0

    def copy_slot(self) -> str:
        self.slot_index += 1
        name = f"bench_copy_{self.slot_index}"
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("select pg_copy_logical_replication_slot('bench_base', %s)", (name,))
        return name


def prepare(pg: EmbeddedPostgres, rows: int, txn_rows: int = 10_000) -> Workload:
    dsn = pg.dsn()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "create table if not exists bench_items (id bigint primary key, name text,"
            " created timestamptz, amount numeric(12,2))"
        )
        conn.execute("drop publication if exists bench_pub")
        conn.execute("create publication bench_pub for table bench_items")
        conn.execute("select pg_create_logical_replication_slot('bench_base', 'pgoutput')")
        start = 0
        while start < rows:
            n = min(txn_rows, rows - start)
            conn.execute(
                "insert into bench_items select g, 'item-' || g || '-abcdefghij',"
                " '2024-01-01'::timestamptz + g * interval '1 second', g %% 100000 / 100.0"
                " from generate_series(%s::bigint, %s::bigint) g",
                (start + 1, start + n),
            )
            start += n
        end = conn.execute("select pg_current_wal_lsn()::text").fetchone()
        assert end is not None
    return Workload(pg, dsn, int(Lsn.parse(end[0])), rows)


def run_recvlogical(work: Workload) -> float:
    slot = work.copy_slot()
    args = [
        work.pg.bin("pg_recvlogical"),
        "-d",
        work.dsn,
        "--slot",
        slot,
        "--start",
        "-E",
        str(Lsn(work.end_lsn)),
        "-o",
        "proto_version=1",
        "-o",
        "publication_names=bench_pub",
        "-f",
        "/dev/null",
        "--no-loop",
        "-s",
        "10",
    ]
    t0 = time.perf_counter()
    subprocess.run(args, check=True, capture_output=True)
    return time.perf_counter() - t0


async def _receive(work: Workload, proto: int) -> tuple[float, list[bytes], int, int]:
    slot = work.copy_slot()
    cfg = SourceConfig(
        dsn=work.dsn,
        slot=slot,
        publication="bench_pub",
        create_slot=False,
        create_publication=False,
        proto_version=proto,
        queue_batches=256,
    )
    client = ReplicationClient(cfg)
    payloads: list[bytes] = []
    nbytes = 0
    t0 = time.perf_counter()
    task = asyncio.create_task(client.run())
    try:
        while True:
            item = await client.queue.get()
            if isinstance(item, WalBatch):
                payloads.extend(item.payloads)
                nbytes += sum(len(p) for p in item.payloads)
                client.consumed(item)  # (the reader waits once queue_bytes are queued)
                client.feedback.note_durable(item.last_lsn)
                if item.last_lsn >= work.end_lsn:
                    break
            elif isinstance(item, KeepaliveMark) and item.wal_end >= work.end_lsn:
                break
        elapsed = time.perf_counter() - t0
    finally:
        await client.stop()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
    return elapsed, payloads, nbytes, client.stats.messages_received


def run_tidemark_receive(work: Workload, proto: int = 1) -> tuple[float, list[bytes], int, int]:
    return asyncio.run(_receive(work, proto))


def run_decode(payloads: list[bytes], proto: int = 1) -> tuple[float, int]:
    decoder = PgOutputDecoder(proto)
    decode = decoder.decode
    rows = 0
    t0 = time.perf_counter()
    for p in payloads:
        if p[0] == 0x49:  # 'I'
            rows += 1
        decode(p)
    return time.perf_counter() - t0, rows


def main(rows: int = 1_000_000) -> dict[str, float]:
    print(f"== replication: receive and decode, {rows:,} inserts (PostgreSQL 16, embedded) ==")
    with EmbeddedPostgres() as pg:
        t0 = time.perf_counter()
        work = prepare(pg, rows)
        print(f"workload written in {time.perf_counter() - t0:.1f}s, end LSN {Lsn(work.end_lsn)}")
        rl = min(run_recvlogical(work) for _ in range(2))
        rx_runs = [run_tidemark_receive(work) for _ in range(2)]
        rx, payloads, nbytes, messages = min(rx_runs, key=lambda r: r[0])
        dec, decoded_rows = min((run_decode(payloads) for _ in range(3)), key=lambda r: r[0])
    assert decoded_rows == rows, f"decoded {decoded_rows} inserts, expected {rows}"
    out = {
        "recvlogical_s": rl,
        "recvlogical_rows_per_s": rows / rl,
        "receive_s": rx,
        "receive_rows_per_s": rows / rx,
        "receive_mb_per_s": nbytes / rx / 1e6,
        "receive_msgs_per_s": messages / rx,
        "receive_vs_recvlogical": rl / rx,
        "decode_s": dec,
        "decode_msgs_per_s": len(payloads) / dec,
        "decode_rows_per_s": rows / dec,
        "decode_share_of_receive": dec / rl,
    }
    print(f"pg_recvlogical          {rl:7.2f}s  {rows / rl:>12,.0f} rows/s")
    print(
        f"tidemark receive        {rx:7.2f}s  {rows / rx:>12,.0f} rows/s  "
        f"{nbytes / rx / 1e6:6.1f} MB/s  {messages / rx:>10,.0f} msgs/s  "
        f"= {rl / rx:.2f}x pg_recvlogical (target >= 0.85x)"
    )
    print(
        f"tidemark decode         {dec:7.2f}s  {rows / dec:>12,.0f} rows/s  "
        f"{len(payloads) / dec:>10,.0f} msgs/s  = {100 * dec / rl:.0f}% of the raw receive "
        "time (target <= 20%)"
    )
    return out


if __name__ == "__main__":
    main()
