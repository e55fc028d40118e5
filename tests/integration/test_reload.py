"""Config reload on SIGHUP, against a running service (real Postgres, real Spark).

The service runs from a config file; the file is rewritten (a shape added, one removed,
one changed, ``flush.max_age_s`` and ``http.port`` changed) and the process gets SIGHUP:
the added shape is backfilled and follows the stream, the changed one is rebuilt, the
removed one is gone (its table stays), the flush policy changes at once, and the port
change is logged as needing a restart. A file that does not parse is logged and
ignored: the service keeps running with what it had.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from structlog.testing import capture_logs

from tidemark.demo.verify import compare_shape
from tidemark.settings.config import load_settings

from .conftest import PgDatabase
from .service_support import current_lsn, running_service, wait_frontiers


def config_text(dsn: str, root: Path, port: int, max_age_s: float, shapes: str) -> str:
    return (
        f'[source]\ndsn = "{dsn}"\nslot = "tm_reload"\npublication = "tm_reload"\n'
        f'[sink]\nroot = "{root}"\n[http]\nhost = "127.0.0.1"\nport = {port}\n'
        f"[flush]\nmax_age_s = {max_age_s}\n[monitor]\nperiod_s = 0.5\n{shapes}"
    )


BEFORE = """
[[shapes]]
name = "zero"
table = "public.t"
where = "grp = 0"

[[shapes]]
name = "one"
table = "public.t"
where = "grp = 1"
"""

AFTER = """
[[shapes]]
name = "zero"
table = "public.t"
where = "grp = 0 or v = 'moved'"

[[shapes]]
name = "two"
table = "public.t"
where = "grp = 2"
columns = ["v"]
"""

TRUTH = {
    "zero": "select id, grp, v from t where grp = 0 or v = 'moved'",
    "two": "select id, v from t where grp = 2",
}


async def until(condition: Any, timeout: float = 120.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.1)


async def test_sighup_reloads_shapes_and_flush_settings_from_the_config_file(
    pg_db: PgDatabase, spark: Any, tmp_path: Path
) -> None:
    pg_db.execute(
        "create table t (id int primary key, grp int, v text);"
        "alter table t replica identity full;"
        "insert into t select g, g % 3, 'seed' from generate_series(1, 90) g"
    )
    root = tmp_path / "lake"
    config = tmp_path / "tidemark.toml"
    config.write_text(config_text(pg_db.dsn, root, 0, 0.2, BEFORE))
    settings = load_settings(str(config))
    async with running_service(settings, spark, config_path=str(config)) as service:
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        assert set(service.shapes) == {"zero", "one"}
        port = service.http_port

        # when the file changes and the process gets SIGHUP, while rows keep changing
        config.write_text(config_text(pg_db.dsn, root, 1, 0.5, AFTER))
        pg_db.execute("update t set v = 'moved' where id in (1, 2)")  # grp 1 and 2 rows
        with capture_logs() as logs:
            os.kill(os.getpid(), signal.SIGHUP)
            await until(lambda: any(e["event"] == "config.reloaded" for e in logs), 60)
        pg_db.execute("insert into t select g, g % 3, 'later' from generate_series(91, 120) g")
        pg_db.execute("delete from t where id in (3, 4, 5)")

        # then the shapes are the file's: added and changed ones backfilled, then following
        await wait_frontiers(service, current_lsn(pg_db.dsn))
        assert set(service.shapes) == {"zero", "two"}
        assert {r.name: r.origin for r in service.registry.shapes()} == {
            "zero": "config",
            "two": "config",
        }
        for shape, query in TRUTH.items():
            result = compare_shape(spark, str(root), shape, query, pg_db.dsn)
            assert result.equal, result.describe()
        assert (root / "tables" / "one" / "_delta_log").is_dir()  # a removed shape's table stays
        # the flush policy changed at once; the port is what it was, and the log says why
        assert service.scheduler is not None
        assert service.scheduler.policy.max_age_s == 0.5 == service.settings.flush.max_age_s
        assert service.http_port == port
        (reloaded,) = [e for e in logs if e["event"] == "config.reloaded"]
        assert (reloaded["added"], reloaded["removed"], reloaded["replaced"]) == (
            ["two"],
            ["one"],
            ["zero"],
        )
        assert reloaded["changed"] == ["flush.max_age_s"] and reloaded["failed"] == []
        (restart,) = [e for e in logs if e["event"] == "config.reload_needs_restart"]
        assert restart["keys"] == ["http.port"]

        # when the file is broken, a reload is refused and nothing changes
        config.write_text("[flush\nmax_age_s = ")
        with capture_logs() as logs:
            os.kill(os.getpid(), signal.SIGHUP)
            await until(lambda: any(e["event"] == "config.reload_failed" for e in logs), 60)
        (failed,) = [e for e in logs if e["event"] == "config.reload_failed"]
        assert str(config) in failed["path"]
        assert service.phase == "streaming" and set(service.shapes) == {"zero", "two"}
        assert service.scheduler.policy.max_age_s == 0.5
