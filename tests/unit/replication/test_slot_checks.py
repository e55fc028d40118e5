"""The slot usability rules, without a server."""

from __future__ import annotations

import pytest

from tidemark.errors import ConfigError, ReplicationError, SlotLostError
from tidemark.replication.catalog import check_name
from tidemark.replication.slot import SlotState, check_slot_usable


def state(**kw: object) -> SlotState:
    base: dict[str, object] = dict(
        name="s",
        plugin="pgoutput",
        database="app",
        active_pid=None,
        confirmed_flush_lsn=100,
        restart_lsn=90,
        wal_status="reserved",
        safe_wal_size=None,
    )
    base.update(kw)
    return SlotState(**base)  # type: ignore[arg-type]


def test_a_live_pgoutput_slot_of_our_database_is_usable() -> None:
    check_slot_usable(state(), "s", "app")  # no exception is the assertion
    check_slot_usable(state(wal_status="extended"), "s", "app")


def test_another_plugin_is_refused_with_the_fix() -> None:
    with pytest.raises(ReplicationError, match=r"plugin 'wal2json', not 'pgoutput'.*pg_drop"):
        check_slot_usable(state(plugin="wal2json"), "s", "app")


def test_another_database_is_refused() -> None:
    with pytest.raises(ReplicationError, match="belongs to database 'other', not 'app'"):
        check_slot_usable(state(database="other"), "s", "app")


def test_a_lost_slot_is_fatal_and_says_to_resync() -> None:
    with pytest.raises(SlotLostError, match=r"wal_status = 'lost'.*resync"):
        check_slot_usable(state(wal_status="lost"), "s", "app")


@pytest.mark.parametrize("name", ["", "Upper", "with space", "9start", "x" * 64, "a;drop"])
def test_unsafe_names_are_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="invalid slot name"):
        check_name("slot", name)
