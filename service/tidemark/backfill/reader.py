"""Reading a shape's rows from one consistent snapshot, in parallel chunks.

``begin_snapshot`` starts a ``REPEATABLE READ READ ONLY`` transaction and takes an
``ACCESS SHARE`` lock on the table, as pg_dump does, before the snapshot exists
(``LOCK`` needs none), on the exporting connection and on each reader connection;
``take_snapshot`` then takes the snapshot (``pg_current_snapshot()``, then
``pg_current_wal_lsn()``) and exports it (``pg_export_snapshot()``), and the
readers import it (``SET TRANSACTION SNAPSHOT``): every chunk sees the same data.
The transactions stay open until every chunk is read.

Every connection takes its lock *before* the snapshot, with a ``lock_timeout``:
a reader asking for its lock later would queue behind a waiting rewrite (``ACCESS
EXCLUSIVE`` requests queue ahead of new shared ones) that itself waits for the
exporter's lock, a deadlock Postgres cannot see (pg_dump -j meets the same). When
a lock is not granted in time, every transaction is rolled back and the caller
tries again: a rewrite that runs, or waits, goes first.

Chunks split the table by physical location (ctid page ranges), which works for
any table, with or without a usable key, and lets Postgres use TID range scans. A
partitioned table is read leaf by leaf (ctids are per partition), all in the one
snapshot; the lock on the root covers its partitions.
Page ranges are only stable while nothing rewrites the table: the lock makes
``VACUUM FULL``, ``CLUSTER``, pg_repack or a rewriting ``ALTER TABLE`` wait until
the last chunk is read (and a rewrite already running finishes before the
snapshot is taken). Plain ``VACUUM`` only removes rows no snapshot of ours sees.
Each chunk is ``COPY (SELECT <columns> FROM <table> WHERE <predicate> AND <ctid
range>) TO STDOUT (FORMAT csv)`` parsed by Arrow's CSV reader into text columns,
which ``tidemark.pgoutput.values.to_arrow`` types exactly as it types the stream.
The parallel readers receive the COPY with asyncpg (``CopyReader``), whose protocol
code gathers Postgres's one-message-per-row stream into large buffers without a
Python step per row (1M rows: 0.30-0.36 s of CPU in our process against 0.69-0.79 s
with psycopg's blocking copy, which was the cheapest psycopg way); a DSN with
connection parameters asyncpg does not implement keeps psycopg (``ThreadedReader``).

The query is built from the validated shape: identifiers quoted, the predicate
regenerated from its sqlglot tree (``predicate_sql``), never the user's string;
the transaction is read-only. A shape definition cannot run arbitrary SQL.
Session settings match the replication connection's, so values have the same text.
"""

from __future__ import annotations

import asyncio
import io
import os
import shlex
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import asyncpg
import psycopg
import pyarrow as pa
import pyarrow.csv as pacsv
from psycopg import sql
from psycopg.pq import TransactionStatus

from tidemark.continuity.fence import SnapshotFence
from tidemark.lsn import Lsn
from tidemark.predicates.compiler import predicate_sql
from tidemark.predicates.identifiers import quote_identifier
from tidemark.replication.catalog import read_tree, session_options
from tidemark.replication.slot import SOURCE_WAL_LSN
from tidemark.shapes.model import BoundShape
from tidemark.shapes.partitions import Member, leaves

PAGES_PER_CHUNK = 2048  # 16 MiB of heap per chunk at the default 8 KiB block size


@dataclass(frozen=True, slots=True)
class Snapshot:
    fence: SnapshotFence
    snapshot_id: str  # pg_export_snapshot()
    relpages: int
    estimated_rows: int
    # a partitioned table's members as the snapshot sees them (its leaves are read)
    partitions: tuple[Member, ...] = ()
    partitioned: bool = False
    columns: tuple[str, ...] = ()  # the table's, as the stream describes them


@dataclass(frozen=True, slots=True)
class Chunk:
    first_page: int
    end_page: int | None  # None: to the end of the table (pages added since)
    table: tuple[str, str] | None = None  # the leaf partition read (None: the table)


LOCK_TIMEOUT_S = 5.0


