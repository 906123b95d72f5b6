"""Issue 13 item 2: files beyond 10,000 parts. The part size follows the file
size (S3: 5 MiB..5 GiB parts, 10,000 parts, 5 TiB objects) and grows when the
size is not known up front; any failure aborts the multipart upload; ``registry
gc`` aborts stale uploads under the store's prefix. The large case runs against
a moto server whose minimum part size is lowered, with parts scaled down alike."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator

import boto3
import pytest

import registry.store.s3 as s3mod
from registry.errors import StorageError, UsageError
from registry.store import open_store
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
    # Unknown size: 10,000 growing parts hold more than 5 TiB, none over 5 GiB.
    sizes = [s3mod.part_size_of(n) for n in range(1, 10_001)]
    assert sum(sizes) >= 5 * TiB and max(sizes) <= 5 * GiB and sizes[0] == 8 * 1024**2


@pytest.fixture(scope="module")
def small_parts(s3_server: object) -> Iterator[str]:
    with moto_process.start({"S3_UPLOAD_PART_MIN_SIZE": "1024"}) as endpoint:
        yield endpoint


def _bucket(endpoint: str, name: str) -> None:
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=name)


def _uploads(endpoint: str, bucket: str) -> list[str]:
    resp = boto3.client("s3", endpoint_url=endpoint).list_multipart_uploads(Bucket=bucket)
    return [u["Key"] for u in resp.get("Uploads", [])]


def test_a_stream_over_10000_base_parts_completes(small_parts: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """10,001 parts' worth at the base size, size unknown: parts grow, the
    upload completes in fewer than 10,000 parts."""
    monkeypatch.setattr(s3mod, "PART_SIZE", 1024)
    monkeypatch.setattr(s3mod, "PARTS_PER_DOUBLING", 100)
    _bucket(small_parts, "big")
    store = open_store("s3://big/root", client_kwargs={"endpoint_url": small_parts})
    block = bytes(range(256)) * 4  # 1 KiB
    h = hashlib.sha256()
    with store.open_write("models/m/1/huge.bin", exclusive=True) as f:
        for i in range(10_001):
            piece = block[i % 7:] + block[:i % 7]
            f.write(piece)
            h.update(piece)
    etag = boto3.client("s3", endpoint_url=small_parts).head_object(
        Bucket="big", Key="root/models/m/1/huge.bin")["ETag"]
    parts = int(etag.strip('"').rsplit("-", 1)[1])
    assert parts < 10_000 and store.info("models/m/1/huge.bin").size == 10_001 * 1024
    assert hashlib.sha256(b"".join(store.iter_read("models/m/1/huge.bin"))).hexdigest() == \
        h.hexdigest()
    assert _uploads(small_parts, "big") == []


def test_too_many_parts_fail_early_and_abort(small_parts: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3mod, "PART_SIZE", 1024)
    monkeypatch.setattr(s3mod, "PARTS_PER_DOUBLING", 10**9)  # no growth: the old behaviour
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
    from registry.claim import Claim

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
