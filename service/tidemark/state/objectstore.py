"""Where a sink root's files are: a local folder, or an S3 bucket and prefix.

A *location* is a local path (``str`` or ``Path``) or an ``s3://bucket/key`` URI
(always a ``str``: ``Path`` would fold its ``//``). ``join`` builds locations under a
root of either kind; the other functions read and write one whole object:

- ``read``: its bytes, or None when it does not exist;
- ``replace``: the object made to hold ``data``, whole (a reader sees the old bytes or
  the new ones), durable when the call returns. Local: ``durable.write_atomically``.
  S3: one PUT that is conditional on what this process last saw of the key:
  ``If-Match`` on the ETag it read or wrote last, ``If-None-Match: *`` when it saw the
  key absent. Another writer's PUT in between (a new leader's, this process being
  deposed while paused) makes the store itself refuse ours: ``StoreConflict``. A key
  this process has never seen is looked at (HEAD) first and taken as it is;
- ``put_if_absent``: creates the object unless the key exists (False then): a Delta
  log entry. Local: ``durable.publish_new``; S3: ``If-None-Match: *``;
- ``listing`` and ``delete`` for folders of files (a batch's data files, leftovers).

Durable on S3 means the PUT returned success: S3 (and every compatible store tidemark
is tested against) makes an object visible and durable together, so there is nothing
to sync. A retried PUT whose first attempt succeeded but whose reply was lost meets its
own object: a refusal (412) is checked against the stored bytes before it is taken
for another writer's, so a retry is never mistaken for a conflict.

A PUT goes first as tidemark makes it itself (``s3put``: signed here, over a kept
connection, a fifth of botocore's CPU): what it cannot settle (an error reply, a broken
connection) is made again through botocore.

Retries: botocore's ``standard`` mode (exponential backoff with full jitter, on
throttling such as ``503 SlowDown``, 5xx replies, timeouts and broken connections), up
to ``S3Settings.attempts`` tries; what still fails raises ``StoreUnavailable`` naming
the store, and the caller's own retry (a flush round's) takes over.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import structlog

from tidemark.errors import SinkError
from tidemark.state import durable, s3put

log = structlog.get_logger("tidemark.objectstore")

Location = str | Path
SCHEME: Final = "s3://"
_ABSENT: Final = ""  # the remembered tag of a key seen absent


class StoreConflict(SinkError):
    """The store refused a conditional write: another writer created or replaced the
    object since this process last saw it."""


class StoreUnavailable(SinkError):
    """The object store could not be reached, or refused the request, after retries."""


def is_remote(location: Location) -> bool:
    return isinstance(location, str) and location.startswith(SCHEME)


def join(root: Location, *parts: str) -> Location:
    """``root``/``parts``: a ``Path`` for a local root, an ``s3://`` URI for a remote one."""
    if is_remote(root):
        assert isinstance(root, str)
        return posixpath.join(root.rstrip("/"), *parts)
    return Path(root).joinpath(*parts)


def split(uri: str) -> tuple[str, str]:
    """``s3://bucket/key`` -> (bucket, key); the key has no leading slash."""
    bucket, _, key = uri[len(SCHEME) :].partition("/")
    return bucket, key.strip("/")


def local_dir(root: Location) -> Path:
    """A local folder for what a root's work needs on disk and nobody reads back
    after a restart (spool files, a round's hand-over files): the root itself when it
    is local; for an ``s3://`` root a folder under the system's temp folder (or
    ``$TIDEMARK_SCRATCH``), one per bucket and prefix."""
    if not is_remote(root):
        return Path(root)
    bucket, prefix = split(str(root))
    base = Path(os.environ.get("TIDEMARK_SCRATCH") or Path(tempfile.gettempdir()) / "tidemark")
    return base.joinpath("s3", bucket, *[p for p in prefix.split("/") if p])