async def begin_snapshot(conn: Reader, shape: BoundShape) -> None:
    """Begin a snapshot transaction on ``conn`` and lock the table against rewrites;
    no snapshot is taken yet. Raises ``psycopg.errors.LockNotAvailable`` when the lock
    is not granted within ``LOCK_TIMEOUT_S`` (the transaction is rolled back)."""
    rel = shape.relation
    # one round trip (statements without parameters go as one simple query; at 1000 new
    # shapes every backfill begins a snapshot): a refused lock skips the rest
    try:
        await conn.execute(
            sql.SQL(
                "begin isolation level repeatable read read only;"
                " set local lock_timeout = {timeout};"
                " lock table {schema}.{table} in access share mode;"
                " set local lock_timeout = 0"
            ).format(
                timeout=sql.Literal(f"{int(LOCK_TIMEOUT_S * 1000)}ms"),
                schema=sql.SQL(quote_identifier(rel.namespace)),
                table=sql.SQL(quote_identifier(rel.name)),
            )
        )
    except psycopg.errors.LockNotAvailable:
        await conn.execute("rollback")
        raise


async def heap_bytes(conn: psycopg.AsyncConnection[tuple[object, ...]], oid: int) -> int:
    """The table's heap size now (a partitioned table: all its partitions')."""
    # pg_partition_tree lists nothing for a table that is not partitioned
    cur = await conn.execute(
        "select greatest(pg_relation_size(%s::oid::regclass), coalesce((select"
        " sum(pg_relation_size(relid)) from pg_partition_tree(%s::oid::regclass)), 0))::bigint",
        (oid, oid),
    )
    row = await cur.fetchone()
    return int(row[0]) if row else 0  # type: ignore[call-overload]


async def connect_reader(dsn: str) -> psycopg.AsyncConnection[tuple[object, ...]]:
    return await psycopg.AsyncConnection.connect(dsn, autocommit=True, options=session_options(dsn))


