"""``tidemark run`` refuses a source that refuses tidemark before it starts Spark (issue
54): a role that may not replicate ends the run with exit 4 in seconds, the role and
the fix named, no traceback and no Spark log. An unreachable source is left to the
service's own connection handling (`tests/unit/cli/test_run_fails_fast.py` and the
source shutdown tests)."""

from __future__ import annotations

import secrets
import subprocess
import sys
import time
from pathlib import Path

from .conftest import ONE_SERVER, PgDatabase


@ONE_SERVER
def test_a_role_that_may_not_replicate_fails_the_run_before_spark(
    pg_db: PgDatabase, tmp_path: Path
) -> None:
    role, password = f"plain_{secrets.token_hex(4)}", secrets.token_hex(8)
    pg_db.execute(f"create role {role} login password '{password}'")
    try:
        pg_db.execute("create table orders (id int primary key)")
        config = tmp_path / "tidemark.toml"
        config.write_text(
            f'[source]\ndsn = "{pg_db.server.dsn_for(pg_db.name, role, password)}"\n'
            f'[sink]\nroot = "{tmp_path / "lake"}"\n'
            '[[shapes]]\nname = "orders"\ntable = "public.orders"\n'
        )
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "tidemark", "run", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        seconds = time.monotonic() - started
        output = done.stdout + done.stderr
        assert done.returncode == 4, output
        assert f"role {role} lacks REPLICATION: run ALTER ROLE {role} REPLICATION;" in output
        assert "Traceback" not in output and "log4j" not in output and "Spark" not in output
        assert seconds < 20, seconds  # (Spark alone takes ~10 s to start)
        lake = tmp_path / "lake"  # (the root check may make the folder, nothing in it)
        assert not lake.exists() or not any(lake.iterdir()), list(lake.iterdir())
    finally:
        pg_db.execute(f"drop role if exists {role}")
