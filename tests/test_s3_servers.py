"""Issue 34: S3 servers beyond moto, and the quirks they revealed.

Each quirk is reproduced against a real server: SeaweedFS (``weed mini``, the
second server of the matrix) where the server itself shows it, else moto
behind the fault proxy rewriting what a quirky server answers (Ceph RGW 16's
unquoted ``If-Match``, s3rver's missing ListMultipartUploads and its
delimited listings without CommonPrefixes two levels deep).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import boto3
import numpy as np
import pytest

from registry.api import Registry
from registry.protocol.commit import DirectoryWriter
from registry.errors import CommitConflictError, PointerConflictError, StorageError
from registry.store import open_store
from registry.store.s3probe import etag_as_sent, forget
from tests.ckpt_util import save
from tests.conftest import proxied, run_cli
from tests.release_util import ledger_row, summary
from tests.support.faultproxy import Action, FaultProxy, Request
from tests.support.forkclient import python_popen

REPO = Path(__file__).resolve().parent.parent


def _header(req: Request, name: str) -> str | None:
    return next((v for k, v in req.headers.items() if k.lower() == name), None)


def ceph16_if_match(req: Request) -> Action | None:
    """Ceph RGW 16: ``If-Match`` with the quoted ETag S3 returns is refused
    (412); the same ETag unquoted is honoured (forwarded quoted to moto)."""
    value = _header(req, "if-match")
    if value is None:
        return None
    if value.startswith('"'):
        return Action("error", status=412, code="PreconditionFailed")

    def quote(headers: dict[str, str], body: bytes) -> tuple[dict[str, str], bytes]:
        return {k: (f'"{v}"' if k.lower() == "if-match" else v)
                for k, v in headers.items()}, body

    return Action("edit", edit_request=quote)


def no_list_multipart(req: Request) -> Action | None:
    """s3rver: ListMultipartUploads is not implemented."""
    if req.method == "GET" and "uploads" in req.query and not req.key:
        return Action("error", status=501, code="NotImplemented")
    return None


def no_deep_common_prefixes(req: Request) -> Action | None:
    """s3rver: a delimited listing two or more levels deep comes back without
    its CommonPrefixes (objects directly under the prefix still listed)."""
    if req.method != "GET" or req.key or "uploads" in req.query or not req.query.get("delimiter"):
        return None
    prefix = (req.query.get("prefix") or [""])[0]
    if prefix.count("/") < 2:
        return None

    def strip(r: Request, status: int, headers: list[tuple[str, str]],
              body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        return status, headers, re.sub(rb"<CommonPrefixes>.*?</CommonPrefixes>", b"", body,
                                       flags=re.S)

    return Action("edit", edit_response=strip)


@pytest.fixture
def cli_env(proxy: FaultProxy) -> dict[str, str]:
    """Environment of a CLI process that talks to the S3 server through the proxy."""
    return {"AWS_ENDPOINT_URL": proxy.endpoint}


# -- item 5: ETags in the form the server accepts -----------------------------------


def test_the_probe_learns_unquoted_etags_and_pointers_move(s3_bucket: str,
                                                           proxy: FaultProxy) -> None:
    proxy.rules.append(ceph16_if_match)
    store = proxied(f"s3://{s3_bucket}/root", proxy)
    store.create("models/m/refs/prod", b"1\n")
    _, etag = store.read_versioned("models/m/refs/prod")
    assert etag_as_sent(store, etag) == etag.strip('"')
    store.swap("models/m/refs/prod", b"2\n", etag)  # refused quoted: sent unquoted
    assert store.read_bytes("models/m/refs/prod") == b"2\n"
    with pytest.raises(PointerConflictError):
        store.swap("models/m/refs/prod", b"3\n", etag)  # stale: still refused
    assert store.read_bytes("models/m/refs/prod") == b"2\n"


@pytest.mark.parametrize("single_writer", [False, True])
def test_a_publish_holds_its_claim_on_a_server_wanting_unquoted_etags(
        s3_bucket: str, proxy: FaultProxy, tmp_path: Path, cli_env: dict[str, str],
        single_writer: bool) -> None:
    """Claims are renewed with If-Match (every third of the lease): with the
    quoted form a publisher on Ceph 16 "lost its claim" every time, under the
    single-writer opt-out too (the probe was skipped there)."""
    url = f"s3://{s3_bucket}/root"
    src = tmp_path / "model"
    _model_dir(src)
    proxy.rules.append(ceph16_if_match)
    (tmp_path / "ledger.json").write_text(json.dumps([ledger_row()]))
    (tmp_path / "summary.json").write_text(json.dumps(summary(0.9)))
    env = {**cli_env, "REGISTRY_CLAIM_LEASE": "0.3",
           "REGISTRY_S3_SINGLE_WRITER": "1" if single_writer else "0"}
    r = run_cli("publish", str(src), "--model-id", "m", "--version", "1", "--store", url,
                "--ledger", str(tmp_path / "ledger.json"),
                "--evals", str(tmp_path / "summary.json"),
                "--db", f"sqlite:///{tmp_path / 'i.db'}", env=env)
    assert r.returncode == 0, r.stderr
    assert any(_header(q, "if-match") for q in proxy.log), "no claim renewal was sent"
    r = run_cli("verify", "--full", f"{url}/models/m/1", env=env)
    assert r.returncode == 0, r.stdout + r.stderr


# -- item 5: a server without ListMultipartUploads ------------------------------------


def test_gc_skips_a_server_without_list_multipart_uploads(s3_bucket: str, proxy: FaultProxy,
                                                          cli_env: dict[str, str]) -> None:
    url = f"s3://{s3_bucket}/root"
    open_store(url).create("models/m/1.tmp-dead/x", b"leftover")  # something to scan
    proxy.rules.append(no_list_multipart)
    r = run_cli("gc", "--store", url, env=cli_env)
    assert r.returncode == 0, r.stderr
    warning = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warning) == 1 and "ListMultipartUploads" in warning[0], r.stderr
    assert "Traceback" not in r.stderr and "Errno" not in r.stderr
    r = run_cli("gc", "--json", "--store", url, env=cli_env)
    assert r.returncode == 0 and "ListMultipartUploads" in json.loads(r.stdout)["warnings"][0]


# -- item 4: uploads belong to their claim --------------------------------------------

WRITER = r"""
import os, sys, time
from registry.protocol.commit import DirectoryWriter
from registry.store import open_store
store = open_store(sys.argv[1])
w = DirectoryWriter(store, "models/m/1", kind="release",
                    meta={"model_id": "m", "version": "1", "source": {"uri": "file:///x"}})
