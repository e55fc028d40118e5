"""A throwaway Spark standalone cluster and Spark Connect server, for tests and bench.

Both are started from pyspark's own installation (its package folder is a
``SPARK_HOME``: ``bin/spark-class``, ``bin/spark-submit``, ``jars/``), so they run
exactly the Spark version tidemark's pyspark speaks:

* ``StandaloneCluster``: a master (``spark-class org.apache.spark.deploy.master.Master``)
  and one worker (``...deploy.worker.Worker``) with ``cores`` and ``memory`` for its
  executors. ``master_url`` is ``spark://127.0.0.1:<port>``; ``start()`` returns
  once the master's JSON status page lists the worker as alive.
* ``ConnectServer``: ``spark-submit --class
  org.apache.spark.sql.connect.service.SparkConnectServer`` (the Connect jar ships in
  ``jars/``) with its own ``master`` (``local[2]`` by default, or a cluster's URL).
  ``url`` is ``sc://127.0.0.1:<port>``; ``start()`` returns once the gRPC port accepts
  connections, which the server opens after its SparkContext is up.

Everything binds to 127.0.0.1 (``SPARK_LOCAL_IP`` and ``--host``) on free ports; the
master's web UI is on a free port (its ``/json/`` is how readiness is seen), the
worker's on an ephemeral one, the Connect server's is off. The master and worker get
a 256 MiB heap each. Logs, the worker's executor folders and Spark's scratch space live in one
temporary folder, removed by ``stop()``.

Nothing outlives its owner: ``stop()`` sends SIGTERM (the JVMs' shutdown hooks run;
the worker kills its executors), waits, then SIGKILLs. It also runs at interpreter
exit, and the kernel's parent-death signal stops the JVMs when the thread that
started them dies without cleaning up (so start them from a long-lived thread, as
pytest's and the bench's main threads are). Folders left by a killed owner are
removed the next time one starts.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tidemark.demo.postgres import OWNER_FILE, death_signal_prefix, free_port, remove_stale_folders
from tidemark.errors import ConfigError

_PREFIX = "tidemark-spark-"
LOOPBACK = "127.0.0.1"


def spark_home() -> Path:
    """pyspark's package folder, which is a complete SPARK_HOME."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


class _Daemon:
    """One JVM started by Spark's launcher scripts, logging to a file."""

    def __init__(self, name: str, args: Sequence[str], env: dict[str, str], work: Path) -> None:
        self.name = name
        self.log = work / f"{name}.log"
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                [*death_signal_prefix(signal.SIGTERM), *args],
                cwd=work,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a terminal's Ctrl-C is for the owner, not for us
            )

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise ConfigError(
                f"Spark {self.name} exited with {self.process.returncode} during start-up; "
                f"its log ({self.log}):\n{self.tail()}"
            )

    def tail(self, chars: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 30.0) -> None:
        if self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


class _SparkProcesses:
    """The folder, environment and lifetime shared by the cluster and the server."""

    def __init__(self) -> None:
        self.home = spark_home()
        self.work: Path | None = None
        self.daemons: list[_Daemon] = []

    def _begin(self) -> Path:
        remove_stale_folders(_PREFIX)
        self.work = Path(tempfile.mkdtemp(prefix=_PREFIX))
        (self.work / OWNER_FILE).write_text(str(os.getpid()))
        (self.work / "conf").mkdir()  # an empty SPARK_CONF_DIR: no stray defaults
        atexit.register(self.stop)
        return self.work

    def _env(self) -> dict[str, str]:
        assert self.work is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
        env.update(
            SPARK_HOME=str(self.home),
            SPARK_CONF_DIR=str(self.work / "conf"),
            SPARK_LOCAL_IP=LOOPBACK,
            SPARK_LOCAL_DIRS=str(self.work / "scratch"),
            SPARK_CONNECT_MODE="0",  # the JVM side; not a Connect client launch
            PYSPARK_PYTHON=sys.executable,
        )
        return env

    def _launch(self, name: str, args: Sequence[str], **env: str) -> _Daemon:
        assert self.work is not None
        daemon = _Daemon(name, args, {**self._env(), **env}, self.work)
        self.daemons.append(daemon)
        return daemon

    def _fail(self, message: str) -> ConfigError:
        logs = "\n".join(f"--- {d.name} ({d.log}):\n{d.tail(2000)}" for d in self.daemons)
        self.stop()
        return ConfigError(f"{message}\n{logs}")

    def stop(self) -> None:
        """Stop every JVM (last started first) and remove the folder. Idempotent."""
        while self.daemons:
            self.daemons.pop().stop()
        work, self.work = self.work, None
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)

    def __exit__(self, *exc: object) -> None:
        self.stop()