class SnapshotConnections:
    """Snapshot connections kept between backfills while more are queued: a new
    connection costs a backend process and, with SCRAM, an authentication whose key
    derivation runs in our process holding the GIL (~3.6 ms each; at 1000 new shapes,
    1000 connections). A connection is given back only by a backfill that ended its
    transaction normally, is kept only while ``wanted()`` says more backfills wait,
    and is checked with a round trip before it is used again (a server restart
    since leaves it broken: then a new one is made)."""

    def __init__(self, dsn: str, keep: int, wanted: Callable[[], bool]) -> None:
        self.dsn = dsn
        self.keep = keep
        self.wanted = wanted
        self._idle: list[psycopg.AsyncConnection[tuple[object, ...]]] = []
        self._closed = False
        self.made = 0  # connections opened (tests, logs)

    async def take(self) -> psycopg.AsyncConnection[tuple[object, ...]]:
        while self._idle:
            conn = self._idle.pop()
            try:
                await conn.execute("select")
                return conn
            except psycopg.Error:
                await conn.close()
        self.made += 1
        return await connect_reader(self.dsn)

    async def give_back(self, conn: psycopg.AsyncConnection[tuple[object, ...]]) -> None:
        idle = not conn.closed and conn.info.transaction_status == TransactionStatus.IDLE
        if idle and not self._closed and len(self._idle) < self.keep and self.wanted():
            self._idle.append(conn)
        else:
            await conn.close()

    async def close(self) -> None:
        """Close the idle connections; one given back later is closed then."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.close()


class ThreadedReader:
    """A reader connection whose work runs in a worker thread, for the chunks of a
    table bigger than one: Postgres sends a ``COPY``'s rows one message each, and
    psycopg's blocking copy takes about half the time per message of the async one
    (200k rows: 0.12 s against 0.26 s), which was most of a chunk's reading.

    One statement at a time; ``close`` first cancels and waits for a statement still
    running (a connection must not be closed under the thread using it)."""

    def __init__(self, conn: psycopg.Connection[tuple[object, ...]]) -> None:
        self.conn = conn
        self._running: asyncio.Future[object] | None = None

    @classmethod
    async def connect(cls, dsn: str) -> ThreadedReader:
        def connect() -> psycopg.Connection[tuple[object, ...]]:
            return psycopg.Connection.connect(dsn, autocommit=True, options=session_options(dsn))

        return cls(await asyncio.to_thread(connect))

    async def _run(self, call: Callable[[], object]) -> object:
        assert self._running is None or self._running.done(), "one statement at a time"
        self._running = asyncio.ensure_future(asyncio.to_thread(call))
        # shielded: a cancelled caller leaves the thread to finish (close waits for it)
        return await asyncio.shield(self._running)

    async def execute(self, query: str | sql.Composed) -> None:
        await self._run(lambda: self.conn.execute(query))

    async def read_chunk(self, shape: BoundShape, chunk: Chunk) -> pa.Table:
        query = copy_query(shape, chunk)
        names = [c.name for c in shape.output_columns]

        def read() -> pa.Table:
            buffer = io.BytesIO()
            with self.conn.cursor() as cur, cur.copy(query) as copy:
                for data in copy:
                    buffer.write(data)
            return parse_csv(buffer.getvalue(), names)

        table = await self._run(read)
        assert isinstance(table, pa.Table)
        return table

    async def close(self) -> None:
        running = self._running
        if running is not None and not running.done():
            await asyncio.to_thread(self.conn.cancel_safe)
            await asyncio.wait({running})
        await asyncio.to_thread(self.conn.close)


# libpq connection parameters asyncpg implements alike (its DSN parser reads them
# from a URL's query); any other (keepalives, hostaddr, gssencmode, ...) keeps psycopg
_ASYNCPG_PARAMS = frozenset(
    {
        "host",
        "port",
        "dbname",
        "user",
        "password",
        "passfile",
        "service",
        "sslmode",
        "sslcert",
        "sslkey",
        "sslrootcert",
        "sslcrl",
        "sslpassword",
        "sslnegotiation",
        "ssl_min_protocol_version",
        "ssl_max_protocol_version",
        "target_session_attrs",
        "krbsrvname",
        "gsslib",
    }
)

# libpq's environment variables for connection parameters asyncpg does not read: when
# one is set, psycopg (libpq) connects, so that both kinds of readers connect alike
_LIBPQ_ONLY_ENV = (
    "PGOPTIONS",
    "PGAPPNAME",
    "PGHOSTADDR",
    "PGCONNECT_TIMEOUT",
    "PGCLIENTENCODING",
    "PGSERVICE",
    "PGGSSENCMODE",
    "PGGSSDELEGATION",
    "PGREQUIRESSL",
    "PGREQUIREAUTH",
    "PGREQUIREPEER",
    "PGCHANNELBINDING",
    "PGLOADBALANCEHOSTS",
    "PGSSLCERTMODE",
)


def asyncpg_target(dsn: str) -> tuple[str, dict[str, str], float | None] | None:
    """``dsn`` (a libpq conninfo or URL) as asyncpg's connect arguments: a URL, the
    server settings (the DSN's ``-c`` options, ``application_name`` and our session
    settings) and the connect timeout; None when the DSN uses a parameter asyncpg
    does not implement, or ``options`` other than ``-c name=value``."""
    from psycopg.conninfo import conninfo_to_dict

    if any(os.environ.get(name) for name in _LIBPQ_ONLY_ENV):
        return None
    params = {k: str(v) for k, v in conninfo_to_dict(dsn).items() if v is not None}
    params.pop("options", None)  # in session_options, ahead of ours
    settings: dict[str, str] = {}
    words = shlex.split(session_options(dsn))
    while words:
        word = words.pop(0)
        if word == "-c" and words:
            word = words.pop(0)
        elif word.startswith(("-c", "--")):
            word = word[2:]
        else:
            return None
        name, equals, value = word.partition("=")
        if not equals:
            return None
        settings[name.replace("-", "_")] = value
    fallback = params.pop("fallback_application_name", "")
    app = params.pop("application_name", "") or fallback
    if app:
        settings["application_name"] = app
    timeout = params.pop("connect_timeout", "")
    if not set(params) <= _ASYNCPG_PARAMS:
        return None
    url = "postgresql://" + ("?" + urllib.parse.urlencode(params) if params else "")
    return url, settings, float(timeout) if timeout and float(timeout) > 0 else None


class CopyReader:
    """A reader connection made with asyncpg, for the chunks of a table bigger than
    one: Postgres sends a ``COPY``'s rows one message each, and asyncpg's protocol
    code hands them over in large buffers, with no Python step per row.

    One statement at a time; errors keep psycopg's classes where the runner tells
    them apart (a lock not granted in time). ``close`` ends the connection at once
    when a statement was interrupted (its transaction only reads)."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self._interrupted = False

    @classmethod
    async def connect(cls, target: tuple[str, dict[str, str], float | None]) -> CopyReader:
        url, settings, timeout = target
        kwargs: dict[str, object] = {"server_settings": settings, "statement_cache_size": 0}
        if timeout is not None:
            kwargs["timeout"] = timeout
        return cls(await asyncpg.connect(url, **kwargs))

    async def execute(self, query: str | sql.Composed) -> None:
        text = query if isinstance(query, str) else query.as_string(None)
        try:
            await self.conn.execute(text)
        except asyncpg.exceptions.LockNotAvailableError as exc:
            raise psycopg.errors.LockNotAvailable(str(exc)) from exc
        except BaseException:
            self._interrupted = True
            raise

    async def read_chunk(self, shape: BoundShape, chunk: Chunk) -> pa.Table:
        parts: list[bytes] = []

        async def gather(data: bytes) -> None:
            parts.append(data)

        try:
            await self.conn.copy_from_query(
                snapshot_query(shape, chunk).as_string(None), output=gather, format="csv"
            )
        except BaseException:
            self._interrupted = True
            raise
        data = b"".join(parts)
        parts.clear()
        # parsed in a thread (Arrow releases the GIL): the other readers' COPY goes on
        return await asyncio.to_thread(parse_csv, data, [c.name for c in shape.output_columns])

    async def close(self) -> None:
        if self._interrupted or self.conn.is_closed():
            self.conn.terminate()
            return
        try:
            await self.conn.close(timeout=5)
        except Exception:
            self.conn.terminate()