def s3a(location: Location) -> str:
    """The location as Spark's Hadoop names it (``s3a://`` for S3, the path for disk)."""
    if is_remote(location):
        return "s3a://" + str(location)[len(SCHEME) :]
    return str(location)


@dataclass(frozen=True, slots=True)
class Listed:
    """One object (file) below a listed location."""

    name: str  # relative to the listed location, '/'-separated
    size: int
    modified_ms: int


# ---- the S3 side -------------------------------------------------------------------


@dataclass(frozen=True)
class S3Access:
    """How to reach the store: what ``[s3]`` says, credentials resolved."""

    endpoint: str = ""
    region: str = "us-east-1"
    path_style: bool = False
    access_key_id: str = ""
    secret_access_key: str = ""
    session_token: str = ""
    profile: str = ""
    attempts: int = 5
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0

    def __repr__(self) -> str:  # never the secret
        return f"S3Access(endpoint={self.endpoint!r}, region={self.region!r})"

    @classmethod
    def from_settings(cls, s3: Any) -> S3Access:
        """From ``[s3]`` (``tidemark.settings.config.S3Settings``: not imported, it is above)."""
        secret = s3.secret_access_key.get_secret_value()
        return cls(
            endpoint=s3.endpoint,
            region=s3.region,
            path_style=s3.path_style,
            access_key_id=s3.access_key_id,
            secret_access_key=secret,
            profile=s3.profile,
            attempts=s3.attempts,
            connect_timeout_s=s3.connect_timeout_s,
            read_timeout_s=s3.read_timeout_s,
        )

    def credentials(self) -> tuple[str, str, str]:
        """(key id, secret, session token) as the AWS chain finds them: ``[s3]``'s own,
        else the environment, a credentials file (``profile``), an instance role."""
        if self.access_key_id and self.secret_access_key:
            return self.access_key_id, self.secret_access_key, self.session_token
        import boto3

        found = boto3.Session(profile_name=self.profile or None).get_credentials()
        if found is None:
            raise SinkError(
                "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a "
                "credentials file ([s3] profile or AWS_PROFILE), or [s3] access_key_id "
                "with secret_access_key_file"
            )
        frozen = found.get_frozen_credentials()
        return frozen.access_key, frozen.secret_key, frozen.token or ""

    def client(self) -> Any:
        import boto3
        from botocore.config import Config

        key, secret, token = self.credentials()
        config = Config(
            s3={"addressing_style": "path" if self.path_style else "auto"},
            connect_timeout=self.connect_timeout_s,
            read_timeout=self.read_timeout_s,
            retries={"mode": "standard", "total_max_attempts": self.attempts},
            max_pool_connections=128,
            # a conditional PUT is refused with 412, never retried as a checksum error
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint or None,
            region_name=self.region,
            aws_access_key_id=key,
            aws_secret_access_key=secret,
            aws_session_token=token or None,
            config=config,
        )
        # (after botocore's own handler of the same event, which adds the header)
        client.meta.events.register_last("before-call.s3", _send_body_at_once)
        return client

    def hadoop_conf(self) -> dict[str, str]:
        """S3A's settings for this store (``spark.hadoop.`` keys). The secret is in
        them: Spark redacts keys that name a secret in its UI and logs."""
        key, secret, token = self.credentials()
        conf = {
            "fs.s3a.endpoint.region": self.region,
            "fs.s3a.path.style.access": str(self.path_style).lower(),
            "fs.s3a.access.key": key,
            "fs.s3a.secret.key": secret,
            # what S3A buffers a part of an upload in: memory (its disk buffer goes
            # through the local filesystem tidemark's session replaces)
            "fs.s3a.fast.upload.buffer": "bytebuffer",
            # ... a block of this size for every file being written, whatever its size
            # (S3A's 64 MB: 32 write tasks took the JVM's 2 GB of direct memory, and a
            # file larger than a block goes up in parts of it)
            "fs.s3a.multipart.size": "16M",
            # a batch's folder is new: S3A need not look for a file or folder in the way
            # of each file it creates (a HEAD and a LIST saved per file)
            "fs.s3a.create.performance": "true",
            "fs.s3a.attempts.maximum": str(self.attempts),
            "fs.s3a.retry.limit": str(self.attempts),
            # a store that throttles (503 SlowDown) gets as many tries, not S3A's 20
            "fs.s3a.retry.throttle.limit": str(self.attempts),
            # no audit span and Referer header built per request (S3A's auditing: 5% of
            # the JVM's samples in a round of 500 shapes on S3, 2026-11-30)
            "fs.s3a.audit.enabled": "false",
        }
        if token:
            conf["fs.s3a.session.token"] = token
            conf["fs.s3a.aws.credentials.provider"] = (
                "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
            )
        if self.endpoint:
            conf["fs.s3a.endpoint"] = self.endpoint
            conf["fs.s3a.connection.ssl.enabled"] = str(
                self.endpoint.startswith("https://")
            ).lower()
        return conf

    def storage_options(self) -> dict[str, str]:
        """The same store for ``deltalake`` and Polars (object_store's keys)."""
        key, secret, token = self.credentials()
        options = {
            "AWS_ACCESS_KEY_ID": key,
            "AWS_SECRET_ACCESS_KEY": secret,
            "AWS_REGION": self.region,
            "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": str(not self.path_style).lower(),
        }
        if token:
            options["AWS_SESSION_TOKEN"] = token
        if self.endpoint:
            options["AWS_ENDPOINT_URL"] = self.endpoint
            if self.endpoint.startswith("http://"):
                options["AWS_ALLOW_HTTP"] = "true"
        return options


