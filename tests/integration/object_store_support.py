"""A real S3 server and a real faulty network for the object-store tests.

``S3Proxy`` (``org.gaul:s3proxy``, Apache-2.0) runs from its jar in ``.jars/`` with its
filesystem backend on a temporary folder, one bucket made, on a free port of 127.0.0.1.
``versitygw`` (Versity's S3 gateway, Apache-2.0, Go) is the second server, installed
by ``jars/versitygw.sh`` into ``.tools/bin/`` and run with its POSIX backend the same
way: the tests of the store's conditional writes run against both.
``Toxiproxy`` (Shopify's, MIT) runs from ``.tools/bin/toxiproxy-server`` on a free port;
``Toxiproxy.create_proxy`` puts one TCP proxy in front of a server, and the returned
``Proxy`` adds and removes toxics (latency, reset_peer, timeout) or cuts the proxy off
(a partition) over Toxiproxy's REST API.

Both run as children that get SIGTERM when the test process dies, and each start waits
for its port to answer; a server that exits or never answers raises with the end of its
log. ``jars/fetch.sh`` and ``jars/toxiproxy.sh`` install them: ``require_object_store``
skips a test when something is missing, or fails it when
``TIDEMARK_REQUIRE_OBJECT_STORE=1`` (CI, where missing tools are a setup bug).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tidemark.demo.postgres import death_signal_prefix, free_port

REPO = Path(__file__).resolve().parents[2]
JARS_DIR = Path(os.environ.get("TIDEMARK_JARS_DIR", REPO / ".jars"))
CHECKSUMS = REPO / "jars" / "checksums.sha256"
TOXIPROXY_SERVER = REPO / ".tools" / "bin" / "toxiproxy-server"
VERSITYGW = REPO / ".tools" / "bin" / "versitygw"
INSTALL = (
    "sh jars/fetch.sh && sh jars/toxiproxy.sh && sh jars/versitygw.sh "
    "&& .venv/bin/pip install boto3"
)
SERVERS = ("s3proxy", "versitygw")
REQUIRE_ENV = "TIDEMARK_REQUIRE_OBJECT_STORE"

IDENTITY = "tidemark-test"
CREDENTIAL = secrets.token_hex(16)  # a throwaway server on loopback
REGION = "us-east-1"


def pinned_jar(prefix: str) -> Path:
    """The jar of ``jars/checksums.sha256`` whose name starts with ``prefix``: the
    versions are pinned there (and in jars/pom.xml) only."""
    for line in CHECKSUMS.read_text().splitlines():
        name = line.split()[-1]
        if name.startswith(prefix):
            return JARS_DIR / name
    raise LookupError(f"no jar named {prefix}* in {CHECKSUMS}")


def s3a_jars() -> list[Path]:
    """What ``spark.jars`` needs for ``s3a://`` beside pyspark's own Hadoop."""
    return [pinned_jar(name) for name in ("hadoop-aws-", "bundle-", "analyticsaccelerator-")]


def java() -> str | None:
    """The java that tidemark's Spark uses too: ``$JAVA_HOME/bin/java``, else PATH's."""
    home = os.environ.get("JAVA_HOME")
    return os.path.join(home, "bin", "java") if home else shutil.which("java")


def require_object_store(*, spark: bool = False) -> None:
    """Skip the calling test (fail it under ``TIDEMARK_REQUIRE_OBJECT_STORE=1``) unless
    S3Proxy, Toxiproxy, Java and boto3 are there, and with ``spark`` the S3A jars."""
    needed = [pinned_jar("s3proxy-"), TOXIPROXY_SERVER, VERSITYGW]
    if spark:
        needed += s3a_jars()
    missing = [_shown(path) for path in needed if not path.is_file()]
    if java() is None:
        missing.append("java (17+)")
    if importlib.util.find_spec("boto3") is None:
        missing.append("boto3")
    if not missing:
        return
    message = f"object-store tests need {', '.join(missing)}: run `{INSTALL}`"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{message} ({REQUIRE_ENV}=1)", pytrace=False)
    pytest.skip(message)


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


