"""The object-store API on a local root: the same calls an ``s3://`` root answers
(``tests/integration/test_objectstore_s3.py``), kept on ``durable``'s primitives."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemark.state import objectstore
from tidemark.state.objectstore import join, split


def test_join_keeps_an_s3_uri_whole_and_a_local_root_a_path(tmp_path: Path) -> None:
    assert join("s3://lake/pre/", "_tidemark", "x.json") == "s3://lake/pre/_tidemark/x.json"
    assert join(tmp_path, "_tidemark", "x.json") == tmp_path / "_tidemark" / "x.json"
    assert join(str(tmp_path), "a") == tmp_path / "a"
    assert split("s3://lake/pre/a.json") == ("lake", "pre/a.json")
    assert split("s3://lake") == ("lake", "")
    assert objectstore.s3a("s3://lake/pre") == "s3a://lake/pre"
    assert objectstore.s3a(tmp_path) == str(tmp_path)


def test_read_replace_and_put_if_absent_on_disk(tmp_path: Path) -> None:
    target = tmp_path / "state" / "f.json"
    assert objectstore.read(target) is None
    objectstore.replace(target, "one")
    assert objectstore.read_text(target) == "one"
    objectstore.replace(target, b"two")
    assert objectstore.read(target) == b"two"
    entry = tmp_path / "state" / "00000000000000000001.json"
    assert objectstore.put_if_absent(entry, b"first")
    assert not objectstore.put_if_absent(entry, b"second")
    assert entry.read_bytes() == b"first"
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == [entry.name, "f.json"]


def test_a_fence_that_refuses_stops_a_local_replace(tmp_path: Path) -> None:
    target = tmp_path / "f.json"
    objectstore.replace(target, "mine")

    def deposed() -> None:
        raise RuntimeError("deposed")

    with pytest.raises(RuntimeError):
        objectstore.replace(target, "stale", check=deposed)
    assert target.read_text() == "mine"


def test_listing_and_delete_on_disk(tmp_path: Path) -> None:
    (tmp_path / "data" / "b1").mkdir(parents=True)
    (tmp_path / "data" / "b1" / "part-0.parquet").write_bytes(b"x" * 3)
    (tmp_path / "data" / "top.txt").write_bytes(b"")
    found = objectstore.listing(tmp_path / "data")
    assert [(f.name, f.size) for f in found] == [("b1/part-0.parquet", 3), ("top.txt", 0)]
    objectstore.delete([tmp_path / "data" / "top.txt", tmp_path / "data" / "missing"])
    assert [f.name for f in objectstore.listing(tmp_path / "data")] == ["b1/part-0.parquet"]


def test_an_s3_location_without_s3_settings_says_what_to_set() -> None:
    objectstore.configure(None)
    with pytest.raises(objectstore.SinkError, match=r"\[s3\] section"):
        objectstore.read("s3://lake/x.json")


def test_a_footer_from_the_end_of_a_file_equals_pyarrows_own_read(tmp_path: Path) -> None:
    """``tail_stats``: what a commit records of a file on a store, from one ranged read
    of its end; a footer longer than the tail read is left to pyarrow (None)."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from tidemark.sink.files import file_stats, tail_stats

    rows = pa.table(
        {
            "_lsn": pa.array(range(50_000), pa.int64()),
            "_op": pa.array([1] * 50_000, pa.int32()),
            "x": pa.array(["a" * 20] * 50_000),
        }
    )
    buffer = io.BytesIO()
    pq.write_table(rows, buffer, row_group_size=1000)  # (a long footer: 50 row groups)
    data = buffer.getvalue()
    (tmp_path / "f.parquet").write_bytes(data)
    assert tail_stats(data[-65536:], len(data)) == file_stats(tmp_path / "f.parquet")
    assert tail_stats(data, len(data)) == file_stats(tmp_path / "f.parquet")
    assert tail_stats(data[-200:], len(data)) is None