class _S3:
    """The process's S3 client, what it last saw of each key (its ETag), and how many
    requests of each kind it made (``requests``: GET, HEAD, PUT, LIST, DELETE)."""

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()
        self.access: S3Access | None = None
        self._client: Any = None
        self._direct: s3put.DirectPuts | None = None
        self.arrow: Any = None  # a pyarrow S3FileSystem (``arrow_filesystem``)
        self._lock = threading.Lock()
        self._tags: dict[str, str] = {}  # uri -> ETag last read or written ('' absent)
        self._writing: dict[str, threading.Lock] = {}  # uri -> held while replacing it

    def configure(self, access: S3Access | None) -> None:
        with self._lock:
            self.access = access
            self._client = self.arrow = self._direct = None
            self._tags.clear()

    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                if self.access is None:
                    raise SinkError(
                        "an s3:// location, and no [s3] settings: set [sink] root in a "
                        "configuration with an [s3] section (its endpoint and region)"
                    )
                self._client = self.access.client()
            return self._client

    def direct(self) -> s3put.DirectPuts:
        """The PUTs tidemark makes itself (``s3put``), on the same store."""
        with self._lock:
            if self._direct is None:
                access = self.access
                if access is None:
                    raise SinkError("an s3:// location, and no [s3] settings")
                key, secret, token = access.credentials()
                self._direct = s3put.DirectPuts(
                    access.endpoint,
                    access.region,
                    access.path_style,
                    s3put.Credentials(key, secret, token),
                    connect_timeout_s=access.connect_timeout_s,
                    read_timeout_s=access.read_timeout_s,
                )
                # credentials of a role, which expire, are botocore's to renew: its PUTs
                self._direct.enabled = not token or bool(access.access_key_id)
            return self._direct

    def count(self, kind: str) -> None:
        with self._lock:
            self.requests[kind] += 1

    def seen(self, uri: str, tag: str) -> None:
        with self._lock:
            self._tags[uri] = tag

    def writing(self, uri: str) -> threading.Lock:
        """The lock of ``uri``'s replacements in this process: two threads replacing one
        state file (a periodic write and the one at a stop) take turns, the second
        with the ETag the first got, instead of the store refusing one of them."""
        with self._lock:
            return self._writing.setdefault(uri, threading.Lock())

    def tag(self, uri: str) -> str | None:
        with self._lock:
            return self._tags.get(uri)


