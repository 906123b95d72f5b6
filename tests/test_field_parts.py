"""Issue 13 item 2, issue 34 item 5: files beyond 10,000 parts. The part size
follows the file's size or an upper bound on it (S3: 5 MiB..5 GiB parts, 10,000
parts, 5 TiB objects), and every part but the last has that one size
(Cloudflare R2's rule); without a size or bound parts are 8 MiB and an upload
past 10,000 of them fails naming the fix; any failure aborts the multipart
upload; ``registry gc`` aborts stale uploads under the store's prefix. The large
cases run against a moto server whose minimum part size is lowered, with parts
scaled down alike."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator

import boto3
import pytest

import registry.store.s3upload as s3mod
from registry.errors import StorageError, UsageError
from registry.store import Store, open_store
from tests.conftest import proxied, run_cli
from tests.support import moto_process
from tests.support.faultproxy import Action, FaultProxy, Request

GiB, TiB = 1024**3, 1024**4


def test_part_size_follows_the_file_size() -> None:
    for size in (0, 1, 78 * GiB, int(78.2 * GiB), 70 * 16 * GiB // 10, 5 * TiB):
        part = s3mod.part_size_for(size)
        assert 8 * 1024**2 <= part <= 5 * GiB and -(-size // part) <= 10_000, size
    assert s3mod.part_size_for(10 * GiB) == 8 * 1024**2  # small files keep 8 MiB parts
    with pytest.raises(UsageError, match="over S3's limit"):
        s3mod.part_size_for(5 * TiB + 1)
    # A bound of 5 TiB: 10,000 equal parts hold it, none over 5 GiB.
    assert 10_000 * s3mod.part_size_for(5 * TiB) >= 5 * TiB


@pytest.fixture(scope="module")
def small_parts(s3_server: object) -> Iterator[str]:
    with moto_process.start({"S3_UPLOAD_PART_MIN_SIZE": "1024"}) as endpoint:
        yield endpoint


def _bucket(endpoint: str, name: str) -> None:
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=name)


def _uploads(endpoint: str, bucket: str) -> list[str]:
    resp = boto3.client("s3", endpoint_url=endpoint).list_multipart_uploads(Bucket=bucket)
    return [u["Key"] for u in resp.get("Uploads", [])]


def _part_lengths(proxy_log: list[Request]) -> list[int]:
    """The UploadPart bodies' lengths in part-number order (parts are sent in
    parallel, so the proxy logs them in the order they arrive)."""
    parts = sorted(((int(r.query.get("partNumber", ["0"])[0]), r) for r in proxy_log
                    if r.op == "UploadPart"), key=lambda p: p[0])
    return [int(r.headers.get("Content-Length") or r.headers.get("content-length") or
                r.headers.get("x-amz-decoded-content-length") or 0)
            for _, r in parts]


@contextlib.contextmanager
def _through_proxy(endpoint: str, bucket: str, monkeypatch: pytest.MonkeyPatch, *,
                   max_parts: int) -> Iterator[tuple[Store, FaultProxy]]:
    """1 KiB parts, at most ``max_parts``; a new ``bucket`` and its store, whose
    requests go through a fault proxy (its log: the parts sent), stopped after."""
    monkeypatch.setattr(s3mod, "PART_SIZE", 1024)
    monkeypatch.setattr(s3mod, "MAX_PARTS", max_parts)
    _bucket(endpoint, bucket)
    proxy = FaultProxy(endpoint).start()
    try:
        yield open_store(f"s3://{bucket}/root",
                         client_kwargs={"endpoint_url": proxy.endpoint}), proxy
    finally:
        proxy.stop()


def test_a_bounded_stream_is_sent_in_equal_parts(small_parts: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Size unknown but bounded: the parts are sized from the bound (so that
    MAX_PARTS of them hold it), and all but the last are alike (R2's rule)."""
    with _through_proxy(small_parts, "big", monkeypatch, max_parts=100) as (store, proxy):
        h = hashlib.sha256()
        written = 0
        # A bound of 150 MiB over 100 parts: 2 MiB parts (whole MiBs).
        with store.open_write("models/m/1/huge.bin", exclusive=True, size=150 * 1024**2) as f:
            for i in range(5 * 64 + 1):  # 5 MiB + 16 KiB in uneven writes
                piece = bytes([i % 251]) * (16 * 1024 + (i % 3))
                f.write(piece)
                h.update(piece)
                written += len(piece)
        lengths = _part_lengths(proxy.log)
    assert s3mod.part_size_for(150 * 1024**2) == 2 * 1024**2
    assert len(lengths) == 3 and lengths[0] == lengths[1] == 2 * 1024**2, lengths
    assert lengths[2] == written - 4 * 1024**2
    etag = boto3.client("s3", endpoint_url=small_parts).head_object(
        Bucket="big", Key="root/models/m/1/huge.bin")["ETag"]
    assert etag.strip('"').endswith("-3") and store.info("models/m/1/huge.bin").size == written
    assert hashlib.sha256(b"".join(store.iter_read("models/m/1/huge.bin"))).hexdigest() == \
        h.hexdigest()
    assert _uploads(small_parts, "big") == []


