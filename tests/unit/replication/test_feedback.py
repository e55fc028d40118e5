"""The status-update policy: what is acknowledged, and when."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemark.replication.feedback import Feedback, keepalive_interval


def test_keepalive_interval_is_a_third_of_the_timeout_capped_at_ten_seconds() -> None:
    assert keepalive_interval(2.0) == 2.0 / 3
    assert keepalive_interval(60.0) == 10.0
    assert keepalive_interval(0) == 10.0  # timeout disabled


def test_flush_never_passes_what_was_received() -> None:
    fb = Feedback(100)
    fb.note_durable(500)  # a (buggy) durable value beyond anything received
    assert fb.flush_lsn == 100
    fb.note_received(300)
    assert fb.flush_lsn == 300


def test_idle_point_is_acknowledged_only_up_to_the_keepalive() -> None:
    fb = Feedback(100)
    fb.note_keepalive(400, reply_requested=False)
    assert fb.flush_lsn == 100  # a keepalive alone proves nothing durable
    fb.note_idle(400)
    assert fb.flush_lsn == 400


def test_a_keepalive_reached_while_idle_is_an_idle_point() -> None:
    fb = Feedback(100)
    fb.note_keepalive(400, reply_requested=False)
    fb.keepalive_reached(400, caught_up=True)
    assert fb.flush_lsn == 400


def test_a_keepalive_reached_while_busy_waits_for_a_notification_while_idle() -> None:
    """The rule in one place: a keepalive reached while a transaction was open or a
    writer held rows becomes an idle point at the first tracker notification that
    finds nothing held, not before."""
    fb = Feedback(100)
    fb.note_keepalive(400, reply_requested=False)
    fb.keepalive_reached(400, caught_up=False)
    assert fb.flush_lsn == 100
    fb.note_durable(250, caught_up=False)  # something is still held
    assert fb.flush_lsn == 250
    fb.note_durable(300, caught_up=True)  # nothing held now: everything before 400 is durable
    assert fb.flush_lsn == 400


def test_a_new_stream_forgets_the_keepalive_reached_on_the_one_before() -> None:
    fb = Feedback(100)
    fb.note_keepalive(400, reply_requested=False)
    fb.keepalive_reached(400, caught_up=False)
    fb.stream_restarted()
    fb.note_durable(200, caught_up=True)
    assert fb.flush_lsn == 200  # not 400: that keepalive was the old connection's


def test_an_open_transaction_keeps_a_caught_up_tracker_from_making_an_idle_point() -> None:
    """The idle rule's second half is asked, not given: with the tracker caught up
    but a transaction open in the stream, neither the keepalive reached nor the
    notification makes an idle point; once the transaction is closed, the next one
    does."""
    open_txn = [True]
    fb = Feedback(100, txn_open=lambda: open_txn[0])
    fb.note_keepalive(400, reply_requested=False)
    fb.keepalive_reached(400, caught_up=True)
    fb.note_durable(250, caught_up=True)
    assert fb.flush_lsn == 250
    open_txn[0] = False
    fb.note_durable(260, caught_up=True)
    assert fb.flush_lsn == 400


def test_before_the_first_connection_nothing_is_known_and_the_slot_starts_it() -> None:
    """The service makes the acknowledgement before the client connects: notifications
    then are ignored (the slot's confirmed position, given at the first connection,
    is where the positions start); a later connection changes only the timeout."""
    woken: list[None] = []
    fb = Feedback()
    fb.on_change = lambda: woken.append(None)
    fb.note_durable(900, caught_up=True)
    fb.keepalive_reached(950, caught_up=True)
    assert not fb.started and fb.flush_lsn == 0 and woken == []
    fb.start(500, keepalive_interval_s=2.0, receive_timeout_s=10.0)
    assert (fb.received, fb.durable, fb.flush_lsn, fb.keepalive_interval_s) == (500, 500, 500, 2.0)
    fb.note_received(700)
    fb.note_durable(600)
    assert woken == [None]  # each input that can change what to send wakes the sender
    fb.start(400, keepalive_interval_s=5.0, receive_timeout_s=30.0)  # a reconnection
    assert (fb.flush_lsn, fb.keepalive_interval_s, fb.receive_timeout_s) == (600, 2.0, 30.0)


def test_nothing_goes_backwards_after_sending() -> None:
    fb = Feedback(100)
    fb.note_received(1000)
    fb.note_durable(800)
    update = fb.current()
    fb.sent(update, now=0.0)
    fb.note_durable(200)  # late, lower notification
    assert fb.current().flush_lsn == 800
    assert fb.current().write_lsn == 1000


def test_reply_requested_makes_an_update_due_at_once() -> None:
    fb = Feedback(100, keepalive_interval_s=10)
    fb.sent(fb.current(), now=0.0)
    assert fb.due(now=1.0) is None
    fb.note_keepalive(150, reply_requested=True)
    update = fb.due(now=1.0)
    assert update is not None and update.write_lsn == 150
    fb.sent(update, now=1.0)
    assert fb.due(now=1.1) is None


def test_flush_advance_is_sent_debounced_and_keepalives_periodic() -> None:
    fb = Feedback(100, keepalive_interval_s=5, min_interval_s=0.1)
    fb.sent(fb.current(), now=0.0)
    fb.note_received(200)
    fb.note_durable(200)
    assert fb.due(now=0.05) is None  # debounced
    assert fb.next_deadline(now=0.05) == pytest.approx(0.05)
    update = fb.due(now=0.2)
    assert update is not None and update.flush_lsn == 200
    fb.sent(update, now=0.2)
    assert fb.due(now=5.0) is None
    assert fb.due(now=5.3) is not None  # periodic, nothing new


events = st.lists(
    st.one_of(
        st.tuples(st.just("recv"), st.integers(0, 10_000)),
        st.tuples(st.just("durable"), st.integers(0, 10_000)),
        st.tuples(st.just("idle"), st.integers(0, 10_000)),
        st.tuples(st.just("send"), st.just(0)),
    ),
    max_size=60,
)


@given(events)
def test_sent_positions_are_monotonic_and_never_beyond_received(evs: list[tuple[str, int]]) -> None:
    fb = Feedback(0)
    received = 0
    last = (0, 0, 0)
    for i, (kind, value) in enumerate(evs):
        if kind == "recv":
            fb.note_received(value)
            received = max(received, value)
        elif kind == "durable":
            fb.note_durable(value)
        elif kind == "idle":
            fb.note_idle(value)
        else:
            update = fb.current()
            assert update.flush_lsn <= received
            assert update.apply_lsn == update.flush_lsn
            now = (update.write_lsn, update.flush_lsn, update.apply_lsn)
            assert all(a >= b for a, b in zip(now, last, strict=True))
            fb.sent(update, float(i))
            last = now


def test_a_stop_whose_connection_the_receive_loop_closed_meanwhile_ends_cleanly() -> None:
    # the final status update awaits the guard; meanwhile the receive loop, which ends
    # on stopping too, closes the connection: stopping must still end without an error
    import asyncio
    from types import SimpleNamespace

    from tidemark.replication.client import ReplicationClient, SourceConfig

    conn = SimpleNamespace(closed=False, pgconn=object())

    class Guard:
        async def before_send(self, flush_lsn: int) -> None:
            await asyncio.sleep(0)
            conn.closed = True

        def check(self, observed: object) -> None: ...

        def slot_created(self, observed: object, consistent_lsn: int) -> None: ...

    async def run() -> None:
        client = ReplicationClient(SourceConfig(dsn="host=nowhere"), guard=Guard())  # type: ignore[arg-type]
        client.feedback = Feedback(100)
        client._conn = conn  # type: ignore[assignment]
        await client.stop()
        assert client._conn is None

    asyncio.run(run())


def test_a_silent_walsender_is_asked_for_a_reply_then_taken_for_lost() -> None:
    """As PostgreSQL's walreceiver does with ``wal_receiver_timeout``: half the receive
    timeout without a message, and the next status update asks for a reply (once);
    all of it, and the connection is lost. Any message starts the count again."""
    fb = Feedback(100, keepalive_interval_s=10.0, receive_timeout_s=20.0)
    fb.note_heard(0.0)
    update = fb.due(0.0)
    assert update is not None and not update.reply_requested  # (the first update)
    fb.sent(update, 0.0)
    assert fb.due(9.0) is None and fb.next_deadline(9.0) == 1.0  # the ping at 10 s
    ping = fb.due(10.0)
    assert ping is not None and ping.reply_requested
    fb.sent(ping, 10.0)
    assert fb.next_deadline(11.0) == 9.0  # (no second ping: the next is the keepalive)
    later = fb.due(19.0)
    assert later is None or not later.reply_requested
    assert not fb.timed_out(19.9) and fb.timed_out(20.0)
    fb.note_heard(20.5)  # the answer came after all
    assert not fb.timed_out(40.0) and fb.silent_for(40.0) == 19.5
    assert fb.due(31.0) is not None and fb.due(31.0).reply_requested  # type: ignore[union-attr]


def test_without_a_receive_timeout_silence_is_never_a_loss() -> None:
    fb = Feedback(100)
    fb.note_heard(0.0)
    assert not fb.timed_out(10_000.0)
    update = fb.due(10_000.0)
    assert update is not None and not update.reply_requested


def test_the_receive_timeout_follows_the_servers_wal_sender_timeout() -> None:
    from tidemark.replication.client import connect_timeout, receive_timeout

    assert receive_timeout(60.0) == 60.0 and receive_timeout(2.0) == 10.0
    assert receive_timeout(0.0) == 60.0  # (the server's timeout off)
    assert connect_timeout("host=db dbname=app") == {"connect_timeout": 10}
    assert connect_timeout("postgresql://db/app?connect_timeout=3") == {}
