"""``tidemark demo`` (``make demo``): the whole product on embedded defaults.

1. Start a throwaway PostgreSQL 16 (the ``pgserver`` wheel) and create a small
   schema: customers and orders (orders with REPLICA IDENTITY FULL, since shapes
   filter on non-key columns).
2. Declare shapes: ``orders_eu`` (a ``where``), ``order_status`` (``columns``),
   ``big_orders`` (a range predicate) and ``customers``.
3. Run the service (Spark local mode, tables under ``./demo-data``) while a
   workload inserts, updates (moving orders in and out of the predicates) and
   deletes in small transactions; print the acknowledged LSN, each shape's
   frontier and the rows written to its table (its backfill's snapshot plus the
   changes since) every few seconds.
4. After ``--duration`` seconds or Ctrl-C: stop the workload, wait until every
   shape's frontier passes the last write, stop the service cleanly, and show that
   each shape's folded table equals the matching query on Postgres.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from collections.abc import Collection
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg

from tidemark.demo.verify import Comparison, compare_shape
from tidemark.lsn import Lsn, format_lsn

SCHEMA = """
create table customers (id int primary key, name text not null, country text not null);
create table orders (
    id bigint primary key, customer_id int not null, region text not null,
    status text not null, total numeric(10,2) not null, note text,
    created_at timestamptz not null default now());
alter table orders replica identity full;
"""

SHAPES = [
    {"name": "orders_eu", "table": "public.orders", "where": "region = 'eu'"},
    {"name": "order_status", "table": "public.orders", "columns": ["status", "total"]},
    {
        "name": "big_orders",
        "table": "public.orders",
        "where": "total >= 500 AND status <> 'cancelled'",
    },
    {"name": "customers", "table": "public.customers"},
]

# what each shape must equal on Postgres (primary key first, then the shape's columns)
TRUTH = {
    "orders_eu": "select id, customer_id, region, status, total, note, created_at from orders "
    "where region = 'eu'",
    "order_status": "select id, status, total from orders",
    "big_orders": "select id, customer_id, region, status, total, note, created_at from orders "
    "where total >= 500 and status <> 'cancelled'",
    "customers": "select id, name, country from customers",
}

REGIONS = ("eu", "us", "apac")
STATUSES = ("new", "paid", "shipped", "cancelled")


async def workload(dsn: str, stop: asyncio.Event, stats: dict[str, int]) -> None:
    rng = random.Random(7)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for i in range(1, 51):
            await conn.execute(
                "insert into customers values (%s, %s, %s)",
                (i, f"customer {i}", rng.choice(["DE", "FR", "US", "JP"])),
            )
        next_id = 1
        while not stop.is_set():
            async with conn.transaction():
                for _ in range(rng.randint(1, 20)):
                    roll = rng.random()
                    if roll < 0.55 or next_id < 20:
                        await conn.execute(
                            "insert into orders (id, customer_id, region, status, total, note)"
                            " values (%s, %s, %s, 'new', %s, %s)",
                            (
                                next_id,
                                rng.randint(1, 50),
                                rng.choice(REGIONS),
                                Decimal(rng.randint(100, 99_999)) / 100,
                                "note " * rng.randint(0, 400),
                            ),
                        )
                        next_id += 1
                        stats["inserts"] += 1
                    elif roll < 0.85:
                        await conn.execute(
                            "update orders set status = %s, region = %s,"
                            " total = total + %s where id = %s",
                            (
                                rng.choice(STATUSES),
                                rng.choice(REGIONS),
                                Decimal(rng.randint(-5000, 5000)) / 100,
                                rng.randint(1, next_id),
                            ),
                        )
                        stats["updates"] += 1
                    else:
                        await conn.execute(
                            "delete from orders where id = %s", (rng.randint(1, next_id),)
                        )
                        stats["deletes"] += 1
            stats["transactions"] += 1
            await asyncio.sleep(0.02)


def compare(
    spark: Any, root: str, dsn: str, shapes: Collection[str] | None = None
) -> list[Comparison]:
    """The demo's shapes (those of ``shapes`` when given) compared with Postgres."""
    return [
        compare_shape(spark, root, shape, query, dsn)
        for shape, query in TRUTH.items()
        if shapes is None or shape in shapes
    ]


