"""Versioned and object-locked buckets (issue 47 item 2).

On a bucket with versioning on, what ``release delete`` and ``gc`` remove
stays as noncurrent versions (billed, readable). Both commands detect the
bucket's modes and say so; with ``--purge-versions`` they delete the
noncurrent versions and delete markers, never a current object. Inputs: a
deleted release and a replaced object; moto and SeaweedFS. (Suspending
versioning: both servers then drop the old versions on delete themselves.)
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import boto3
import pytest

from registry.store import open_store
from registry.store.s3versions import bucket_modes
from tests.conftest import run_cli
from tests.test_pull import publish, release_files


def _versions(bucket: str, prefix: str) -> list[tuple[str, bool]]:
    page = boto3.client("s3").list_object_versions(Bucket=bucket, Prefix=prefix)
    return ([(v["Key"], v["IsLatest"]) for v in page.get("Versions", [])]
            + [(d["Key"], False) for d in page.get("DeleteMarkers", [])])


@pytest.mark.parametrize("server", ["s3", "seaweed"])
def test_delete_and_gc_purge_noncurrent_versions_when_asked(
        server: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    request.getfixturevalue("s3_server" if server == "s3" else "seaweed_bucket")
    bucket = f"v-{uuid.uuid4().hex[:12]}"
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    url = f"s3://{bucket}/root"
    store = open_store(url)
    publish(store, tmp_path, "1", release_files())
    publish(store, tmp_path, "2", release_files())
    store.write_bytes("scratch/pointer", b"one")
    store.write_bytes("scratch/pointer", b"two")  # the old bytes: a noncurrent version
    assert bucket_modes(store)["versioning"] == "Enabled"
    db = f"sqlite:///{tmp_path / 'i.db'}"
    p = run_cli("release", "delete", "tiny@1", "--reason", "bad", "--store", url, "--db", db)
    assert p.returncode == 0, p.stderr
    assert "noncurrent versions" in p.stderr  # told, not purged
    # its bytes are still there, noncurrent
    assert any(not latest for _, latest in _versions(bucket, "root/models/tiny/1/"))
    p = run_cli("release", "delete", "tiny@2", "--reason", "bad", "--store", url, "--db", db,
                "--purge-versions", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["purged_versions"]
    assert [k for k, _ in _versions(bucket, "root/models/tiny/2/")] == []
    p = run_cli("gc", "--store", url, "--purge-versions", "--json")
    assert p.returncode == 0, p.stderr
    removed = json.loads(p.stdout)["removed"]
    assert any("scratch/pointer (version" in k for k in removed), removed
    left = _versions(bucket, "root/")
    assert all(latest for _, latest in left), left  # only current objects remain
    assert store.read_bytes("scratch/pointer") == b"two"
    assert not store.exists("models/tiny/1/MANIFEST.json")