def test_an_unbounded_stream_keeps_one_part_size_and_names_the_fix(
        small_parts: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """No size, no bound: every part is PART_SIZE (never growing: R2 refuses
    unequal parts); past MAX_PARTS the upload is aborted and the error says
    to pass a bound."""
    with _through_proxy(small_parts, "unbounded", monkeypatch, max_parts=20) as (store, proxy):
        with pytest.raises(UsageError, match="upper bound"), store.open_write("x.bin") as f:
            for _ in range(21):
                f.write(b"z" * 1024)
        lengths = _part_lengths(proxy.log)
    assert lengths and set(lengths) == {1024}, lengths
    assert _uploads(small_parts, "unbounded") == [] and store.walk_files("") == {}


def test_too_many_parts_fail_early_and_abort(small_parts: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3mod, "PART_SIZE", 1024)
    monkeypatch.setattr(s3mod, "MAX_PARTS", 20)
    _bucket(small_parts, "capped")
    store = open_store("s3://capped/root", client_kwargs={"endpoint_url": small_parts})
    with pytest.raises(UsageError, match="over 20 parts"), store.open_write("x.bin") as f:
        for _ in range(21):
            f.write(b"z" * 1024)
    assert _uploads(small_parts, "capped") == [] and store.walk_files("") == {}


def test_a_failed_part_aborts_the_upload(s3_bucket: str, proxy: FaultProxy) -> None:
    def fail_third_part(req: Request) -> Action | None:
        if req.op == "UploadPart" and req.query.get("partNumber") == ["3"]:
            return Action("error", status=400, code="InvalidPart")
        return None

    proxy.rules.append(fail_third_part)
    store = proxied(f"s3://{s3_bucket}/root", proxy)
    with pytest.raises(StorageError), store.open_write("m/1/w.bin") as f:
        for _ in range(4):
            f.write(b"w" * s3mod.PART_SIZE)
    assert _uploads(proxy.upstream, s3_bucket) == []
    assert any(r.op == "AbortMultipart" for r in proxy.log)


def test_gc_aborts_stale_multipart_uploads(s3_bucket: str) -> None:
    """moto reports a fixed ``Initiated`` (2010-11-10), so every upload looks
    old there: what this checks is that gc aborts a killed writer's upload under
    the store's prefix, and spares one under a live claim or outside the prefix."""
    from registry.protocol.claim import Claim

    url = f"s3://{s3_bucket}/root"
    c = boto3.client("s3")
    for key in ("root/models/m/1/model.safetensors", "root/models/m/2/model.safetensors",
                "elsewhere/not-ours.bin"):
        c.create_multipart_upload(Bucket=s3_bucket, Key=key)
    live = Claim(open_store(url), "models/m/2.claim")
    live.take()  # a writer at work on models/m/2
    try:
        r = run_cli("gc", "--store", url, "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["removed"] == [
            f"{url}/models/m/1/model.safetensors (multipart upload)"]
        left = c.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", [])
        assert sorted(u["Key"] for u in left) == ["elsewhere/not-ours.bin",
                                                   "root/models/m/2/model.safetensors"]
    finally:
        live.release()
