"""``tidemark.state.s3put.sign``: a PUT signed here carries the signature botocore's own
SigV4 signer gives the same request at the same moment (no server: the signature is a
function of the request, the credentials and the time)."""

from __future__ import annotations

import calendar
import time
import urllib.parse

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials as BotoCredentials

from tidemark.state import s3put


def botocore_signed(
    url: str, body: bytes, headers: dict[str, str], key: str, secret: str, token: str | None
) -> dict[str, str]:
    request = AWSRequest(method="PUT", url=url, data=body, headers=headers)
    S3SigV4Auth(BotoCredentials(key, secret, token), "s3", "eu-west-1").add_auth(request)
    return {name.lower(): str(value) for name, value in request.headers.items()}


@pytest.mark.parametrize(
    ("key", "condition", "token"),
    [
        ("t/_delta_log/00000000000000000001.json", {"if-none-match": "*"}, None),
        ("t/_tidemark/frontiers.json", {"if-match": '"5d41402abc4b2a76b9719d911017c592"'}, None),
        ("shapes/a b/é=1/_delta_log/00000000000000000012.json", {"if-none-match": "*"}, "tok/en+="),
    ],
)
def test_a_put_is_signed_as_botocore_signs_it(
    key: str, condition: dict[str, str], token: str | None
) -> None:
    body = b'{"commitInfo": {}}\n{"add": {"path": "data/x.parquet"}}\n'
    host = "127.0.0.1:9000"
    path = "/lake/" + urllib.parse.quote(key, safe="/~")
    theirs = botocore_signed(
        f"http://{host}{path}", body, dict(condition), "AKIDEXAMPLE", "s3cr3t", token
    )
    when = calendar.timegm(time.strptime(theirs["x-amz-date"], "%Y%m%dT%H%M%SZ"))

    ours = s3put.sign(
        host,
        path,
        body,
        condition,
        s3put.Credentials("AKIDEXAMPLE", "s3cr3t", token or ""),
        "eu-west-1",
        when,
    )

    assert ours["authorization"] == theirs["authorization"]
    assert ours["x-amz-content-sha256"] == theirs["x-amz-content-sha256"]
    assert ours.get("x-amz-security-token") == theirs.get("x-amz-security-token")


def test_the_days_signing_key_is_made_once_and_kept_per_day() -> None:
    cache: dict[tuple[str, str], bytes] = {}
    credentials = s3put.Credentials("AKID", "secret")
    noon = calendar.timegm((2026, 11, 30, 12, 0, 0))
    first = s3put.sign("h", "/b/k", b"x", {}, credentials, "us-east-1", noon, key_cache=cache)
    again = s3put.sign("h", "/b/k", b"x", {}, credentials, "us-east-1", noon, key_cache=cache)
    assert first == again and list(cache) == [("20261130", "us-east-1")]
    s3put.sign("h", "/b/k", b"x", {}, credentials, "us-east-1", noon + 86400, key_cache=cache)
    assert sorted(cache) == [("20261130", "us-east-1"), ("20261201", "us-east-1")]


def puts_to(endpoint: str, path_style: bool) -> s3put.DirectPuts:
    return s3put.DirectPuts(
        endpoint,
        "us-east-1",
        path_style,
        s3put.Credentials("k", "s"),
        connect_timeout_s=1,
        read_timeout_s=1,
    )


@pytest.mark.parametrize(
    ("endpoint", "bucket", "path_style", "served"),
    [
        ("http://s3.example.test", "lake", False, True),
        ("http://s3.example.test", "my.dotted.bucket", False, False),  # (not a host label)
        ("http://s3.example.test", "my.dotted.bucket", True, True),
        ("http://s3.example.test", "Upper", False, False),
        ("http://127.0.0.1:9", "my.dotted.bucket", False, True),  # (an IP: by path)
        ("", "lake", False, True),  # (AWS's own endpoint)
    ],
)
def test_which_buckets_take_direct_puts(
    endpoint: str, bucket: str, path_style: bool, served: bool
) -> None:
    puts = puts_to(endpoint, path_style)
    assert puts.serves(bucket) is served
    puts.enabled = False
    assert not puts.serves(bucket)


def test_an_unreachable_store_leaves_the_put_unsettled() -> None:
    """Nothing listens: the PUT is unsettled (to be made again), not failed or taken;
    a bucket's host name that does not resolve is a reply of sorts: the address is
    tidemark's (botocore, making the PUT again, may address it otherwise)."""
    with pytest.raises(s3put.Unsettled) as caught:
        puts_to("http://127.0.0.1:9", True).put(
            "lake", "t/_delta_log/0.json", b"{}", {"if-none-match": "*"}
        )
    assert not caught.value.replied
    with pytest.raises(s3put.Unsettled) as caught:
        puts_to("http://no-such-host.invalid:9", False).put(
            "lake", "t/_delta_log/0.json", b"{}", {"if-none-match": "*"}
        )
    assert caught.value.replied