cm = w.open("weights.bin", size=64 << 20)
f = cm.__enter__()
f.write(b"w" * (20 << 20))  # two 8 MiB parts sent, the upload open
time.sleep(1)
print("ready", flush=True)
time.sleep(600)
"""


def _uploads(bucket: str) -> list[str]:
    return [u["Key"] for u in boto3.client("s3").list_multipart_uploads(
        Bucket=bucket).get("Uploads", [])]


@pytest.mark.parametrize("server", ["s3", "seaweed"])
def test_gc_aborts_a_dead_writers_uploads_at_once(server: str,
                                                  request: pytest.FixtureRequest) -> None:
    """A publisher SIGKILLed mid-upload: gc (default --older-than 1h) removes
    its claim (its process is gone) and aborts its multipart upload with it,
    though the upload is seconds old. moto dates every upload 2010, so only
    SeaweedFS's real timestamps can show the age rule alone would keep it."""
    bucket = request.getfixturevalue("s3_bucket" if server == "s3" else "seaweed_bucket")
    url = f"s3://{bucket}/root"
    with python_popen([sys.executable, "-c", WRITER, url], stdout=subprocess.PIPE,
                          text=True, env={**os.environ, "PYTHONPATH": str(REPO)}) as child:
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
            assert _uploads(bucket) == ["root/models/m/1/weights.bin"]
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
    r = run_cli("gc", "--store", url)
    assert r.returncode == 0, r.stderr
    assert "models/m/1/weights.bin (multipart upload)" in r.stdout
    assert _uploads(bucket) == []
    assert not open_store(url).exists("models/m/1.claim")


# -- item 2: a lost race on a large object is caught before the manifest --------------


@pytest.mark.parametrize("server", ["s3", "seaweed"])
def test_a_file_completed_over_ours_is_caught_before_the_manifest(
        server: str, request: pytest.FixtureRequest) -> None:
    """A second writer's CompleteMultipartUpload landing over one of our files
    (servers where conditional completion is not atomic let it): the commit
    reads the ETags back and refuses, nothing committed."""
    bucket = request.getfixturevalue("s3_bucket" if server == "s3" else "seaweed_bucket")
    store = open_store(f"s3://{bucket}/root")
    w = DirectoryWriter(store, "models/m/1", kind="release",
                        meta={"model_id": "m", "version": "1", "source": {"uri": "file:///x"}})
    with w:
        with w.open("weights.bin", size=20 << 20) as f:
            f.write(b"o" * (18 << 20))  # multipart: three parts
        w.write_bytes("config.json", b"{}")
        # the other writer's object, same size, other bytes
        boto3.client("s3").put_object(Bucket=bucket, Key="root/models/m/1/weights.bin",
                                      Body=b"x" * (18 << 20))
        with pytest.raises(CommitConflictError, match="another writer's bytes are at weights.bin"):
            w.commit()
    assert not store.exists("models/m/1/MANIFEST.json")


