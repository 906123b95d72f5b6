"""A publish from an S3 source never rests on which checksum the server keeps (issue 47).

The bytes read are compared with every whole-object value the server keeps
and this host can recompute (SHA-256, SHA-1, CRC32, the MD5 ETag of a
single PUT); where it keeps none (a multipart upload without checksums) the
object is read twice. The fault is the server's (or a cache in front of it):
a proxy that flips a byte of GET answers and drops their checksum headers
(tests/support/faultproxy.py, ``corrupt``), in front of moto and SeaweedFS.
Inputs: objects uploaded with SHA-1, with no checksum at all (MD5 ETag
only), and as a one-part multipart upload with no checksum; files copied as
they are (weights, tokenizer), weights re-packed by ``--max-shard-size``, and
config.json rewritten by ``--dtype``. Each refusal commits nothing; the same
publish without the fault commits and names the means in ``--json``.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pytest
from botocore.config import Config

from registry.errors import SourceChangedError
from registry.release import ModelRelease
from registry.formats.safetensors_io import write_safetensors
from registry.store import open_store
from tests.conftest import run_cli
from tests.release_util import ledger_row, summary
from tests.support.faultproxy import Action, FaultProxy, Request


def _weights() -> bytes:
    buf = io.BytesIO()
    rng = np.random.default_rng(7)
    write_safetensors(buf, {"a.weight": rng.standard_normal((8, 8), dtype=np.float32),
                            "b.weight": rng.standard_normal((8, 8), dtype=np.float32)},
                      metadata={"format": "pt"}, path="model.safetensors")
    return buf.getvalue()


FILES = {"model.safetensors": _weights(),
         "config.json": b'{"hidden_size": 8, "torch_dtype": "float32"}\n',
         "tokenizer.json": b'{"version": "1.0", "model": {"type": "BPE"}}\n'}


def _client(plain: bool) -> Any:
    """A boto3 client; ``plain``: it sends no checksum (the server keeps none)."""
    config = Config(request_checksum_calculation="when_required") if plain else None
    return boto3.client("s3", config=config)


def _upload(bucket: str, mode: str) -> str:
    """The model directory under ``s3://bucket/src`` stored as ``mode`` says:
    ``sha1`` (x-amz-checksum-sha1), ``md5`` (no checksum: the ETag alone), or
    ``multipart`` (one-part multipart upload, no checksum: nothing to compare)."""
    s3 = _client(plain=mode != "sha1")
    for rel, data in FILES.items():
        key = f"src/{rel}"
        if mode == "multipart":
            up = s3.create_multipart_upload(Bucket=bucket, Key=key)
            part = s3.upload_part(Bucket=bucket, Key=key, UploadId=up["UploadId"],
                                  PartNumber=1, Body=data)
            s3.complete_multipart_upload(
                Bucket=bucket, Key=key, UploadId=up["UploadId"],
                MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]})
        elif mode == "sha1":
            s3.put_object(Bucket=bucket, Key=key, Body=data, ChecksumAlgorithm="SHA1")
        else:
            s3.put_object(Bucket=bucket, Key=key, Body=data)
    return f"s3://{bucket}/src"


def _corrupt(name: str, *, whole_only: bool = False) -> Any:
    """A rule: GETs of ``src/<name>`` come back with a byte flipped and no
    checksum headers (every one, or with ``whole_only`` only GETs of the whole
    object: a cache in front of the server that serves one stale copy)."""

    def rule(req: Request) -> Action | None:
        if req.op != "GetObject" or req.key.rsplit("/", 1)[-1] != name \
                or "/src/" not in f"/{req.key}":
            return None
        if whole_only and any(h.lower() == "range" for h in req.headers):
            return None
        return Action("corrupt")
    return rule


@pytest.fixture(params=["moto", "seaweed"])
def source(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
           ) -> Iterator[tuple[str, FaultProxy]]:
    """``(bucket, proxy)``: a bucket on moto or SeaweedFS and a fault proxy in
    front of that server; AWS_ENDPOINT_URL points at the proxy once the test
    calls :func:`_through`."""
    if request.param == "moto":
        bucket = request.getfixturevalue("s3_bucket")
    else:
        bucket = request.getfixturevalue("seaweed_bucket")
    proxy = FaultProxy(os.environ["AWS_ENDPOINT_URL"]).start()
    yield bucket, proxy
    proxy.stop()


def _through(proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)


def _publish(url: str, store_url: str, version: str, **kw: Any) -> Any:
    return ModelRelease(open_store(store_url)).publish(
        url, "tiny", version, ledger=[ledger_row()], eval_summary=summary(), **kw)


@pytest.mark.parametrize("mode,name,kw", [
    ("sha1", "model.safetensors", {}), ("md5", "tokenizer.json", {}),
    ("md5", "model.safetensors", {"max_shard_size": "300B"}),
    ("sha1", "config.json", {"dtype": "bf16"})],
    ids=["weights-as-is-sha1", "tokenizer-md5", "re-packed-md5", "config-rewritten-sha1"])
def test_bytes_altered_on_the_way_are_refused_by_the_servers_own_values(
        source: tuple[str, FaultProxy], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        mode: str, name: str, kw: dict[str, Any]) -> None:
    bucket, proxy = source
    url = _upload(bucket, mode)
    _through(proxy, monkeypatch)
    store_url = str(tmp_path / "store")
    proxy.rules.append(_corrupt(name))
    with pytest.raises(SourceChangedError, match=f"{name}.*not the object the server holds"):
        _publish(url, store_url, "1", **kw)
    assert not open_store(store_url).exists("models/tiny/1/MANIFEST.json")
    proxy.rules.clear()
    result = _publish(url, store_url, "1", **kw)
    checks = dict(result.source_checks)
    assert "md5" in checks[name] or "sha1" in checks[name], checks
    assert "read twice" not in checks.values()


def test_a_source_with_no_checksum_is_read_twice(
        source: tuple[str, FaultProxy], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    """Multipart objects without checksums: nothing the server keeps can be
    compared, so the object is read twice; a flip on one read is refused,
    and ``--json`` says each file was read twice."""
    bucket, proxy = source
    url = _upload(bucket, "multipart")
    _through(proxy, monkeypatch)
    store_url = str(tmp_path / "store")
    for name in ("tokenizer.json", "model.safetensors"):
        proxy.rules[:] = [_corrupt(name, whole_only=True)]
        with pytest.raises(SourceChangedError, match=f"{name}: two reads of the object differ"):
            _publish(url, store_url, "1")
        assert not open_store(store_url).exists("models/tiny/1/MANIFEST.json")
    proxy.rules.clear()
    ledger, evals = tmp_path / "ledger.json", tmp_path / "evals.json"
    ledger.write_text(json.dumps([ledger_row()]))
    evals.write_text(json.dumps(summary()))
    p = run_cli("publish", url, "--model-id", "tiny", "--version", "1", "--ledger", str(ledger),
                "--evals", str(evals), "--store", store_url, "--db",
                f"sqlite:///{tmp_path / 'r.db'}", "--json")
    assert p.returncode == 0, p.stderr
    record = json.loads(p.stdout)
    assert record["source_checks"] == {n: "read twice" for n in FILES}, record


def test_cli_refuses_a_corrupted_source_with_one_line_and_exit_code(
        source: tuple[str, FaultProxy], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    bucket, proxy = source
    url = _upload(bucket, "md5")
    _through(proxy, monkeypatch)
    proxy.rules.append(_corrupt("tokenizer.json"))
    ledger, evals = tmp_path / "ledger.json", tmp_path / "evals.json"
    ledger.write_text(json.dumps([ledger_row()]))
    evals.write_text(json.dumps(summary()))
    store_url = f"s3://{bucket}/store"
    p = run_cli("publish", url, "--model-id", "tiny", "--version", "1", "--ledger", str(ledger),
                "--evals", str(evals), "--store", store_url, "--db",
                f"sqlite:///{tmp_path / 'r.db'}")
    assert p.returncode != 0
    assert "tokenizer.json" in p.stderr and "Traceback" not in p.stderr
    assert not open_store(store_url).exists("models/tiny/1/MANIFEST.json")