class StandaloneCluster(_SparkProcesses):
    """A master and one worker on loopback. Use as a context manager or start()/stop()."""

    DAEMON_MEMORY = "256m"  # the master's and the worker's own heap (executors: ``memory``)

    def __init__(self, *, cores: int = 2, memory: str = "1g") -> None:
        super().__init__()
        self.cores, self.memory = cores, memory
        self.port = 0
        self.ui_port = 0

    @property
    def master_url(self) -> str:
        return f"spark://{LOOPBACK}:{self.port}"

    @property
    def worker_dir(self) -> Path:
        assert self.work is not None
        return self.work / "worker"

    def start(self, timeout: float = 120.0) -> StandaloneCluster:
        self._begin()
        self.port, self.ui_port = free_port(), free_port()
        spark_class = str(self.home / "bin" / "spark-class")
        master = self._launch(
            "master",
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", LOOPBACK,
             "--port", str(self.port), "--webui-port", str(self.ui_port)],
            SPARK_DAEMON_MEMORY=self.DAEMON_MEMORY,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        self._wait(lambda s: s.get("status") == "ALIVE", [master], deadline, "master")
        worker = self._launch(
            "worker",
            [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", LOOPBACK,
             "--cores", str(self.cores), "--memory", self.memory,
             "--work-dir", str(self.worker_dir), "--webui-port", "0", self.master_url],
            SPARK_DAEMON_MEMORY=self.DAEMON_MEMORY,
        )  # fmt: skip
        self._wait(lambda s: s.get("aliveworkers", 0) >= 1, [master, worker], deadline, "worker")
        return self

    def status(self) -> dict[str, Any]:
        """The master's JSON status: workers, active and completed applications."""
        url = f"http://{LOOPBACK}:{self.ui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as response:
            return dict(json.loads(response.read()))

    def executor_logs(self) -> list[Path]:
        """Every executor's stderr under the worker (``<app-id>/<executor-id>/stderr``)."""
        return sorted(self.worker_dir.glob("app-*/*/stderr"))

    def _wait(self, ready: Any, daemons: list[_Daemon], deadline: float, what: str) -> None:
        while time.monotonic() < deadline:
            for daemon in daemons:
                try:
                    daemon.check_alive()
                except ConfigError as exc:
                    raise self._fail(str(exc)) from None
            with contextlib.suppress(OSError, ValueError):
                if ready(self.status()):
                    return
            time.sleep(0.3)
        raise self._fail(f"the Spark {what} was not up in time (master {self.master_url})")

    def __enter__(self) -> StandaloneCluster:
        return self.start()


class ConnectServer(_SparkProcesses):
    """A Spark Connect server on loopback. Use as a context manager or start()/stop()."""

    CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"

    def __init__(
        self,
        *,
        master: str = "local[2]",
        driver_memory: str = "1g",
        conf: dict[str, str] | None = None,
    ) -> None:
        super().__init__()
        self.master, self.driver_memory = master, driver_memory
        self.conf = dict(conf or {})
        self.port = 0

    @property
    def url(self) -> str:
        return f"sc://{LOOPBACK}:{self.port}"

    def start(self, timeout: float = 180.0) -> ConnectServer:
        self._begin()
        self.port = free_port()
        conf = {
            "spark.connect.grpc.binding.address": LOOPBACK,
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.ui.enabled": "false",
            **self.conf,
        }
        args = [str(self.home / "bin" / "spark-submit"), "--class", self.CLASS,
                "--name", "tidemark-connect", "--master", self.master,
                "--driver-memory", self.driver_memory]  # fmt: skip
        for key, value in conf.items():
            args += ["--conf", f"{key}={value}"]
        server = self._launch("connect", args)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                server.check_alive()
            except ConfigError as exc:
                raise self._fail(str(exc)) from None
            try:
                socket.create_connection((LOOPBACK, self.port), timeout=2).close()
                return self
            except OSError:
                time.sleep(0.3)
        raise self._fail(f"the Spark Connect server did not open {self.url} in time")

    def __enter__(self) -> ConnectServer:
        return self.start()