_STORE = _S3()


def configure(access: S3Access | None) -> None:
    """The store ``s3://`` locations are on for this process (None: none)."""
    _STORE.configure(access)


def s3_access() -> S3Access | None:
    return _STORE.access


def _failed(action: str, uri: str, exc: Exception) -> SinkError:
    """What a failed request says: the store, the key, and what to do."""
    code, status = _error_code(exc)
    if code in ("NoSuchBucket",):
        bucket = split(uri)[0]
        return StoreUnavailable(
            f"cannot {action} {uri}: the bucket {bucket!r} does not exist: create it, or "
            "set [sink] root to an existing bucket"
        )
    if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied") or status == 403:
        return StoreUnavailable(f"cannot {action} {uri} ({code or status}): {CREDENTIALS_HINT}")
    if code in THROTTLED or status == 503:
        return StoreUnavailable(
            f"cannot {action} {uri}: {code or status} to all {_attempts()} tries: {THROTTLED_HINT}"
        )
    what = f"{code or type(exc).__name__}: {exc}"
    endpoint = (_STORE.access.endpoint if _STORE.access else "") or "AWS"
    return StoreUnavailable(
        f"cannot {action} {uri} after retries ({what}): is the store at {endpoint} "
        "reachable? Check [s3] endpoint and the network to it"
    )


THROTTLED = ("SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded")
THROTTLED_HINT = (
    "the store is throttling requests: the round is retried, and passes once the store "
    "takes requests again; if it lasts, raise [s3] attempts or ask for a higher request "
    "rate on the bucket"
)
CREDENTIALS_HINT = (
    "the store refused the credentials: check [s3] access_key_id and its secret (or "
    "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY), and that they may read, write, list and "
    "delete under the root"
)
UNREACHABLE_HINT = "is the store reachable? Check [s3] endpoint and the network to it"


def hint_for(failure: str) -> str | None:
    """What to do about a failure of S3A (Spark's S3 client) in ``failure``'s text (the
    same advice as for tidemark's own requests); None when it is not one."""
    if "AWSServiceThrottledException" in failure or "SlowDown" in failure:
        return THROTTLED_HINT
    if any(
        word in failure
        for word in ("AccessDeniedException", "InvalidAccessKeyId", "SignatureDoesNotMatch")
    ):
        return CREDENTIALS_HINT
    if any(
        word in failure
        for word in ("UnknownHostException", "ConnectException", "AWSClientIOException")
    ):
        return UNREACHABLE_HINT
    return None


def _attempts() -> int:
    return _STORE.access.attempts if _STORE.access else 1