async def connect_parallel_reader(dsn: str) -> CopyReader | ThreadedReader:
    """A reader connection for one of a large table's parallel readers."""
    target = asyncpg_target(dsn)
    if target is None:
        return await ThreadedReader.connect(dsn)
    return await CopyReader.connect(target)


Reader = psycopg.AsyncConnection[tuple[object, ...]] | ThreadedReader | CopyReader


async def import_snapshot(conn: Reader, snapshot_id: str) -> None:
    """Make the transaction ``begin_snapshot`` opened on ``conn`` see ``snapshot_id``."""
    await conn.execute(sql.SQL("set transaction snapshot {}").format(sql.Literal(snapshot_id)))


async def take_snapshot(
    conn: psycopg.AsyncConnection[tuple[object, ...]], shape: BoundShape
) -> Snapshot:
    """The snapshot of the transaction ``begin_snapshot`` opened (kept open by the
    caller until the chunks are read), with the table's size and its columns as the
    stream describes them (no dropped or generated ones, in order) as that transaction
    sees the catalog: one round trip (the consumer waits while it runs)."""
    rel = shape.relation
    row = await (
        await conn.execute(
            f"select pg_current_snapshot()::text, {SOURCE_WAL_LSN}::text, pg_export_snapshot(),"
            " s.pages, s.tuples, s.relkind, array(select attname::text from pg_attribute"
            " where attrelid = %s and attnum > 0 and not attisdropped and attgenerated = ''"
            " order by attnum)"
            " from (values (1)) one left join lateral ("
            " select (pg_relation_size(c.oid) / current_setting('block_size')::int)::bigint"
            " as pages, greatest(c.reltuples, 0)::bigint as tuples, c.relkind from pg_class c"
            " join pg_namespace n on n.oid = c.relnamespace"
            " where n.nspname = %s and c.relname = %s) s on true",
            (rel.oid, rel.namespace, rel.name),
        )
    ).fetchone()
    assert row is not None
    fence = SnapshotFence.parse(str(row[0]), int(Lsn.parse(str(row[1]))))
    columns = tuple(str(c) for c in row[6])  # type: ignore[attr-defined]
    found = row[5] is not None
    relpages, reltuples = (int(str(row[3])), int(str(row[4]))) if found else (0, 0)
    if not found or row[5] != "p":
        return Snapshot(fence, str(row[2]), relpages, reltuples, columns=columns)
    members = tuple(await read_tree(conn, rel.oid))
    return Snapshot(
        fence,
        str(row[2]),
        sum(m.relpages for m in leaves(members)),
        sum(m.reltuples for m in leaves(members)),
        members,
        partitioned=True,
        columns=columns,
    )


