"""Bad input to the compose stack, each case on a stack of its own: a Postgres without
``wal_level=logical``, a wrong password, a sink volume tidemark cannot write. tidemark's
container exits with the message the CLI gives, no traceback, and its health check says
why (``make test-compose``; see test_compose.py for how the stack runs here)."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

from .support import Stack, eventually, run

# -- bad input -------------------------------------------------------------------------------


def reason_file(stack: Stack) -> str:
    """The exit reason the image's tidemark left (what its health check prints), read from
    the container's file system (tried again while its restart policy restarts it)."""

    def copied() -> str:
        done = subprocess.run(
            ["podman", "cp", f"{stack.container('tidemark')}:/home/tidemark/exit-reason", "-"],
            capture_output=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0:
            return ""
        with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
            member = tar.extractfile("exit-reason")
            return member.read().decode() if member is not None else ""

    return str(eventually("the exit reason file", copied, timeout=60, every=0.2))


def bad_stack(tmp_path: Path, name: str, override: str) -> Stack:
    """A project of its own with ``override`` (compose YAML) on top."""
    path = tmp_path / f"{name}.yml"
    path.write_text(override)
    return Stack(f"tidemark-{name}", [path])


def assert_exits_saying(stack: Stack, said: str, health_too: bool = True) -> None:
    """tidemark's container exits non-zero, logging ``said`` as the CLI says it and no
    traceback; its health check shows the same reason."""
    stack.down(volumes=True)
    stack.compose("up", "-d", "postgres")
    stack.wait_healthy("postgres", 120)
    stack.compose("up", "-d", "tidemark")
    try:
        # the first exit (its restart policy starts it again after)
        code = run(["podman", "wait", stack.container("tidemark")], timeout=300).strip()
        assert code not in ("", "0"), f"tidemark's container exited {code}"
        logs = stack.logs("tidemark")
        assert "Traceback" not in logs, logs[-3000:]
        # as the CLI prints it (the JSON log has it too)
        line = next(
            line
            for line in logs.splitlines()
            if said in line and line.startswith(("tidemark: ", "tidemark-entrypoint: "))
        )
        message = line.split(": ", 1)[1]
        assert message in reason_file(stack)
        if health_too:
            # restarted by its policy, it fails again; meanwhile the check says why
            def says_why() -> bool:
                healthy, output = stack.healthcheck("tidemark")
                return not healthy and message in output

            eventually("the health check says why", says_why, timeout=240, every=0.5)
        print(f"\n{stack.project}: {line}")
    finally:
        stack.compose("stop", "-t", "5", "tidemark", timeout=120)
        stack.down(volumes=True)


def test_a_source_without_logical_wal_level_is_refused_clearly(tmp_path: Path) -> None:
    bad = bad_stack(
        tmp_path,
        "wal-level",
        "services:\n  postgres:\n    command: !override [postgres, -c, wal_level=replica]\n",
    )
    assert_exits_saying(bad, "wal_level")


def test_a_wrong_password_is_refused_clearly(tmp_path: Path) -> None:
    dsn = "postgresql://tidemark:not-the-password@postgres:5432/shop"
    bad = bad_stack(
        tmp_path,
        "password",
        f"services:\n  tidemark:\n    environment:\n      TIDEMARK_SOURCE__DSN: {dsn}\n",
    )
    assert_exits_saying(bad, "password authentication failed")


def test_a_sink_tidemark_cannot_write_is_refused_clearly(tmp_path: Path) -> None:
    sink = tmp_path / "sink-owned-by-root"
    sink.mkdir(mode=0o755)
    bad = bad_stack(
        tmp_path, "sink", f"services:\n  tidemark:\n    volumes: !override [{sink}:/data]\n"
    )
    # the entrypoint refuses in milliseconds: no running moment for a health check
    assert_exits_saying(bad, "is not writable by uid 185", health_too=False)
