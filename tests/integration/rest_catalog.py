"""Iceberg's own REST catalog server for the tests: ``RESTCatalogServer`` of
iceberg-open-api's test fixtures (``make readers`` puts it and what it needs in
``.jars/restcatalog``), serving a ``JdbcCatalog`` on a SQLite file over HTTP. The
table metadata files are written by the server (Hadoop's local file system, from the
pyspark of ``.venv``); the data files and manifests by the client, as with any REST
catalog."""

from __future__ import annotations

import http.server
import json
import secrets
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pyspark

from tidemark.demo.postgres import free_port

from .object_store_support import Child, java

REPO = Path(__file__).resolve().parents[2]
JARS = REPO / ".jars" / "restcatalog"
CHECKSUMS = REPO / "jars" / "restcatalog" / "checksums.sha256"
MAIN = "org.apache.iceberg.rest.RESTCatalogServer"


@dataclass
class RestCatalog:
    """A running REST catalog: ``uri`` for ``[iceberg] catalog_uri``."""

    uri: str
    port: int
    workdir: Path
    child: Child

    def stop(self) -> None:
        self.child.stop()


def class_path() -> str:
    """The server's jars (as pinned) and Hadoop's client jars from pyspark."""
    names = [line.split()[-1] for line in CHECKSUMS.read_text().splitlines() if line.strip()]
    missing = [name for name in names if not (JARS / name).is_file()]
    assert not missing, (
        f"the REST catalog server is not installed ({missing[:3]}): run make readers"
    )
    hadoop = sorted((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-*.jar"))
    assert hadoop, "pyspark ships no hadoop-client jars"
    return ":".join(str(p) for p in [*(JARS / n for n in names), *hadoop])


def start_rest_catalog(workdir: Path, timeout_s: float = 60) -> RestCatalog:
    """Start the server on a free port, its catalog in ``workdir/catalog.db`` and new
    tables' default warehouse ``workdir/warehouse``; return once it answers."""
    java_bin = java()
    assert java_bin is not None, "the REST catalog server needs java (17+)"
    (workdir / "warehouse").mkdir(parents=True, exist_ok=True)
    port = free_port()
    # the server reads its catalog's properties from CATALOG_* (CATALOG_A_B: a.b)
    env = {
        "CATALOG_URI": f"jdbc:sqlite:{workdir / 'catalog.db'}",
        "CATALOG_WAREHOUSE": (workdir / "warehouse").as_uri(),
        "CATALOG_REST_PORT": str(port),
    }
    # a small heap and the serial collector: two cores, shared with Spark in the tests
    argv = [java_bin, "-Xmx256m", "-XX:+UseSerialGC", "-cp", class_path(), MAIN]
    child = Child("the REST catalog", argv, workdir / "rest-catalog.log", env=env)
    child.wait_for_port(port, timeout_s)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while True:  # (the port opens a moment before the servlet answers)
        try:
            with urllib.request.urlopen(f"{uri}/v1/config", timeout=5) as answer:
                json.load(answer)
            break
        except OSError:
            if time.monotonic() > deadline:
                child.stop()
                raise
            time.sleep(0.1)
    return RestCatalog(uri, port, workdir, child)


# the request headers a gateway does not pass on (its own, or the client's encoding wish:
# an answer goes back as the catalog gave it, so it is not compressed on the way)
_NOT_FORWARDED = ("host", "authorization", "content-length", "connection", "accept-encoding")


class AuthGateway:
    """An OAuth2 gateway in front of a REST catalog, as a deployment puts one before a
    catalog that has none of its own (Iceberg's server has none): a real HTTP server on
    a free port that hands out tokens at ``/v1/oauth/tokens`` (the client-credentials
    grant of the REST spec) for one ``client_id:client_secret`` only, and forwards a
    request to the catalog only with a token it handed out and has not revoked. A
    refusal is the spec's: 401 with ``invalid_client`` at the token endpoint, 401 with
    the REST error model (``NotAuthorizedException``) elsewhere."""

    def __init__(self, upstream: str, credential: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.credential = credential
        self.tokens: set[str] = set()
        self.refused = 0
        # (method, path ending) pairs it forbids (403), whatever the token: a principal
        # that may not do that
        self.forbidden: set[tuple[str, str]] = set()
        gateway = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # (quiet)
                pass

            def do_GET(self) -> None:
                gateway.handle(self)

            do_POST = do_DELETE = do_HEAD = do_PUT = do_GET

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.uri = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def revoke(self) -> None:
        """Every token handed out stops working, and the secret changes (rotated)."""
        self.tokens.clear()
        self.credential = f"{self.credential.split(':')[0]}:{secrets.token_hex(8)}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def handle(self, request: http.server.BaseHTTPRequestHandler) -> None:
        length = int(request.headers.get("Content-Length") or 0)
        body = request.rfile.read(length) if length else None
        if request.path.rstrip("/").endswith("/v1/oauth/tokens"):
            form = urllib.parse.parse_qs((body or b"").decode())
            given = f"{form.get('client_id', [''])[0]}:{form.get('client_secret', [''])[0]}"
            if given != self.credential:
                self.refused += 1
                refusal = {"error": "invalid_client", "error_description": "unknown client"}
                _answer(request, 401, json.dumps(refusal).encode())
                return
            token = secrets.token_hex(16)
            self.tokens.add(token)
            granted = {
                "access_token": token,
                "token_type": "bearer",
                "expires_in": 3600,
                "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
            }
            _answer(request, 200, json.dumps(granted).encode())
            return
        bearer = (request.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
        if bearer not in self.tokens:
            self.refused += 1
            error = {"message": "no valid token", "type": "NotAuthorizedException", "code": 401}
            _answer(request, 401, json.dumps({"error": error}).encode())
            return
        if any(
            request.command == method and request.path.rstrip("/").endswith(path)
            for method, path in self.forbidden
        ):
            self.refused += 1
            error = {"message": "not allowed", "type": "ForbiddenException", "code": 403}
            _answer(request, 403, json.dumps({"error": error}).encode())
            return
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _NOT_FORWARDED}
        forwarded = urllib.request.Request(
            self.upstream + request.path, data=body, headers=headers, method=request.command
        )
        try:
            with urllib.request.urlopen(forwarded, timeout=60) as answer:
                _answer(request, answer.status, answer.read(), answer.headers.get("Content-Type"))
        except urllib.error.HTTPError as refused:
            _answer(request, refused.code, refused.read(), refused.headers.get("Content-Type"))


def _answer(
    request: http.server.BaseHTTPRequestHandler,
    status: int,
    payload: bytes,
    kind: str | None = "application/json",
) -> None:
    request.send_response(status)
    request.send_header("Content-Type", kind or "application/json")
    request.send_header("Content-Length", str(len(payload)))
    request.end_headers()
    request.wfile.write(payload)
