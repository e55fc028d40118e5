"""``tidemark teardown``: refused while tidemark runs against the slot; then the slot, the
publication tidemark created and, with ``--purge``, the instance's tables and state go;
a publication someone else created stays."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tidemark import cli
from tidemark.cli.teardown import TeardownRefused, carry_out, make_plan

from .conftest import PgDatabase, one_server
from .service_support import current_lsn, running_service, settings_for, wait_frontiers


@one_server()
async def test_teardown_waits_for_the_service_to_stop_then_removes_what_tidemark_made(
    pg_db: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    # given a service that created its slot and publication and filled a shape's tables
    pg_db.execute("create table t (id int primary key, v text); insert into t values (1, 'a')")
    settings = settings_for(pg_db.dsn, str(tmp_path), [{"name": "t_all", "table": "public.t"}])
    async with running_service(settings, spark) as service:
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        # when teardown is asked while it runs, then it refuses and names why
        with pytest.raises(TeardownRefused, match="still runs against this slot"):
            await make_plan(settings, purge=True)
    assert (tmp_path / "tables" / "t_all").is_dir()

    # when it is stopped
    plan = await make_plan(settings, purge=True)
    assert plan.slot_exists and plan.publication_exists and plan.publication_ours
    assert tmp_path / "tables" / "t_all" in plan.paths
    assert any("drop the replication slot tm_e2e" in line for line in plan.describe())
    done = await carry_out(settings, plan)

    # then the slot, the publication and everything of the instance under the root are gone
    assert "dropped the replication slot tm_e2e" in done
    assert pg_db.execute("select 1 from pg_replication_slots where slot_name = 'tm_e2e'") == []
    assert pg_db.execute("select 1 from pg_publication where pubname = 'tm_e2e'") == []
    assert not (tmp_path / "tables" / "t_all").exists()
    assert not (tmp_path / "_tidemark").exists()
    # and the source table is untouched
    assert pg_db.execute("select count(*) from t") == [(1,)]


@one_server()
def test_teardown_keeps_a_publication_tidemark_did_not_create_and_asks_first(
    pg_db: PgDatabase, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # given a slot and a publication made by hand (as a DBA would, for tidemark to use)
    pg_db.execute("create table t (id int primary key)")
    pg_db.execute("create publication tm_own for table t")
    pg_db.execute("select pg_create_logical_replication_slot('tm_own', 'pgoutput')")
    config = tmp_path / "tidemark.toml"
    config.write_text(
        f'[source]\ndsn = "{pg_db.dsn}"\nslot = "tm_own"\npublication = "tm_own"\n'
        f'create_publication = false\n\n[sink]\nroot = "{tmp_path / "lake"}"\n'
    )
    # when teardown runs without a terminal and without --yes, then nothing is done
    assert cli.main(["teardown", "--config", str(config)]) == 2
    assert "confirm with --yes" in capsys.readouterr().err
    assert pg_db.execute("select 1 from pg_replication_slots where slot_name = 'tm_own'")
    # when it runs with --yes, then the slot goes and the publication stays, with how to drop it
    assert cli.main(["teardown", "--config", str(config), "--yes"]) == 0
    out = capsys.readouterr().out
    assert "dropped the replication slot tm_own" in out
    assert "keep the publication tm_own" in out and "DROP PUBLICATION tm_own;" in out
    assert pg_db.execute("select 1 from pg_replication_slots where slot_name = 'tm_own'") == []
    assert pg_db.execute("select 1 from pg_publication where pubname = 'tm_own'") == [(1,)]