def _error_code(exc: Exception) -> tuple[str, int]:
    response = getattr(exc, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return code, status


def _is_missing(exc: Exception) -> bool:
    code, status = _error_code(exc)
    return code in ("NoSuchKey", "404", "NotFound") or (status == 404 and code != "NoSuchBucket")


def _is_refused(exc: Exception) -> bool:
    code, status = _error_code(exc)
    return status == 412 or code in ("PreconditionFailed", "ConditionalRequestConflict")


def read_tail(location: Location, nbytes: int) -> bytes:
    """The last ``nbytes`` of an object (all of it when smaller): one ranged GET."""
    from botocore.exceptions import BotoCoreError, ClientError

    uri = str(location)
    bucket, key = split(uri)
    _STORE.count("GET")
    try:
        reply = _STORE.client().get_object(Bucket=bucket, Key=key, Range=f"bytes=-{nbytes}")
        return reply["Body"].read()
    except (ClientError, BotoCoreError) as exc:
        raise _failed("read", uri, exc) from None


def note_request(kind: str) -> None:
    """Count a request made to the store with pyarrow's client (``arrow_filesystem``)."""
    _STORE.count(kind)


def requests_made() -> dict[str, int]:
    """The requests this process made through this module, by kind, and those noted
    with ``note_request`` (not Spark's, not the Delta library's own)."""
    with _STORE._lock:
        return dict(_STORE.requests)


def _get(uri: str) -> tuple[bytes, str] | None:
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = split(uri)
    _STORE.count("GET")
    try:
        reply = _STORE.client().get_object(Bucket=bucket, Key=key)
        return reply["Body"].read(), reply["ETag"]
    except ClientError as exc:
        if _is_missing(exc):
            return None
        raise _failed("read", uri, exc) from None
    except BotoCoreError as exc:
        raise _failed("read", uri, exc) from None


def _head_tag(uri: str) -> str:
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = split(uri)
    _STORE.count("HEAD")
    try:
        return str(_STORE.client().head_object(Bucket=bucket, Key=key)["ETag"])
    except ClientError as exc:
        if _is_missing(exc):
            return _ABSENT
        raise _failed("look at", uri, exc) from None
    except BotoCoreError as exc:
        raise _failed("look at", uri, exc) from None


def _send_body_at_once(model: Any, params: dict[str, Any], **_: Any) -> None:
    """A PUT of an object sends its body with its headers: botocore asks the store to
    accept the headers first (``Expect: 100-continue``) for any body, a round trip
    more before the body goes, which only pays for a body too large to send in vain.
    tidemark's PUTs (log entries, state files, checkpoints) are bytes in memory."""
    if model.name == "PutObject":
        params.get("headers", {}).pop("Expect", None)


def _put(uri: str, data: bytes, condition: dict[str, str]) -> str | None:
    """One PUT; its new ETag, or None when the condition refused it (after checking
    that the object refused against is not this very write, retried)."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = split(uri)
    _STORE.count("PUT")
    direct = _STORE.direct()
    unsettled: s3put.Unsettled | None = None
    if direct.serves(bucket):
        headers = {_HEADER[name]: value for name, value in condition.items()}
        try:
            return direct.put(bucket, key, data, headers)
        except s3put.Refused:
            return _own(uri, data)
        except s3put.Unsettled as exc:
            unsettled = exc  # (made again below)
    try:
        reply = _STORE.client().put_object(Bucket=bucket, Key=key, Body=data, **condition)
    except ClientError as exc:
        if not _is_refused(exc):
            raise _failed("write", uri, exc) from None
        return _own(uri, data)
    except BotoCoreError as exc:
        raise _failed("write", uri, exc) from None
    if unsettled is not None and unsettled.replied and direct.enabled:
        # the store refuses what tidemark sends and takes botocore's: botocore's only
        direct.enabled = False
        log.warning("objectstore.direct_puts_off", uri=uri, direct_reply=str(unsettled))
    return str(reply["ETag"])


_HEADER: Final = {"IfNoneMatch": "if-none-match", "IfMatch": "if-match"}


def _own(uri: str, data: bytes) -> str | None:
    """After a refused PUT of ``data``: the ETag of the object at ``uri`` when it holds
    ``data`` (this very PUT, stored by an attempt whose reply was lost), else None."""
    held = _get(uri)
    if held is not None and held[0] == data:
        return held[1]  # a retry of our own PUT, whose first attempt was stored
    return None


def arrow_filesystem() -> Any:
    """A ``pyarrow.fs.S3FileSystem`` on the configured store (for Parquet footers and
    reads of data files), made once."""
    with _STORE._lock:
        made = _STORE.arrow
        if made is not None:
            return made
    access = _STORE.access
    if access is None:
        raise SinkError("an s3:// location, and no [s3] settings")
    from pyarrow import fs

    key, secret, token = access.credentials()
    options: dict[str, Any] = {
        "access_key": key,
        "secret_key": secret,
        "region": access.region,
        "connect_timeout": access.connect_timeout_s,
        "request_timeout": access.read_timeout_s,
        "retry_strategy": fs.AwsStandardS3RetryStrategy(max_attempts=access.attempts),
    }
    if token:
        options["session_token"] = token
    if access.endpoint:
        scheme, _, host = access.endpoint.partition("://")
        options |= {"endpoint_override": host.rstrip("/"), "scheme": scheme}
    if not access.path_style and not access.endpoint:
        options["force_virtual_addressing"] = True
    made = fs.S3FileSystem(**options)
    with _STORE._lock:
        _STORE.arrow = made
    return made


def storage_options(location: Location) -> dict[str, str] | None:
    """What ``deltalake`` (and Polars) need to reach ``location``: None for a local
    one. Its conditional PUTs are on by default for S3 (object_store's ``If-None-Match``)."""
    if not is_remote(location):
        return None
    access = _STORE.access
    if access is None:
        raise SinkError("an s3:// location, and no [s3] settings")
    return access.storage_options()


def arrow_path(location: Location) -> str:
    """The location as pyarrow's S3 filesystem names it (``bucket/key``)."""
    return str(location)[len(SCHEME) :] if is_remote(location) else str(location)


# ---- one API for both -----------------------------------------------------------


def read(location: Location) -> bytes | None:
    """The object's bytes, None when it does not exist."""
    if is_remote(location):
        uri = str(location)
        got = _get(uri)
        _STORE.seen(uri, _ABSENT if got is None else got[1])
        return None if got is None else got[0]
    try:
        return Path(location).read_bytes()
    except FileNotFoundError:
        return None


def read_text(location: Location) -> str | None:
    data = read(location)
    return None if data is None else data.decode("utf-8")


def exists(location: Location) -> bool:
    if is_remote(location):
        return _head_tag(str(location)) != _ABSENT
    return Path(location).exists()


def replace(
    location: Location, data: str | bytes, *, check: Callable[[], None] | None = None
) -> None:
    """Make ``location`` hold ``data``, whole and durable (see the module docstring);
    ``check`` (a fence) is called before the write, and for a local file again right
    before its rename. ``StoreConflict`` when another writer replaced it first (S3)."""
    raw = data.encode() if isinstance(data, str) else data
    if not is_remote(location):
        durable.write_atomically(Path(location), raw, check=check)
        return
    uri = str(location)
    if check is not None:
        check()
    with _STORE.writing(uri):
        tag = _STORE.tag(uri)
        if tag is None:
            tag = _head_tag(uri)
        condition = {"IfNoneMatch": "*"} if tag == _ABSENT else {"IfMatch": tag}
        new = _put(uri, raw, condition)
        if new is None:
            raise StoreConflict(
                f"another writer replaced {uri} since this process read it: this process "
                "stops writing under the sink root (run one tidemark per slot and sink "
                "root; a deposed leader's writes are refused by the store)"
            )
        _STORE.seen(uri, new)


def put_if_absent(location: Location, data: bytes) -> bool:
    """Create ``location`` holding ``data`` unless it exists (False then), durably."""
    if not is_remote(location):
        path = Path(location)
        fd, temp = tempfile.mkstemp(
            prefix=f".{path.name}.", suffix=durable.TEMP_SUFFIX, dir=path.parent
        )
        os.close(fd)
        os.unlink(temp)
        durable.write_synced(Path(temp), data)
        return durable.publish_new(Path(temp), path)
    uri = str(location)
    new = _put(uri, data, {"IfNoneMatch": "*"})
    if new is None:
        return False
    _STORE.seen(uri, new)
    return True


def listing(location: Location) -> list[Listed]:
    """Every file below ``location`` (recursively), by name."""
    if not is_remote(location):
        top = Path(location)
        found = []
        for folder, _, names in os.walk(top):
            for name in names:
                path = Path(folder) / name
                st = path.stat()
                rel = path.relative_to(top).as_posix()
                found.append(Listed(rel, st.st_size, int(st.st_mtime * 1000)))
        return sorted(found, key=lambda f: f.name)
    found = [
        Listed(
            item["Key"][len(prefix) :],
            int(item["Size"]),
            int(item["LastModified"].timestamp() * 1000),
        )
        for prefix, page in _pages(location)
        for item in page.get("Contents", ())
    ]
    return sorted(found, key=lambda f: f.name)


def _pages(location: Location, **options: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """The pages of a listing below ``location`` (``options``: of ``list_objects_v2``),
    each with the key prefix the listing stripped from names; one request a page."""
    from botocore.exceptions import BotoCoreError, ClientError

    uri = str(location)
    bucket, prefix = split(uri)
    prefix = prefix + "/" if prefix else ""
    try:
        pages = _STORE.client().get_paginator("list_objects_v2")
        for page in pages.paginate(Bucket=bucket, Prefix=prefix, **options):
            _STORE.count("LIST")
            yield prefix, page
    except (ClientError, BotoCoreError) as exc:
        raise _failed("list", uri, exc) from None


def first_names(location: Location, count: int) -> list[str]:
    """The names of the first ``count`` files below ``location`` in the store's order
    (by key): one LIST request, its reply at most ``count`` keys long."""
    from botocore.exceptions import BotoCoreError, ClientError

    uri = str(location)
    bucket, prefix = split(uri)
    prefix = prefix + "/" if prefix else ""
    _STORE.count("LIST")
    try:
        reply = _STORE.client().list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=count)
    except (ClientError, BotoCoreError) as exc:
        raise _failed("list", uri, exc) from None
    return [item["Key"][len(prefix) :] for item in reply.get("Contents", ())]


def folders(location: Location) -> set[str]:
    """The names of the folders right below ``location`` (on a store: the common
    prefixes of one delimited listing, a request per 1000 names, not one per name)."""
    if not is_remote(location):
        top = Path(location)
        return {p.name for p in top.iterdir() if p.is_dir()} if top.is_dir() else set()
    return {
        common["Prefix"][len(prefix) :].rstrip("/")
        for prefix, page in _pages(location, Delimiter="/")
        for common in page.get("CommonPrefixes", ())
    }


def copy(source: str, target: str) -> None:
    """Copy one object to another key of the same store (S3's CopyObject: the bytes stay
    on the server). Both ``s3://`` URIs."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = split(source)
    to_bucket, to_key = split(target)
    _STORE.count("COPY")
    try:
        reply = _STORE.client().copy_object(
            Bucket=to_bucket, Key=to_key, CopySource={"Bucket": bucket, "Key": key}
        )
    except (ClientError, BotoCoreError) as exc:
        raise _failed("copy", source, exc) from None
    _STORE.seen(target, reply["CopyObjectResult"]["ETag"])


def delete(locations: Iterable[Location]) -> None:
    """Remove files (a missing one is no error); for S3 up to 1000 in one request."""
    remote: dict[str, list[str]] = {}
    for location in locations:
        if is_remote(location):
            bucket, key = split(str(location))
            remote.setdefault(bucket, []).append(key)
        else:
            with contextlib.suppress(FileNotFoundError):
                Path(location).unlink()
    if not remote:
        return
    from botocore.exceptions import BotoCoreError, ClientError

    for bucket, keys in remote.items():
        for start in range(0, len(keys), 1000):
            chunk = [{"Key": k} for k in keys[start : start + 1000]]
            _STORE.count("DELETE")
            try:
                _STORE.client().delete_objects(
                    Bucket=bucket, Delete={"Objects": chunk, "Quiet": True}
                )
            except (ClientError, BotoCoreError) as exc:
                raise _failed("delete", f"{SCHEME}{bucket}/{chunk[0]['Key']}", exc) from None
        for key in keys:
            _STORE.seen(f"{SCHEME}{bucket}/{key}", _ABSENT)