class Child:
    """A server process of a test: output in a log file, SIGTERM when we die."""

    def __init__(
        self, name: str, argv: list[str], log: Path, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.log = log
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [*death_signal_prefix(signal.SIGTERM), *argv],
                env=None if env is None else {**os.environ, **env},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def log_tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"

    def wait_for_port(self, port: int, timeout_s: float) -> None:
        """Return once 127.0.0.1:``port`` accepts a connection; raise with the end of
        the log if the process exits first or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        while True:
            code = self.process.poll()
            if code is not None:
                raise RuntimeError(
                    f"{self.name} exited ({code}) before answering on port {port}; "
                    f"the end of its log ({self.log}):\n{self.log_tail()}"
                )
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"{self.name} did not answer on port {port} within {timeout_s:.0f} s; "
                    f"the end of its log ({self.log}):\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class S3Server:
    """A running S3 server (S3Proxy or versitygw, ``kind``): ``endpoint`` with one
    ``bucket``, files under ``basedir``."""

    endpoint: str
    port: int
    bucket: str
    basedir: Path
    child: Child
    identity: str = IDENTITY
    credential: str = CREDENTIAL
    kind: str = "s3proxy"

    def stop(self) -> None:
        self.child.stop()


def start_s3proxy(workdir: Path, bucket: str = "tidemark", timeout_s: float = 60) -> S3Server:
    """Start S3Proxy on a free port, its filesystem backend in ``workdir/data``, with
    ``bucket`` made and aws-v2-or-v4 authorization by ``IDENTITY``/``CREDENTIAL``."""
    basedir = workdir / "data"
    # the filesystem backend takes each folder of its basedir for a bucket
    (basedir / bucket).mkdir(parents=True)
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    properties = workdir / "s3proxy.conf"
    properties.write_text(
        "\n".join(
            [
                f"s3proxy.endpoint={endpoint}",
                "s3proxy.authorization=aws-v2-or-v4",
                f"s3proxy.identity={IDENTITY}",
                f"s3proxy.credential={CREDENTIAL}",
                "jclouds.provider=filesystem",
                f"jclouds.filesystem.basedir={basedir}",
                "",
            ]
        )
    )
    java_bin = java()
    assert java_bin is not None, "require_object_store() first"
    # a small heap and the serial collector: two cores, shared with Spark in the tests
    argv = [java_bin, "-Xmx256m", "-XX:+UseSerialGC", "-jar", str(pinned_jar("s3proxy-"))]
    child = Child("S3Proxy", [*argv, "--properties", str(properties)], workdir / "s3proxy.log")
    child.wait_for_port(port, timeout_s)
    return S3Server(endpoint, port, bucket, basedir, child)


def start_versitygw(workdir: Path, bucket: str = "tidemark", timeout_s: float = 30) -> S3Server:
    """Start versitygw on a free port with its POSIX backend in ``workdir/vgw``
    (each folder a bucket; ``bucket`` made), root credentials ``IDENTITY``/``CREDENTIAL``."""
    basedir = workdir / "vgw"
    (basedir / bucket).mkdir(parents=True)
    port = free_port()
    argv = [str(VERSITYGW), "--port", f"127.0.0.1:{port}", "posix", str(basedir)]
    env = {"ROOT_ACCESS_KEY": IDENTITY, "ROOT_SECRET_KEY": CREDENTIAL}
    child = Child("versitygw", argv, workdir / "versitygw.log", env=env)
    child.wait_for_port(port, timeout_s)
    return S3Server(f"http://127.0.0.1:{port}", port, bucket, basedir, child, kind="versitygw")


@dataclass
class Proxy:
    """One Toxiproxy proxy: clients connect to ``listen_port``, it relays to upstream."""

    name: str
    listen_port: int
    api: str
    _toxics: set[str] = field(default_factory=set)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.listen_port}"

    def add_toxic(
        self,
        kind: str,
        attributes: dict[str, int],
        *,
        stream: str = "downstream",
        toxicity: float = 1.0,
    ) -> str:
        """Add a toxic of ``kind`` (Toxiproxy's type name) and return its name."""
        name = f"{kind}_{stream}_{len(self._toxics)}_{secrets.token_hex(2)}"
        body = {
            "name": name,
            "type": kind,
            "stream": stream,
            "toxicity": toxicity,
            "attributes": attributes,
        }
        _call(f"{self.api}/proxies/{self.name}/toxics", "POST", body)
        self._toxics.add(name)
        return name

    def remove_toxic(self, name: str) -> None:
        _call(f"{self.api}/proxies/{self.name}/toxics/{name}", "DELETE")
        self._toxics.discard(name)

    def clear(self) -> None:
        """Remove every toxic this object added and enable the proxy again."""
        for name in list(self._toxics):
            self.remove_toxic(name)
        self.enable()

    def latency(self, ms: int, jitter_ms: int = 0) -> str:
        """Delay the server's replies by ``ms`` (± ``jitter_ms``)."""
        return self.add_toxic("latency", {"latency": ms, "jitter": jitter_ms})

    def reset_peer(self, after_ms: int = 0) -> str:
        """Reset each connection (TCP RST) ``after_ms`` after data starts to flow."""
        return self.add_toxic("reset_peer", {"timeout": after_ms}, stream="upstream")

    def timeout(self, ms: int = 0) -> str:
        """Swallow the data and close the connection after ``ms`` (0: never close): a
        server that went silent, as behind a black-holing network."""
        return self.add_toxic("timeout", {"timeout": ms}, stream="upstream")

    def disable(self) -> None:
        """Close the listener and every open connection (a partition: new connections
        are refused) until ``enable``."""
        _call(f"{self.api}/proxies/{self.name}", "POST", {"enabled": False})

    def enable(self) -> None:
        _call(f"{self.api}/proxies/{self.name}", "POST", {"enabled": True})

    @contextlib.contextmanager
    def partitioned(self) -> Iterator[None]:
        self.disable()
        try:
            yield
        finally:
            self.enable()


@dataclass
class Toxiproxy:
    """A running Toxiproxy server and its REST API address."""

    api: str
    child: Child

    def create_proxy(self, name: str, upstream_port: int) -> Proxy:
        """A proxy on a free port of 127.0.0.1 to 127.0.0.1:``upstream_port``."""
        port = free_port()
        body = {
            "name": name,
            "listen": f"127.0.0.1:{port}",
            "upstream": f"127.0.0.1:{upstream_port}",
            "enabled": True,
        }
        _call(f"{self.api}/proxies", "POST", body)
        return Proxy(name, port, self.api)

    def stop(self) -> None:
        self.child.stop()


def start_toxiproxy(workdir: Path, timeout_s: float = 30) -> Toxiproxy:
    port = free_port()
    argv = [str(TOXIPROXY_SERVER), "-host", "127.0.0.1", "-port", str(port)]
    child = Child("Toxiproxy", argv, workdir / "toxiproxy.log")
    child.wait_for_port(port, timeout_s)
    return Toxiproxy(f"http://127.0.0.1:{port}", child)


def _call(url: str, method: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            payload = response.read()
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"Toxiproxy {method} {url}: {exc.code} {exc.read()!r}") from None
    return json.loads(payload) if payload else None


@contextlib.contextmanager
def object_store(
    workdir: Path, bucket: str = "tidemark", kind: str = "s3proxy"
) -> Iterator[tuple[S3Server, Proxy]]:
    """An S3 server (``kind``: S3Proxy or versitygw) with ``bucket``, and a Toxiproxy
    proxy in front of it; both stopped after."""
    server = (
        start_versitygw(workdir, bucket) if kind == "versitygw" else start_s3proxy(workdir, bucket)
    )
    try:
        toxiproxy = start_toxiproxy(workdir)
        try:
            yield server, toxiproxy.create_proxy("s3", server.port)
        finally:
            toxiproxy.stop()
    finally:
        server.stop()


def s3_client(
    endpoint: str, *, connect_timeout: float = 2, read_timeout: float = 10, attempts: int = 1
) -> Any:
    """A boto3 S3 client for the test server: path-style, SigV4, no retries by default
    (a test of a fault wants to see the fault, not a retry hiding it)."""
    import boto3
    from botocore.config import Config

    config = Config(
        s3={"addressing_style": "path"},
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        retries={"mode": "standard", "total_max_attempts": attempts},
    )
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=IDENTITY,
        aws_secret_access_key=CREDENTIAL,
        config=config,
    )


@dataclass
class HttpFaults:
    """``http_faults``: an HTTP proxy that answers chosen requests with an S3 error of
    its own (``503 SlowDown``, ``403 AccessDenied``), the others passed on."""

    port: int
    child: Child

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def refuse(
        self, status: int, code: str, rate: float = 1.0, methods: tuple[str, ...] = ()
    ) -> None:
        """From now on answer a ``rate`` share of requests (of ``methods``; all when
        empty) with ``status`` and S3's error ``code``."""
        rule = {"status": status, "code": code, "rate": rate, "methods": list(methods)}
        _call(f"{self.endpoint}/__faults", "POST", rule)

    def clear(self) -> dict[str, Any]:
        """Pass everything on again; what was made up so far (by status) and passed."""
        return _call(f"{self.endpoint}/__faults", "DELETE")  # type: ignore[no-any-return]

    def counts(self) -> dict[str, Any]:
        return _call(f"{self.endpoint}/__faults", "GET")  # type: ignore[no-any-return]

    def stop(self) -> None:
        self.child.stop()


@contextlib.contextmanager
def http_faults(workdir: Path, upstream: str) -> Iterator[HttpFaults]:
    """``http_faults`` in a process of its own, in front of ``upstream``."""
    import sys

    port = free_port()
    argv = [sys.executable, str(Path(__file__).with_name("http_faults.py"))]
    child = Child(
        "http_faults",
        [*argv, "--port", str(port), "--upstream", upstream],
        workdir / "http_faults.log",
    )
    try:
        child.wait_for_port(port, 30)
        yield HttpFaults(port, child)
    finally:
        child.stop()
