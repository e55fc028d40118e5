"""What the source shows of the stream: its system, timeline and timeline history,
and the slot (``ObservedStream``, the input of ``tidemark.continuity``'s rule), read
at start and on every (re)connection before anything streams.
"""

from __future__ import annotations

import psycopg

from tidemark.continuity.rule import ObservedStream, parse_timeline_history
from tidemark.replication import slot as slots
from tidemark.replication.source_errors import ConnectionLost, classify_connect_error


def observed_stream(
    ident: tuple[str, int],
    slot: str,
    state: slots.SlotState | None,
    history: tuple[tuple[int, int], ...] = (),
) -> ObservedStream:
    return ObservedStream(
        system_id=ident[0],
        timeline=ident[1],
        slot=slot,
        slot_exists=state is not None,
        confirmed_flush_lsn=None if state is None else state.confirmed_flush_lsn,
        slot_lost=state is not None
        and (state.wal_status == "lost" or state.invalidation_reason is not None),
        slot_invalidation=None if state is None else state.invalidation_reason,
        history=history,
    )


async def timeline_history(
    repl: psycopg.AsyncConnection[tuple[object, ...]], timeline: int
) -> tuple[tuple[int, int], ...]:
    """The history of ``timeline`` (``TIMELINE_HISTORY`` on a replication connection):
    where each earlier timeline ended. Timeline 1 has none."""
    if timeline <= 1:
        return ()
    row = await (await repl.execute(f"TIMELINE_HISTORY {int(timeline)}")).fetchone()
    if row is None:
        return ()
    content = row[1]
    text = (
        bytes(content).decode(errors="replace")
        if isinstance(content, (bytes, bytearray, memoryview))
        else str(content)
    )
    return parse_timeline_history(text)


async def observe_stream(dsn: str, slot: str) -> ObservedStream:
    """What the source shows now: its system and timeline, and the slot (start-up)."""
    try:
        repl = await psycopg.AsyncConnection.connect(dsn, replication="database", autocommit=True)
    except psycopg.OperationalError as exc:
        classified = classify_connect_error(exc, dsn)
        if isinstance(classified, ConnectionLost):
            raise  # unreachable: the caller explains a plain connection failure
        raise classified from exc
    try:
        row = await (await repl.execute("IDENTIFY_SYSTEM")).fetchone()
        assert row is not None
        ident = (str(row[0]), int(str(row[1])))
        history = await timeline_history(repl, ident[1])
    finally:
        await repl.close()
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    try:
        state = await slots.slot_state(conn, slot)
    finally:
        await conn.close()
    return observed_stream(ident, slot, state, history)