def run_demo(
    duration_s: float = 45.0,
    data_dir: str = "./demo-data",
    port: int = 8765,
    table_format: str = "delta",
) -> int:
    from tidemark.demo.postgres import EmbeddedPostgres
    from tidemark.observability import configure_logging
    from tidemark.settings.config import Settings
    from tidemark.spark import build_session

    configure_logging("console", "warning")
    root = str(Path(data_dir).resolve())
    print(f"tidemark demo: {table_format} tables under {root}")
    print("starting Spark (local[2]) and an embedded PostgreSQL 16 ...")
    spark = build_session("local[2]", app_name="tidemark-demo")
    with EmbeddedPostgres() as pg:
        dsn = pg.dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(SCHEMA)
        import shutil

        shutil.rmtree(root, ignore_errors=True)
        settings = Settings.model_validate(
            {
                "source": {"dsn": dsn, "slot": "tidemark_demo", "publication": "tidemark_demo"},
                "sink": {"root": root, "format": table_format},
                "http": {"port": port},
                "flush": {"max_age_s": 1.0},
                "shapes": SHAPES,
            }
        )
        ok, left = asyncio.run(_run(settings, spark, dsn, duration_s))
        print("\nchecking every shape's folded table against Postgres ...")
        results = compare(spark, root, dsn, left)
    if not results:  # every demo shape was removed over the API meanwhile
        print("  no demo shape is left to compare (they were removed while it ran).")
        return 0 if ok else 1
    width = max(len(r.shape) for r in results)
    for r in results:
        mark = "equal" if r.equal else "DIFFERENT"
        print(
            f"  {r.shape.ljust(width)}  postgres {r.expected_rows:>6} rows   "
            f"lake {r.got_rows:>6} rows   {mark}"
        )
        if not r.equal:
            print("    " + r.describe())
    all_equal = ok and all(r.equal for r in results)
    print("\nevery shape equals Postgres." if all_equal else "\nMISMATCH: see above.")
    print(f"read them again with: tidemark read <shape> --root {root}")
    return 0 if all_equal else 1


async def _run(settings: Any, spark: Any, dsn: str, duration_s: float) -> tuple[bool, set[str]]:
    """Run the service and the workload; then whether every shape reached the source's
    last LSN, and the shapes it still has (the API can remove some meanwhile)."""
    from tidemark.app import Service

    service = Service(settings, spark=spark)
    task = asyncio.create_task(service.run())
    while service.phase != "streaming" or service.http_port is None:  # both are printed
        if task.done():
            task.result()
        await asyncio.sleep(0.1)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # ours now: drain and verify, then stop
        loop.add_signal_handler(sig, stop.set)
    print(
        f"streaming; HTTP API on http://127.0.0.1:{service.http_port} "
        f"({'Ctrl-C to stop' if not duration_s else f'{duration_s:.0f}s, Ctrl-C to stop early'})"
    )
    print(f"status page: http://127.0.0.1:{service.http_port}/ (open it in a browser)")
    stats = {"inserts": 0, "updates": 0, "deletes": 0, "transactions": 0}
    writer = asyncio.create_task(workload(dsn, stop, stats))
    started = time.monotonic()
    while not stop.is_set():
        await asyncio.sleep(3)
        _print_progress(service, stats, time.monotonic() - started)
        if duration_s and time.monotonic() - started >= duration_s:
            stop.set()
        if task.done():
            task.result()
    await writer
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        row = await (await conn.execute("select pg_current_wal_lsn()::text")).fetchone()
    target = int(Lsn.parse(row[0]))  # type: ignore[index]
    print(f"\nworkload stopped; waiting for every shape to reach {format_lsn(target)} ...")
    deadline = time.monotonic() + 120
    reached = False
    while time.monotonic() < deadline:
        frontiers = service.progress().frontiers  # shapes still backfilling have none
        if all(frontiers.get(n, -1) >= target for n in service.shapes):
            reached = True  # (also when no shape is left: nothing to wait for)
            break
        await asyncio.sleep(0.2)
    _print_progress(service, stats, time.monotonic() - started)
    left = set(service.shapes)
    service.request_stop()
    await task
    return reached, left


def _print_progress(service: Any, stats: dict[str, int], elapsed: float) -> None:
    """One line: transactions, the acknowledged LSN, and per shape its frontier and the
    rows written to its table (its backfill's snapshot plus changes since)."""
    from tidemark.api.shape_view import shape_json

    p = service.progress()
    parts = []
    for name in sorted(service.shapes):
        shape = shape_json(service, name)
        if shape["state"] == "backfilling":
            backfill = shape["backfill"] or {}
            parts.append(f"{name} backfilling ({backfill.get('rows_done', 0):,} rows so far)")
            continue
        rows = (shape["rows_backfilled"] or 0) + shape["rows_committed"]
        frontier = shape["frontier"]["lsn"] if shape["frontier"] else "-"
        parts.append(f"{name} {frontier} {rows:,} rows")
    print(
        f"[{elapsed:5.0f}s] txns {stats['transactions']:>6}  acked {format_lsn(p.flushed_lsn)}  "
        + "  ".join(parts)
    )
