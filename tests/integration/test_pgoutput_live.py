"""Real pgoutput bytes from a live server, captured through the SQL interface of a
logical slot, decoded in full: every message kind the server produces for
ordinary, TOAST, truncate, streamed (large) and two-phase transactions."""

from __future__ import annotations

from collections import Counter

import psycopg
import pytest

from tidemark.pgoutput import messages as m
from tidemark.pgoutput.decoder import PgOutputDecoder
from tidemark.pgoutput.values import python_parser

from .conftest import PgDatabase


def peek(conn: psycopg.Connection, slot: str, proto: int, streaming: bool) -> list[bytes]:
    opts = ["proto_version", str(proto), "publication_names", "pub", "messages", "true"]
    if streaming:
        opts += ["streaming", "true"]
    rows = conn.execute(
        "select data from pg_logical_slot_peek_binary_changes(%s, null, null, "
        + ", ".join(["%s"] * len(opts))
        + ")",
        [slot, *opts],
    ).fetchall()
    return [bytes(r[0]) for r in rows]


def workload(conn: psycopg.Connection) -> None:
    conn.execute("insert into t values (1, 'one', 1.5, '{a,b}'), (2, 'two', null, null)")
    conn.execute("update t set note = 'uno' where id = 1")  # no old tuple (key unchanged)
    conn.execute("update t set id = 10 where id = 2")  # old key sent (K)
    conn.execute("delete from t where id = 10")
    conn.execute("insert into f values (1, repeat('big', 20000), 'x')")  # TOASTed
    conn.execute("update f set small = 'y' where id = 1")  # big unchanged: 'u' or full 'O'
    conn.execute("select pg_logical_emit_message(true, 'tm', 'in-txn')")
    conn.execute("select pg_logical_emit_message(false, 'tm', 'outside')")
    conn.execute("truncate t, f")
    with conn.transaction():  # large: streamed when streaming is on
        conn.execute(
            "insert into t select g, repeat('l', 100), g, null from generate_series(100, 3100) g"
        )


@pytest.mark.parametrize("proto", [1, 2, 3, 4])
def test_live_pgoutput_bytes_decode_completely(pg_db: PgDatabase, proto: int) -> None:
    if proto == 4 and pg_db.server.version < 16:
        pytest.skip("protocol v4 needs PostgreSQL 16 (this server covers v1-v3)")
    streaming = proto >= 2
    with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
        conn.execute("create table t (id int primary key, note text, x numeric, tags text[])")
        conn.execute("create table f (id int primary key, big text, small text)")
        conn.execute("alter table f replica identity full")
        conn.execute("create publication pub for table t, f")
        conn.execute("select pg_create_logical_replication_slot('cap', 'pgoutput')")
        workload(conn)
        conn.execute("set logical_decoding_work_mem = '64kB'")
        payloads = peek(conn, "cap", proto, streaming)

    decoder = PgOutputDecoder(proto)
    decoded = [decoder.decode(p) for p in payloads]
    kinds = Counter(type(msg).__name__ for msg in decoded)

    # every kind of message the workload produces arrived and decoded
    assert kinds["Relation"] >= 2 and kinds["Insert"] >= 3003 and kinds["Delete"] == 1
    assert kinds["Update"] == 3 and kinds["Truncate"] == 1 and kinds["LogicalMessage"] == 2
    if streaming:
        assert kinds["StreamStart"] >= 1 and kinds["StreamStop"] >= 1
        assert kinds["StreamCommit"] == 1
        streamed = [x for x in decoded if isinstance(x, m.Insert) and x.xid is not None]
        assert len(streamed) == 3001
    else:
        assert "StreamStart" not in kinds
    assert kinds["Begin"] == kinds["Commit"]

    # and the values are exactly what Postgres holds
    rels = {x.oid: x for x in decoded if isinstance(x, m.Relation)}
    first = next(x for x in decoded if isinstance(x, m.Insert))
    rel = rels[first.relation_oid]
    assert [c.name for c in rel.columns] == ["id", "note", "x", "tags"]
    assert [c.is_key for c in rel.columns] == [True, False, False, False]
    parsed = [
        python_parser(c.type_oid, c.type_modifier)(v)
        for c, v in zip(rel.columns, first.new, strict=True)
    ]
    assert parsed[:2] == [1, "one"] and str(parsed[2]) == "1.5" and parsed[3] == ["a", "b"]
    updates = [x for x in decoded if isinstance(x, m.Update)]
    assert updates[0].old is None and updates[1].old_kind == "K"
    assert updates[1].old == (b"2", None, None, None)
    toast = updates[2]
    assert toast.old_kind == "O" and toast.new[2] == b"y"
    # with REPLICA IDENTITY FULL the old row carries the big value; new has it unchanged
    assert toast.new[1] is m.UNCHANGED_TOAST or toast.new[1] == b"big" * 20000
    assert toast.old is not None and toast.old[1] == b"big" * 20000
    trunc = next(x for x in decoded if isinstance(x, m.Truncate))
    assert len(trunc.relation_oids) == 2
    msgs = [x for x in decoded if isinstance(x, m.LogicalMessage)]
    assert {(x.transactional, x.prefix, x.content) for x in msgs} == {
        (True, "tm", b"in-txn"),
        (False, "tm", b"outside"),
    }


def test_live_two_phase_messages_decode(pg_db: PgDatabase) -> None:
    with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
        if int(conn.execute("show max_prepared_transactions").fetchone()[0]) == 0:
            pytest.skip("server has max_prepared_transactions = 0")
        conn.execute("create table t (id int primary key)")
        conn.execute("create publication pub for table t")
        conn.execute("select pg_create_logical_replication_slot('cap2', 'pgoutput', false, true)")
        conn.execute("begin; insert into t values (1); prepare transaction 'g1'")
        conn.execute("commit prepared 'g1'")
        conn.execute("begin; insert into t values (2); prepare transaction 'g2'")
        conn.execute("rollback prepared 'g2'")
        rows = conn.execute(
            "select data from pg_logical_slot_peek_binary_changes('cap2', null, null,"
            " 'proto_version', '3', 'publication_names', 'pub', 'two_phase', 'on')"
        ).fetchall()
    decoder = PgOutputDecoder(3)
    decoded = [decoder.decode(bytes(r[0])) for r in rows]
    kinds = [type(x).__name__ for x in decoded]
    assert kinds.count("BeginPrepare") == 2 and kinds.count("Prepare") == 2
    assert kinds.count("CommitPrepared") == 1 and kinds.count("RollbackPrepared") == 1
    gids = {x.gid for x in decoded if isinstance(x, m.CommitPrepared | m.RollbackPrepared)}
    assert gids == {"g1", "g2"}