def test_the_single_writer_opt_out_reads_back_its_commit(s3_bucket: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Under REGISTRY_S3_SINGLE_WRITER=1 nothing stops a second writer: the
    manifest another writer put over ours right after our commit is caught
    by the read-back, loudly."""
    monkeypatch.setenv("REGISTRY_S3_SINGLE_WRITER", "1")
    store = open_store(f"s3://{s3_bucket}/root")
    real_create = store.create

    def create_then_overwritten(key: str, data: bytes) -> None:
        real_create(key, data)
        if key.endswith("MANIFEST.json"):
            boto3.client("s3").put_object(Bucket=s3_bucket, Key=f"root/{key}",
                                          Body=data + b" ")

    monkeypatch.setattr(store, "create", create_then_overwritten)
    with DirectoryWriter(store, "models/m/1", kind="release",
                         meta={"model_id": "m", "version": "1",
                               "source": {"uri": "file:///x"}}) as w:
        w.write_bytes("config.json", b"{}")
        with pytest.raises(CommitConflictError, match="another writer published here"):
            w.commit()


# -- item 3: listings cross-checked before anything destructive -----------------------


def _model_dir(d: Path) -> None:
    from safetensors.numpy import save_file

    d.mkdir(parents=True)
    save_file({"w": np.arange(16, dtype=np.float32).reshape(4, 4)}, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"model_type": "tiny", "hidden_size": 4}))


def test_rebuild_and_gc_refuse_a_server_whose_delimited_listing_is_wrong(
        s3_bucket: str, proxy: FaultProxy, tmp_path: Path, cli_env: dict[str, str]) -> None:
    url, db = f"s3://{s3_bucket}/root", f"sqlite:///{tmp_path / 'index.db'}"
    with Registry(url, db=db) as reg:
        with reg.checkpoint_manager("r1", keep_ckpts=0, async_save=False) as m:
            save(m, 10)
        reg.create_release("r1", 10, "tiny", "1", ledger=[ledger_row()],
                           eval_summary=summary(0.9))
    open_store(url).create("models/tiny/2.tmp-dead/x", b"leftover")
    proxy.rules.append(no_deep_common_prefixes)
    r = run_cli("index", "rebuild", "--store", url, "--db", db, env=cli_env)
    assert r.returncode == 6, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "listings disagree" in lines[0] and "models" in lines[0], r.stderr
    r = run_cli("ls", "--db", db, "--store", url, "--json")
    assert r.returncode == 0 and [m["model_id"] for m in json.loads(r.stdout)] == ["tiny"]
    r = run_cli("gc", "--store", url, "--older-than", "0s", env=cli_env)
    assert r.returncode == 6 and "listings disagree" in r.stderr, r.stderr
    assert open_store(url).exists("models/tiny/2.tmp-dead/x")
    proxy.rules.clear()  # a server that lists right: both go through
    assert run_cli("index", "rebuild", "--store", url, "--db", db, env=cli_env).returncode == 0


def test_subdirs_confirmed_on_a_well_behaved_server(request: pytest.FixtureRequest) -> None:
    bucket = request.getfixturevalue("seaweed_bucket")
    store = open_store(f"s3://{bucket}/root")
    for key in ("models/a/1/MANIFEST.json", "models/b/x", "runs/r/ckpt/LATEST"):
        store.create(key, b"1")
    assert store.subdirs_confirmed("models") == ["a", "b"]
    assert store.subdirs_confirmed("runs") == ["r"]
    assert store.subdirs_confirmed("nothing") == []
    forget()


def test_subdirs_confirmed_names_the_server(s3_bucket: str, proxy: FaultProxy) -> None:
    store = proxied(f"s3://{s3_bucket}/root", proxy)
    store.create("models/a/1/MANIFEST.json", b"1")
    proxy.rules.append(no_deep_common_prefixes)
    with pytest.raises(StorageError, match=r"listings disagree .*bucket .* at http://127"):
        store.subdirs_confirmed("models")