def plan_chunks(
    relpages: int, pages_per_chunk: int = PAGES_PER_CHUNK, table: tuple[str, str] | None = None
) -> list[Chunk]:
    """Page ranges covering the table; the last one is open-ended."""
    starts = list(range(0, max(relpages, 1), pages_per_chunk))
    return [Chunk(a, b, table) for a, b in zip(starts, [*starts[1:], None], strict=True)]


def plan_snapshot_chunks(snapshot: Snapshot, pages_per_chunk: int = PAGES_PER_CHUNK) -> list[Chunk]:
    """The snapshot's chunks: page ranges of the table, or of each leaf partition of a
    partitioned table (ctids are per partition)."""
    if not snapshot.partitioned:
        return plan_chunks(snapshot.relpages, pages_per_chunk)
    return [
        chunk
        for leaf in leaves(snapshot.partitions)
        for chunk in plan_chunks(leaf.relpages, pages_per_chunk, (leaf.schema, leaf.name))
    ]


def snapshot_query(shape: BoundShape, chunk: Chunk) -> sql.Composed:
    """The chunk's SELECT: quoted identifiers, the validated predicate, a ctid range."""
    rel = shape.relation
    columns = sql.SQL(", ").join(
        sql.SQL(quote_identifier(c.name)) if c.name in _present(shape) else sql.SQL("NULL")
        for c in shape.output_columns
    )
    conditions = [sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({chunk.first_page},0)"))]
    if chunk.end_page is not None:
        conditions.append(sql.SQL("ctid < {}::tid").format(sql.Literal(f"({chunk.end_page},0)")))
    if shape.predicate is not None:
        conditions.append(sql.SQL("({})").format(sql.SQL(predicate_sql(shape.predicate))))
    schema, name = chunk.table or (rel.namespace, rel.name)
    # ONLY: a table's legacy inheritance children are not part of its stream
    return sql.SQL("select {} from only {}.{} where {}").format(
        columns,
        sql.SQL(quote_identifier(schema)),
        sql.SQL(quote_identifier(name)),
        sql.SQL(" and ").join(conditions),
    )


def _present(shape: BoundShape) -> set[str]:
    return {c.name for c in shape.relation.columns}


def copy_query(shape: BoundShape, chunk: Chunk) -> sql.Composed:
    return sql.SQL("copy ({}) to stdout (format csv)").format(snapshot_query(shape, chunk))


async def read_chunk(conn: Reader, shape: BoundShape, chunk: Chunk) -> pa.Table:
    """The chunk's rows, read on a reader connection inside its snapshot transaction,
    as a table of text columns (output column names)."""
    if isinstance(conn, ThreadedReader | CopyReader):
        return await conn.read_chunk(shape, chunk)
    buffer = io.BytesIO()
    query = copy_query(shape, chunk)
    async with conn.cursor() as cur, cur.copy(query) as copy:
        async for data in copy:
            buffer.write(data)
    # parsed in a thread (Arrow releases the GIL): the other readers' COPY goes on
    return await asyncio.to_thread(
        parse_csv, buffer.getvalue(), [c.name for c in shape.output_columns]
    )


def parse_csv(data: bytes, names: Sequence[str]) -> pa.Table:
    """COPY CSV into string columns: unquoted empty is NULL, quoted empty is ''."""
    names = list(names)
    if not data:
        return pa.table({n: pa.array([], pa.string()) for n in names})
    return pacsv.read_csv(
        io.BytesIO(data),
        read_options=pacsv.ReadOptions(column_names=names, block_size=1 << 24),
        parse_options=pacsv.ParseOptions(newlines_in_values=True),
        convert_options=pacsv.ConvertOptions(
            column_types=dict.fromkeys(names, pa.string()),
            strings_can_be_null=True,
            null_values=[""],
            quoted_strings_can_be_null=False,
        ),
    )