def test_the_stats_of_rows_equal_those_their_files_footer_gives(tmp_path: Path) -> None:
    """``arrow_stats``: a round on an object store describes the one file a member's
    rows went to from the rows (no footer read back); it must say what the footer
    says, with NULLs, a column all NULL and a column missing."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tidemark.sink.files import arrow_stats, file_stats

    cases = [
        pa.table(
            {
                "_lsn": pa.array([7, None, 3, 9], pa.int64()),
                "_op": pa.array([2, 0, 1, 5], pa.int32()),
                "x": pa.array(["a", "b", None, "d"]),
            }
        ),
        pa.table({"_lsn": pa.array([None, None], pa.int64()), "_op": pa.array([4, 4])}),
        pa.table({"_op": pa.array([1], pa.int64()), "x": pa.array([1.5])}),
    ]
    for n, rows in enumerate(cases):
        path = tmp_path / f"{n}.parquet"
        pq.write_table(rows, path)
        assert arrow_stats(rows) == file_stats(path)


def test_a_single_file_of_known_rows_is_described_without_a_request() -> None:
    """``describe_remote`` with ``known``: one listed file is described by what the
    writer knows, and no footer is read (there is no store at that address to read
    from); an empty one is left out."""
    from tidemark.sink.folder import describe_remote
    from tidemark.state.objectstore import Listed

    found = describe_remote(
        "s3://nowhere/t", [Listed("data/u/a.parquet", 812, 5)], (3, '{"numRecords": 3}')
    )
    assert [(f.path, f.size, f.num_rows, f.modification_time_ms, f.stats) for f in found] == [
        ("data/u/a.parquet", 812, 3, 5, '{"numRecords": 3}')
    ]
    assert describe_remote("s3://nowhere/t", [Listed("data/u/a.parquet", 812, 5)], (0, "{}")) == []


def test_the_folders_right_below_a_location(tmp_path: Path) -> None:
    from tidemark.state.objectstore import folders

    (tmp_path / "tables" / "a" / "_delta_log").mkdir(parents=True)
    (tmp_path / "tables" / "b").mkdir()
    (tmp_path / "tables" / "file.json").write_text("{}")
    assert folders(tmp_path / "tables") == {"a", "b"}
    assert folders(tmp_path / "nothing") == set()


class _Empty:
    """The body of an empty reply, as urllib3 gives it to botocore."""

    def stream(self, *_: object, **__: object) -> object:
        return iter([b""])


def _headers_of_a_put(client: object) -> dict[str, bytes | str]:
    """The headers botocore would send for a small PutObject (caught before it goes)."""
    from botocore.awsrequest import AWSResponse

    sent: list[dict[str, bytes | str]] = []

    def catch(request: object, **_: object) -> AWSResponse:
        sent.append({k.lower(): v for k, v in request.headers.items()})  # type: ignore[attr-defined]
        return AWSResponse(request.url, 200, {"ETag": '"e"'}, _Empty())  # type: ignore[attr-defined]

    client.meta.events.register("before-send.s3", catch)  # type: ignore[attr-defined]
    client.put_object(Bucket="lake", Key="t/_delta_log/1.json", Body=b"{}", IfNoneMatch="*")  # type: ignore[attr-defined]
    return sent[0]


def test_a_put_sends_its_body_with_its_headers() -> None:
    """tidemark's PUTs (bytes in memory) do not wait for the store to accept their
    headers first (``Expect: 100-continue``, a round trip more), which botocore asks
    for any body."""
    import boto3

    access = objectstore.S3Access(
        endpoint="http://127.0.0.1:9", path_style=True, access_key_id="k", secret_access_key="s"
    )
    headers = _headers_of_a_put(access.client())
    assert "expect" not in headers
    assert headers["if-none-match"] in ("*", b"*")
    # (botocore's own client asks for it: what this test would see without the change)
    plain = boto3.client(
        "s3",
        endpoint_url=access.endpoint,
        region_name="us-east-1",
        aws_access_key_id="k",
        aws_secret_access_key="s",
    )
    assert _headers_of_a_put(plain)["expect"] in ("100-continue", b"100-continue")
