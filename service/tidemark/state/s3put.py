"""One S3 PUT, spoken directly: signed with SigV4 here, sent over a connection each
thread keeps.

A flush round on an object store ends with a PUT per committed shape (its Delta log
entry), 450-500 of them at 1000 shapes, from the commit threads. Through botocore each
costs about 1.3 ms of Python CPU (its event hooks, request objects, signer and urllib3:
500 conditional PUTs on 64 threads to S3Proxy behind 20 ms, 2026-11-30), held under
the GIL the rest of the service also needs; made here, 0.3 ms. Only the path of a
PUT that the store takes or refuses goes this way:

- 200: the object is stored; its ETag is returned;
- 412: the condition (``If-None-Match: *`` or ``If-Match``) refused it: ``Refused``;
- anything else, a reply or a broken connection: ``Unsettled``, and the caller makes
  the PUT again through botocore, which has the retries (backoff with jitter), the
  redirects between regions and the error messages. A store that answers a direct PUT
  with an error botocore's PUT does not get is sent no direct PUT again
  (``DirectPuts.enabled``).

``sign`` is the pure part: a request's SigV4 headers from its facts and the time
(unit-tested against botocore's own signer).
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import ipaddress
import re
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

ALGORITHM: Final = "AWS4-HMAC-SHA256"
# a bucket that can be a host name's first label (virtual-hosted addressing)
_DNS_LABEL: Final = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")


@dataclass(frozen=True, slots=True)
class Credentials:
    key_id: str
    secret: str
    token: str = ""


class Refused(Exception):
    """The store refused the PUT's condition (412)."""


class Unsettled(Exception):
    """The direct PUT did not settle (another reply, a broken or timed-out connection):
    what happened is unknown, the PUT is to be made again (by botocore)."""

    def __init__(self, what: str, *, replied: bool) -> None:
        super().__init__(what)
        self.replied = replied  # the store answered (an HTTP status), not the network


def _signing_key(secret: str, day: str, region: str) -> bytes:
    key = hmac.new(("AWS4" + secret).encode(), day.encode(), hashlib.sha256).digest()
    for part in (region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def sign(
    host: str,
    path: str,
    body: bytes,
    headers: Mapping[str, str],
    credentials: Credentials,
    region: str,
    when: float,
    *,
    key_cache: dict[tuple[str, str], bytes] | None = None,
) -> dict[str, str]:
    """The headers of a SigV4-signed ``PUT`` of ``body`` to ``host`` + ``path`` (the
    path already URI-encoded) at ``when`` (epoch seconds): ``headers`` (lower-case
    names), ``host``, ``x-amz-date``, ``x-amz-content-sha256``, the session token when
    there is one, and ``authorization``. ``key_cache`` keeps the day's signing key."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(when))
    day = stamp[:8]
    digest = hashlib.sha256(body).hexdigest()
    signed = {**headers, "host": host, "x-amz-content-sha256": digest, "x-amz-date": stamp}
    if credentials.token:
        signed["x-amz-security-token"] = credentials.token
    names = sorted(signed)
    canonical = "\n".join(
        [
            "PUT",
            path,
            "",  # no query
            *(f"{name}:{' '.join(signed[name].split())}" for name in names),
            "",
            ";".join(names),
            digest,
        ]
    )
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = f"{ALGORITHM}\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    cache_key = (day, region)
    key = key_cache.get(cache_key) if key_cache is not None else None
    if key is None:
        key = _signing_key(credentials.secret, day, region)
        if key_cache is not None:
            key_cache[cache_key] = key
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    signed["authorization"] = (
        f"{ALGORITHM} Credential={credentials.key_id}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return signed


def _is_ip(host: str | None) -> bool:
    try:
        ipaddress.ip_address(host or "")
    except ValueError:
        return False
    return True


class DirectPuts:
    """PUTs to one store (its endpoint, or AWS's in ``region``), each thread over a
    connection of its own, kept between PUTs."""

    def __init__(
        self,
        endpoint: str,
        region: str,
        path_style: bool,
        credentials: Credentials,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
    ) -> None:
        if endpoint:
            parts = urllib.parse.urlsplit(endpoint)
            self._https = parts.scheme == "https"
            self._host = parts.netloc
            self._base = parts.path.rstrip("/")
        else:
            self._https, self._host, self._base = True, f"s3.{region}.amazonaws.com", ""
        # (an endpoint named by its IP address has no host names for buckets: botocore
        # addresses it by path whatever the setting, and so does this)
        self._path_style = path_style or _is_ip(parts.hostname if endpoint else None)
        self._region = region
        self._credentials = credentials
        self._timeouts = (connect_timeout_s, read_timeout_s)
        self._keys: dict[tuple[str, str], bytes] = {}
        self._local = threading.local()
        self.enabled = True

    def serves(self, bucket: str) -> bool:
        """Whether this bucket's PUTs can go directly: path-style addressing, or a
        bucket name that is a host name's label (else botocore's rules decide)."""
        return self.enabled and (self._path_style or bool(_DNS_LABEL.fullmatch(bucket)))

    def put(self, bucket: str, key: str, body: bytes, condition: Mapping[str, str]) -> str:
        """PUT ``body`` at ``key`` with ``condition`` (lower-case header names): the new
        ETag, ``Refused`` (412), or ``Unsettled``."""
        quoted = urllib.parse.quote(key, safe="/~")
        if self._path_style:
            host, path = self._host, f"{self._base}/{bucket}/{quoted}"
        else:
            host, path = f"{bucket}.{self._host}", f"{self._base}/{quoted}"
        headers = sign(
            host,
            path,
            body,
            condition,
            self._credentials,
            self._region,
            time.time(),
            key_cache=self._keys,
        )
        headers["content-length"] = str(len(body))
        try:
            connection = self._connection(host)
            connection.request("PUT", path, body=body, headers=headers)
            reply = connection.getresponse()
            reply.read()
        except (ssl.SSLCertVerificationError, socket.gaierror) as exc:
            # the store's certificate, or a bucket's host name, that botocore may see
            # otherwise (its own certificates, its own addressing): never better here
            self._drop()
            raise Unsettled(f"{type(exc).__name__}: {exc}", replied=True) from None
        except (OSError, http.client.HTTPException) as exc:
            self._drop()
            raise Unsettled(f"{type(exc).__name__}: {exc}", replied=False) from None
        if reply.will_close:
            self._drop()
        if reply.status == 200:
            etag = reply.getheader("ETag")
            if etag:
                return etag
            raise Unsettled("200 without an ETag", replied=True)
        if reply.status == 412:
            raise Refused()
        raise Unsettled(f"HTTP {reply.status}", replied=reply.status < 500)

    def _connection(self, host: str) -> http.client.HTTPConnection:
        held: tuple[str, http.client.HTTPConnection] | None = getattr(self._local, "held", None)
        if held is not None and held[0] == host:
            return held[1]
        if held is not None:
            held[1].close()
        connect_s, read_s = self._timeouts
        connection: http.client.HTTPConnection
        if self._https:
            connection = http.client.HTTPSConnection(
                host, timeout=connect_s, context=ssl.create_default_context()
            )
        else:
            connection = http.client.HTTPConnection(host, timeout=connect_s)
        connection.connect()
        if connection.sock is not None:
            connection.sock.settimeout(read_s)
        self._local.held = (host, connection)
        return connection

    def _drop(self) -> None:
        held = getattr(self._local, "held", None)
        if held is not None:
            held[1].close()
            self._local.held = None
