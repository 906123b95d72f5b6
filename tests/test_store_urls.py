"""Store URLs normalized once (issue 29, item 3): every spelling of one place is one
root, or it is refused; every S3 request goes through one key function.

The real-process checks publish through one spelling and read, list, gc and
pull through the others, on the S3 test server and on local disk.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import boto3
import pytest

from registry.errors import InvalidStoreURLError, UnsafeEntryError
from registry.store import Store, open_store, parse_store_url
from tests.conftest import run_cli
from tests.release_util import ledger_row, summary
from tests.test_pull import release_files


@pytest.mark.parametrize("url", ["s3://b/r", "s3://b//r", "s3://b/r/", "s3://b/r//",
                                 "s3://b///r///", "s3a://b/r"])
def test_every_spelling_of_an_s3_prefix_is_one_root(url: str) -> None:
    assert parse_store_url(url) == ("s3", "b/r", "s3://b/r")


@pytest.mark.parametrize("url", ["s3://b", "s3://b/", "s3://b//"])
def test_a_bucket_alone_is_the_bucket_root(url: str) -> None:
    assert parse_store_url(url) == ("s3", "b", "s3://b")


@pytest.mark.parametrize("url,why", [
    ("s3:///r", "needs a bucket"), ("s3://b/r/../x", "'..' segment"),
    ("s3://b/./r", "'.' or '..'"), ("s3://b/r?versionId=1", "no '?'"),
    ("s3://b/r?", "no '?'"), ("s3://b/r#", "no '?'"), ("file:///srv/s?x=1", "no '?'"),
    ("file:///srv/s#v2", "no '?'"), ("file:///srv/s?", "no '?'"),
    ("file://host/srv/x", "would be a host name"), ("file://relative", "host name"),
    ("file:relative/x", "absolute path"), ("ftp://x/y", "unsupported store protocol"),
    ("   ", "empty")])
def test_urls_naming_no_single_root_are_refused(url: str, why: str) -> None:
    with pytest.raises(InvalidStoreURLError, match=why):
        parse_store_url(url)


def test_local_spellings_are_one_absolute_root(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    want = str(tmp_path / "a b")
    for url in ("a b", "./a b", "a b/", "a b//", "~/a b", f"file://{tmp_path}/a%20b",
                f"file://localhost{tmp_path}/a%20b/", f"file://{tmp_path}//a%20b",
                f"{tmp_path}/x/../a b"):
        assert parse_store_url(url)[1] == want, url
        assert open_store(url).root == want, url


def _publish(src: Path, url: str, tmp_path: Path, version: str) -> subprocess.CompletedProcess[str]:
    ledger, evals = tmp_path / "ledger.json", tmp_path / "evals.json"
    ledger.write_text(json.dumps([ledger_row()]))
    evals.write_text(json.dumps(summary()))
    return run_cli("publish", str(src), "--model-id", "tiny", "--version", version,
                   "--ledger", str(ledger), "--evals", str(evals), "--store", url,
                   "--db", f"sqlite:///{tmp_path / 'r.db'}")


def _source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    for rel, data in release_files().items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    return src


def test_s3_double_slash_prefix_is_the_same_store_for_publish_gc_and_pull(
        s3_bucket: str, tmp_path: Path) -> None:
    """The reported loss: a release published through ``s3://b//r`` and gc run
    on ``s3://b/r`` (or the other way round) deleted every committed release.
    Now both are one prefix: the objects sit under ``r/``, gc removes nothing,
    pull through every spelling finds the release."""
    src = _source(tmp_path)
    p = _publish(src, f"s3://{s3_bucket}//r", tmp_path, "1")
    assert p.returncode == 0, p.stderr
    p = _publish(src, f"s3://{s3_bucket}/r/", tmp_path, "2")
    assert p.returncode == 0, p.stderr
    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(
        Bucket=s3_bucket)["Contents"]]
    # every object under the one prefix r/ (the releases, their event log...)
    assert all(k.startswith("r/") and "//" not in k for k in keys), keys
    assert any(k.startswith("r/models/tiny/1/") for k in keys), keys
    for url in (f"s3://{s3_bucket}/r", f"s3://{s3_bucket}//r", f"s3://{s3_bucket}/r//"):
        p = run_cli("gc", "--store", url, "--older-than", "0s", "--json")
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["removed"] == [], p.stdout
    after = [o["Key"] for o in boto3.client("s3").list_objects_v2(
        Bucket=s3_bucket)["Contents"]]
    assert sorted(after) == sorted(keys)
    for n, url in enumerate((f"s3://{s3_bucket}/r", f"s3://{s3_bucket}//r/")):
        for version in ("1", "2"):
            target = tmp_path / f"t{n}{version}"
            p = run_cli("pull", f"tiny@{version}", "--store", url, "--to", str(target),
                        "--quiet")
            assert p.returncode == 0, p.stderr
            assert (target / "data" / "a.bin").read_bytes() == (src / "data" / "a.bin").read_bytes()


def test_file_url_percent_escapes_name_the_decoded_folder(tmp_path: Path) -> None:
    src = _source(tmp_path)
    p = _publish(src, f"file://{tmp_path}/a%20b", tmp_path, "1")
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "a b" / "models" / "tiny" / "1" / "MANIFEST.json").is_file()
    assert not os.path.exists(tmp_path / "a%20b")
    p = run_cli("pull", "tiny@1", "--store", str(tmp_path / "a b"), "--to",
                str(tmp_path / "t"), "--quiet")
    assert p.returncode == 0, p.stderr
    p = run_cli("gc", "--store", "file://relative/x", "--older-than", "0s")
    assert p.returncode == 2 and p.stderr.startswith("error: ") and "host name" in p.stderr


def test_a_file_url_with_a_query_is_refused_not_cut(tmp_path: Path) -> None:
    """``file:///x/s?v=2`` once published into ``/x/s``: the query was dropped
    silently, so the release landed in a store the URL did not name."""
    src = _source(tmp_path)
    p = _publish(src, f"file://{tmp_path}/s?v=2", tmp_path, "1")
    assert p.returncode == 2 and p.stderr.startswith("error: ") and "'?'" in p.stderr, p.stderr
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("key", ["../x", "a/../../x", "a//b", "./a", "a/.", "/a", "a/", "a\0b"])
def test_every_backend_refuses_a_key_that_leaves_or_bends_the_root(store: Store,
                                                                    key: str) -> None:
    """One key function (registry.store.base.key_parts) on every backend: a key
    with ``..``, ``.`` or an empty segment names no single object."""
    for op in (lambda: store.read_bytes(key), lambda: store.write_bytes(key, b"x"),
               lambda: store.info(key), lambda: store.delete(key),
               lambda: store.delete_prefix(key), lambda: store.list_dir(key)):
        with pytest.raises(UnsafeEntryError, match="not a key under the root"):
            op()
