"""The continuity rule, its store and its guard, without Postgres."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from pathlib import Path

import pytest

from tidemark.continuity.fence import SnapshotFence
from tidemark.continuity.guard import ContinuityGuard
from tidemark.continuity.rule import (
    ObservedStream,
    StreamRecord,
    check_stream,
    parse_timeline_history,
)
from tidemark.continuity.store import ContinuityStore
from tidemark.errors import StreamGapError

SYSTEM = "7300000000000000001"
RECORD = StreamRecord(SYSTEM, 1, "tm", 1000, 1, 5000, 0.0)
FENCE = SnapshotFence(4000, 10, 12, frozenset({11}))


def observed(**changes: object) -> ObservedStream:
    base = {
        "system_id": SYSTEM,
        "timeline": 1,
        "slot": "tm",
        "slot_exists": True,
        "confirmed_flush_lsn": 4800,
    }
    return ObservedStream(**{**base, **changes})  # type: ignore[arg-type]


# -- the rule ------------------------------------------------------------------


def test_the_same_slot_at_or_below_what_was_sent_is_the_same_stream() -> None:
    assert check_stream(RECORD, observed(), claimed=True).kind == "continuous"
    assert check_stream(RECORD, observed(confirmed_flush_lsn=5000), claimed=True).kind == (
        "continuous"
    )


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"slot_exists": False, "confirmed_flush_lsn": None}, "does not exist any more"),
        ({"confirmed_flush_lsn": 5008}, "beyond the highest position"),
        ({"system_id": "7300000000000000002"}, "another PostgreSQL system"),
        ({"slot": "other"}, "slot changed"),
        ({"slot_lost": True}, "invalidated"),
    ],
)
def test_a_broken_stream_is_a_gap_when_claimed_and_adopted_when_not(
    change: dict[str, object], words: str
) -> None:
    gap = check_stream(RECORD, observed(**change), claimed=True)
    assert gap.kind == "gap" and words in gap.reason
    assert check_stream(RECORD, observed(**change), claimed=False).kind == "adopt"


def test_a_new_timeline_with_the_slot_in_place_continues_and_says_so() -> None:
    # forked at or above everything tidemark holds (what it sent: 5000; its tables: 5000)
    promoted = observed(timeline=2, history=((1, 5000),))
    verdict = check_stream(RECORD, promoted, claimed=True, held=5000)
    assert verdict.kind == "continuous" and "timeline changed from 1 to 2" in verdict.reason
    assert "forking at 0/1388" in verdict.reason


@pytest.mark.parametrize(
    ("history", "held", "words"),
    [
        (((1, 4096),), 0, "left timeline 1 at 0/1000, but tidemark had received"),
        (((1, 5000),), 5008, "up to 0/1390"),  # (the tables hold more than was sent)
        (((3, 9000),), 0, "does not descend from timeline 1"),
        ((), 0, "does not descend"),
    ],
)
def test_a_timeline_that_forked_below_what_tidemark_holds_is_a_gap(
    history: tuple[tuple[int, int], ...], held: int, words: str
) -> None:
    promoted = observed(timeline=2, history=history)
    gap = check_stream(RECORD, promoted, claimed=True, held=held)
    assert gap.kind == "gap" and words in gap.reason
    assert check_stream(RECORD, promoted, claimed=False, held=held).kind == "adopt"


def test_two_promotions_fork_where_the_recorded_timeline_ended() -> None:
    twice = observed(timeline=3, history=((1, 5000), (2, 7000)))
    assert check_stream(RECORD, twice, claimed=True, held=5000).kind == "continuous"
    on_two = StreamRecord(SYSTEM, 2, "tm", 1000, 1, 6000, 0.0)
    assert check_stream(on_two, twice, claimed=True, held=7000).kind == "continuous"
    assert check_stream(on_two, twice, claimed=True, held=7001).kind == "gap"


def test_a_timeline_history_file_is_read_as_postgres_writes_it() -> None:
    text = "1\t0/3495468\tno recovery target specified\n\n2\t0/5000000\tat restore point\n"
    assert parse_timeline_history(text) == ((1, 0x3495468), (2, 0x5000000))


def test_without_a_record_an_existing_slot_is_adopted_and_a_missing_one_is_a_gap() -> None:
    assert check_stream(None, observed(), claimed=True).kind == "continuous"
    missing = observed(slot_exists=False, confirmed_flush_lsn=None)
    assert check_stream(None, missing, claimed=True).kind == "gap"
    assert check_stream(None, missing, claimed=False).kind == "adopt"


# -- the store -------------------------------------------------------------------


def test_claims_invalidations_and_the_stream_survive_a_restart(tmp_path: Path) -> None:
    store = ContinuityStore(tmp_path)
    store.adopt(RECORD)
    store.record_claim("a", FENCE, 10)
    store.record_claim("b", FENCE, 20)
    store.write_claims()
    assert store.invalidate("b", "removed")
    asyncio.run(store.before_send(6000))
    again = ContinuityStore(tmp_path)
    assert again.claimed() == ["a"] and again.claim("a") == store.claim("a")
    last = again.last_invalidation("b")
    assert last is not None and last.reason == "removed"
    assert again.stream is not None and again.stream.sent_flush_lsn == 6000


def test_the_claims_file_is_the_whole_document_after_claims_change_between_writes(
    tmp_path: Path,
) -> None:
    # each claim's JSON is kept from one write to the next: a claim replaced, one whose
    # partitions changed and one ended must be written as they are now
    store = ContinuityStore(tmp_path)
    for i, name in enumerate(["b", 'q"uoted', "a", "ünï"]):
        store.record_claim(name, SnapshotFence(4000 + i, 10, 12, frozenset({11})), i)
    store.write_claims()
    store.record_claim("a", SnapshotFence(9000, 20, 25, frozenset()), 77)
    claim = store.claim("b")
    assert claim is not None and store.accept_partitions("b", claim, {"p1": [1, 2]})
    store.invalidate('q"uoted', "removed")
    store.write_claims()
    text = store.claims_path.read_text()
    whole = {
        "version": 2,
        "claims": {n: store.claim(n).to_json() for n in sorted(store.claimed())},  # type: ignore[union-attr]
        "invalidations": json.loads(text)["invalidations"],
    }
    assert text == json.dumps(whole, separators=(",", ":"))
    assert set(whole["invalidations"]) == {'q"uoted'}
    again = ContinuityStore(tmp_path)
    assert sorted(again.claimed()) == ["a", "b", "ünï"]
    assert again.claim("a").rows == 77 and again.claim("a").fence.lsn == 9000  # type: ignore[union-attr]
    assert again.claim("b").partitions == {"p1": [1, 2]}  # type: ignore[union-attr]


def test_an_invalidation_is_durable_before_the_next_acknowledgement(tmp_path: Path) -> None:
    store = ContinuityStore(tmp_path)
    store.adopt(RECORD)
    store.record_claim("a", FENCE, 10)
    store.write_claims()
    store.invalidate("a", "resync")
    assert ContinuityStore(tmp_path).claim("a") is not None  # not written yet
    asyncio.run(store.before_send(5000))  # a flush that does not even move
    assert ContinuityStore(tmp_path).claim("a") is None


def test_callers_waiting_for_a_claims_write_share_the_next_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tidemark.continuity import store as store_module

    real = store_module.objectstore.replace
    writes: list[str] = []
    writing = threading.Event()

    def slow(path: Path, data: str, **kw: object) -> None:
        writes.append(data)
        writing.set()
        time.sleep(0.3)
        real(path, data, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(store_module.objectstore, "replace", slow)
    store = ContinuityStore(tmp_path)
    store.record_claim("a", FENCE, 1)
    first = threading.Thread(target=store.write_claims)
    first.start()
    assert writing.wait(5)
    waiting = []
    for name in ("b", "c"):  # each recorded, then written by its own caller
        store.record_claim(name, FENCE, 2)
        waiting.append(threading.Thread(target=store.write_claims))
        waiting[-1].start()
        time.sleep(0.05)
    for t in [first, *waiting]:
        t.join()
    assert len(writes) == 2  # the first, then one for both callers that waited
    assert sorted(ContinuityStore(tmp_path).claimed()) == ["a", "b", "c"]


def test_the_sent_flush_only_grows(tmp_path: Path) -> None:
    store = ContinuityStore(tmp_path)
    store.adopt(RECORD)
    asyncio.run(store.before_send(7000))
    asyncio.run(store.before_send(6000))
    record = ContinuityStore(tmp_path).stream
    assert record is not None and record.sent_flush_lsn == 7000


def test_a_status_update_cancelled_before_its_write_leaves_the_next_one_to_write(
    tmp_path: Path,
) -> None:
    """The status sender cancelled (the client stopping) after ``before_send`` noted a
    flush but before its write ran in its thread: the final update of the same flush
    must still write it before it is sent. (A full ``make test`` saw a second service
    refuse a slot 'beyond the highest position tidemark ever acknowledged'.)"""
    store = ContinuityStore(tmp_path)
    store.adopt(RECORD)

    async def cancelled_then_final() -> None:
        started = asyncio.Event()
        real = asyncio.to_thread

        async def never_runs(*_args: object) -> None:
            started.set()
            await asyncio.sleep(3600)  # (cancelled here, as a pending executor job is)

        asyncio.to_thread = never_runs  # type: ignore[assignment]
        try:
            sender = asyncio.create_task(store.before_send(7000))
            await started.wait()
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
        finally:
            asyncio.to_thread = real
        await store.before_send(7000)  # the final update, at stop

    asyncio.run(cancelled_then_final())
    record = ContinuityStore(tmp_path).stream
    assert record is not None and record.sent_flush_lsn == 7000


def test_round_one_backfill_records_are_read_as_claims(tmp_path: Path) -> None:
    legacy = tmp_path / "_tidemark" / "backfills.json"
    legacy.parent.mkdir()
    entry = {"fence": FENCE.to_json(), "rows": 3, "finished_at": 12.0}
    legacy.write_text(json.dumps({"version": 1, "shapes": {"old": entry}}))
    store = ContinuityStore(tmp_path)
    claim = store.claim("old")
    assert claim is not None and claim.fence == FENCE and claim.epoch is None
    store.write_claims()
    assert not legacy.exists() and ContinuityStore(tmp_path).claim("old") is not None


def test_an_unreadable_state_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "_tidemark" / "claims.json"
    path.parent.mkdir()
    path.write_text("{not json")
    with pytest.raises(Exception, match="unreadable"):
        ContinuityStore(tmp_path)


# -- the guard -------------------------------------------------------------------


def claimed_store(tmp_path: Path) -> ContinuityStore:
    store = ContinuityStore(tmp_path)
    store.adopt(RECORD)
    store.record_claim("a", FENCE, 10)
    store.write_claims()
    return store


def test_the_fail_policy_stops_with_what_happened_and_how_to_resync(tmp_path: Path) -> None:
    store = claimed_store(tmp_path)
    guard = ContinuityGuard(store, "fail")
    with pytest.raises(StreamGapError, match=r"does not exist any more.*on_stream_gap"):
        guard.decide_at_start(observed(slot_exists=False, confirmed_flush_lsn=None))
    assert store.claim("a") is not None  # nothing was given up


def test_the_resync_policy_ends_every_claim_before_a_new_stream_is_adopted(
    tmp_path: Path,
) -> None:
    store = claimed_store(tmp_path)
    guard = ContinuityGuard(store, "resync")
    missing = observed(slot_exists=False, confirmed_flush_lsn=None)
    guard.decide_at_start(missing)
    assert ContinuityStore(tmp_path).claimed() == []  # durable already
    record = store.stream
    assert record is not None and record.epoch == 2 and record.origin_lsn == 0
    guard.check(missing)  # the client's first connection: the slot is created next
    guard.slot_created(missing, 9000)
    record = ContinuityStore(tmp_path).stream
    assert record is not None and (record.epoch, record.origin_lsn, record.sent_flush_lsn) == (
        2,
        9000,
        9000,
    )


def test_a_gap_found_on_reconnect_stops_whatever_the_policy(tmp_path: Path) -> None:
    guard = ContinuityGuard(claimed_store(tmp_path), "resync")
    with pytest.raises(StreamGapError, match="reconnect"):
        guard.check(observed(confirmed_flush_lsn=9999))


def test_a_promotion_keeps_the_epoch_and_records_the_new_timeline(tmp_path: Path) -> None:
    store = claimed_store(tmp_path)
    ContinuityGuard(store, "fail").check(observed(timeline=3, history=((1, 5000), (2, 6000))))
    record = ContinuityStore(tmp_path).stream
    assert record is not None and (record.epoch, record.timeline) == (1, 3)
    assert store.claim("a") is not None


def test_a_fork_below_what_the_tables_hold_stops_on_reconnect(tmp_path: Path) -> None:
    # the record says 5000 was sent; the tables hold a commit at 5600; the standby
    # that was promoted had only up to 5200
    guard = ContinuityGuard(claimed_store(tmp_path), "resync", held=lambda: 5600)
    with pytest.raises(StreamGapError, match="left timeline 1 at 0/1450"):
        guard.check(observed(timeline=2, history=((1, 5200),)))
