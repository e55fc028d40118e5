"""The walsender command that creates tidemark's slot, and the PG 17 failover option
(PG 17 is not available here: the command is checked as text, the version rule as a
refusal)."""

from __future__ import annotations

import pytest

from tidemark.errors import TidemarkError
from tidemark.replication.slot import create_slot_command
from tidemark.settings.config import Settings


def test_a_plain_slot_exports_no_snapshot() -> None:
    assert (
        create_slot_command("tidemark")
        == "CREATE_REPLICATION_SLOT tidemark LOGICAL pgoutput NOEXPORT_SNAPSHOT"
    )
    assert create_slot_command("t", temporary=True).startswith(
        "CREATE_REPLICATION_SLOT t TEMPORARY"
    )


def test_a_failover_slot_on_pg17_uses_the_option_list() -> None:
    command = create_slot_command("tidemark", failover=True, server_major=17)
    assert command == (
        "CREATE_REPLICATION_SLOT tidemark LOGICAL pgoutput (SNAPSHOT 'nothing', FAILOVER true)"
    )


@pytest.mark.parametrize("major", [15, 16])
def test_a_failover_slot_before_pg17_is_refused_with_what_to_do(major: int) -> None:
    with pytest.raises(TidemarkError, match=f"PostgreSQL 17 or newer \\(the source is {major}\\)"):
        create_slot_command("tidemark", failover=True, server_major=major)


def test_a_temporary_failover_slot_is_refused() -> None:
    with pytest.raises(TidemarkError, match="temporary"):
        create_slot_command("tidemark", temporary=True, failover=True, server_major=17)


def test_a_bad_slot_name_never_reaches_the_command() -> None:
    with pytest.raises(TidemarkError):
        create_slot_command("tidemark; drop table x", failover=True, server_major=17)


def test_the_setting_is_off_by_default() -> None:
    assert Settings.model_validate({}).source.failover_slot is False
    assert Settings.model_validate({"source": {"failover_slot": True}}).source.failover_slot
