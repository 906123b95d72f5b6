"""Issue 49: the gs:// and az:// stores on their emulators (fake-gcs-server,
Azurite), beyond the store contract, commit protocol and race tests that
test_store, test_commit and test_race run on them (conftest CLOUD_MODULES).

Here: URL spellings; the precondition probe refusing the PyPI
gcp-storage-emulator (it ignores ``ifGenerationMatch``) and an Azure endpoint
whose conditional headers are dropped on the way, by the Python API and the
CLI; a subset of the fault matrix through the fault proxy in front of each
emulator (503 on a conditional write, its answer lost after it landed,
connections reset on reads, a commit under repeated 503s); credentials
never printed; and the README's tour (``registry quickstart``) on both.
"""

from __future__ import annotations

import os
import threading
from datetime import datetime, timedelta, timezone
from collections.abc import Iterator
from pathlib import Path

import pytest

from registry.protocol.commit import DirectoryWriter
from registry.errors import (
    ConditionalWritesUnsupportedError,
    InvalidStoreURLError,
    ObjectExistsError,
    PointerConflictError,
    StorageError,
    StoragePermissionError,
)
from registry.store import condprobe, open_store, parse_store_url
from registry.protocol.verify import verify_directory
from tests.conftest import run_cli
from tests.release_util import docs_args
from tests.test_aliases import model_dir
from tests.support.azurite import KEY, Azurite
from tests.support.fakegcs import FakeGCS
from tests.support.faultproxy import Action, FaultProxy, Request, drop_conditions
from tests.test_quickstart import check_outcome
from tests.support.servers import free_port


@pytest.mark.parametrize(("url", "want"), [
    ("gs://b//p/q/", ("gs", "b/p/q", "gs://b/p/q")),
    ("gcs://b", ("gs", "b", "gs://b")),
    ("az://c/p", ("az", "c/p", "az://c/p")),
    ("abfs://c/p//q", ("az", "c/p/q", "az://c/p/q")),
    ("abfss://c@acct.dfs.core.windows.net/p", ("az", "c/p", "az://c/p")),
])
def test_url_spellings(url: str, want: tuple[str, str, str]) -> None:
    assert parse_store_url(url) == want


@pytest.mark.parametrize("url", ["gs://", "az:///p", "gs://b/../x", "az://c/p?x=1"])
def test_bad_urls_are_refused(url: str) -> None:
    with pytest.raises(InvalidStoreURLError):
        parse_store_url(url)


# -- the probe ---------------------------------------------------------------------


@pytest.fixture
def gcp_storage_emulator(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The PyPI gcp-storage-emulator (in memory, in this process's threads),
    with bucket ``b``; STORAGE_EMULATOR_HOST points at it."""
    from gcp_storage_emulator.server import create_server

    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket="b")
    thread = threading.Thread(target=server.start, daemon=True)
    thread.start()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    yield "gs://b/root"
    server.stop()


def _publish_args(tmp_path: Path, url: str) -> list[str]:
    return ["publish", str(model_dir(tmp_path)), "--model-id", "m", "--version", "1",
            *docs_args(tmp_path), "--store", url, "--db", f"sqlite:///{tmp_path / 'i.db'}"]


def test_the_probe_refuses_gcp_storage_emulator(gcp_storage_emulator: str,
                                                tmp_path: Path) -> None:
    """gcp-storage-emulator takes ifGenerationMatch and ignores it: refused,
    naming what it ignored, by the API and the CLI (exit 6, one line);
    nothing is committed. The single-writer opt-out accepts the risk."""
    condprobe.forget()
    store = open_store(gcp_storage_emulator)
    with pytest.raises(ConditionalWritesUnsupportedError, match=r"ignores ifGenerationMatch=0"):
        store.create("m/MANIFEST.json", b"{}")
    assert not store.exists("m/MANIFEST.json")
    r = run_cli(*_publish_args(tmp_path, gcp_storage_emulator))
    assert r.returncode == 6, (r.stdout, r.stderr)
    assert "ignores ifGenerationMatch=0" in r.stderr and "Traceback" not in r.stderr
    assert not store.exists("models/m/1/MANIFEST.json")
    risky = open_store(gcp_storage_emulator, single_writer=True)
    risky.create("k", b"v")
    assert risky.read_bytes("k") == b"v"
    condprobe.forget()


@pytest.fixture(scope="session")
def _gcs_proxy(gcs_server: FakeGCS) -> Iterator[FaultProxy]:
    proxy = FaultProxy(gcs_server.endpoint).start()
    yield proxy
    proxy.stop()


@pytest.fixture(scope="session")
def _azure_proxy(azurite_server: Azurite) -> Iterator[FaultProxy]:
    proxy = FaultProxy(f"http://127.0.0.1:{azurite_server.port}").start()
    yield proxy
    proxy.stop()


@pytest.fixture(params=["gcs", "azure"])
def faulty(request: pytest.FixtureRequest,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, FaultProxy]]:
    """(store URL, proxy): a new bucket or container reached through the fault
    proxy, with no rules; retries 10 ms apart."""
    monkeypatch.setenv("REGISTRY_S3_RETRY_DELAY", "0.01")
    if request.param == "gcs":
        url = f"gs://{request.getfixturevalue('gcs_bucket')}/root"
        proxy = request.getfixturevalue("_gcs_proxy")
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.endpoint)
    else:
        url = f"az://{request.getfixturevalue('azure_container')}/root"
        proxy = request.getfixturevalue("_azure_proxy")
        azurite: Azurite = request.getfixturevalue("azurite_server")
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string.replace(
            f"http://127.0.0.1:{azurite.port}", proxy.endpoint))
    proxy.reset()
    condprobe.forget()
    yield url, proxy
    proxy.reset()
    condprobe.forget()


def _conditional(req: Request) -> bool:
    """A conditional write: GCS's ifGenerationMatch upload, Azure's PUT with
    If-None-Match or If-Match."""
    if "ifGenerationMatch" in req.query:
        return req.method == "POST"
    return req.method == "PUT" and any(h.lower() in ("if-none-match", "if-match")
                                       for h in req.headers)


def _first(kind: str, match: object, times: int = 1, **kw: object) -> object:
    left = {"n": times}

    def rule(req: Request) -> Action | None:
        if left["n"] > 0 and match(req):  # type: ignore[operator]
            left["n"] -= 1
            return Action(kind, **kw)  # type: ignore[arg-type]
        return None
    return rule


def test_the_probe_refuses_an_azure_endpoint_that_drops_conditions(
        azurite_server: Azurite, azure_container: str, _azure_proxy: FaultProxy,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A gateway that drops If-None-Match / If-Match is refused, naming the
    header. The account reaches it with a SAS token (a shared-key signature
    covers the conditional headers, so dropping them would fail the request
    instead of ignoring its condition)."""
    from azure.storage.blob import AccountSasPermissions, ResourceTypes, generate_account_sas

    sas = generate_account_sas(
        "devstoreaccount1", KEY, ResourceTypes(service=True, container=True, object=True),
        AccountSasPermissions(read=True, write=True, delete=True, list=True, create=True,
                              add=True), expiry=datetime.now(timezone.utc) + timedelta(hours=1))
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING",
                       f"BlobEndpoint={_azure_proxy.endpoint}/devstoreaccount1;"
                       f"SharedAccessSignature={sas}")
    _azure_proxy.reset()
    condprobe.forget()
    store = open_store(f"az://{azure_container}/root")
    store.write_bytes("plain", b"ok")  # the SAS works through the proxy
    _azure_proxy.rules.append(drop_conditions)
    try:
        with pytest.raises(ConditionalWritesUnsupportedError,
                           match=r"ignores If-None-Match: \*") as e:
            store.create("k", b"v")
        assert sas.split("sig=")[-1][:20] not in str(e.value)
        assert not store.exists("k")
    finally:
        _azure_proxy.reset()
        condprobe.forget()


# -- a subset of the fault matrix ---------------------------------------------------


def test_a_503_on_a_conditional_write_is_retried(faulty: tuple[str, FaultProxy]) -> None:
    url, proxy = faulty
    store = open_store(url)
    condprobe.require_preconditions(store)  # the probe is not what this test breaks
    proxy.log.clear()
    proxy.rules.append(_first("error", _conditional, status=503, code="ServerBusy"))
    store.create("m/MANIFEST.json", b"one")
    assert sum(_conditional(r) for r in proxy.log) == 2
    assert store.read_bytes("m/MANIFEST.json") == b"one"
    with pytest.raises(ObjectExistsError):
        store.create("m/MANIFEST.json", b"two")


@pytest.mark.parametrize("op", ["create", "swap"])
def test_a_lost_answer_to_a_conditional_write_that_landed_is_success(
        faulty: tuple[str, FaultProxy], op: str) -> None:
    """The write lands, its answer is lost (connection reset); the retry is
    refused because of that very write: the write token says it is ours."""
    url, proxy = faulty
    store = open_store(url)
    condprobe.require_preconditions(store)
    token = None
    if op == "swap":
        store.swap("p", b"old", None)
        token = store.read_versioned("p")[1]
    proxy.rules.append(_first("edit", _conditional, drop_answer=True))
    if op == "create":
        store.create("p", b"mine")
    else:
        store.swap("p", b"mine", token)
    assert store.read_bytes("p") == b"mine"
    assert sum(_conditional(r) for r in proxy.log) >= 2
    with pytest.raises((ObjectExistsError, PointerConflictError)):
        store.create("p", b"theirs") if op == "create" else store.swap("p", b"theirs", token)


def test_reset_connections_on_reads_are_retried(faulty: tuple[str, FaultProxy]) -> None:
    url, proxy = faulty
    store = open_store(url)
    store.write_bytes("a/b.bin", b"x" * 5000)
    proxy.rules.append(_first("reset", lambda r: r.method in ("GET", "HEAD"), times=2))
    assert store.read_range("a/b.bin", 10, 20) == b"x" * 10
    assert store.read_bytes("a/b.bin") == b"x" * 5000


def test_the_end_of_an_object_is_known_by_status_never_by_message(
        faulty: tuple[str, FaultProxy]) -> None:
    """A range past the end is empty (the service answers 416); a 500 whose
    text happens to say 416 (an endpoint's port, a request id) is a failure
    to retry, not the object's end: the same kind as the s3direct bug (a
    reset on a port like :41623 read as a short file)."""
    url, proxy = faulty
    store = open_store(url)
    store.write_bytes("a/b.bin", b"x" * 5000)
    assert store.read_range("a/b.bin", 5000, 5100) == b""
    assert b"".join(store.iter_range("a/b.bin", 6000, 7000)) == b""
    ranged = lambda r: r.method == "GET" and any(  # noqa: E731 (Azure: x-ms-range)
        h.lower() in ("range", "x-ms-range") for h in r.headers)
    proxy.rules.append(_first("error", ranged, status=500, code="Port41623Range416Failure"))
    assert store.read_range("a/b.bin", 10, 20) == b"x" * 10  # retried
    proxy.rules.append(_first("error", ranged, times=1000, status=500,
                              code="Port41623Range416Failure 416 Range Not Satisfiable"))
    with pytest.raises(StorageError):
        store.read_range("a/b.bin", 10, 20)  # never b"": the object did not end


def test_a_commit_under_repeated_503s_lands_whole(faulty: tuple[str, FaultProxy]) -> None:
    """Every third request answered 503: the directory commits and verifies."""
    url, proxy = faulty
    store = open_store(url)
    condprobe.require_preconditions(store)
    seen = {"n": 0}

    def every_third(req: Request) -> Action | None:
        seen["n"] += 1
        return Action("error", status=503, code="ServerBusy") if seen["n"] % 3 == 0 else None

    proxy.rules.append(every_third)
    with DirectoryWriter(store, "runs/r/ckpt/step-000001", kind="checkpoint",
                         meta={"run_id": "r", "step": 1}) as w:
        w.write_bytes("model.safetensors", b"weights" * 100)
        w.write_json("config.json", {"d": 1})
        w.commit()
    proxy.rules.clear()
    assert verify_directory(store, "runs/r/ckpt/step-000001", full=True).ok
    assert seen["n"] >= 3  # faults were injected


def test_an_exclusive_large_write_never_replaces_an_object(
        faulty: tuple[str, FaultProxy]) -> None:
    """A file over one chunk (a resumable upload, a block list) written
    exclusively over an existing object fails and leaves that object as it was."""
    url, _ = faulty
    store = open_store(url)
    store.write_bytes("d/w.bin", b"theirs")
    big = os.urandom(8 * 1024 * 1024 + 100)
    with pytest.raises(ObjectExistsError):
        with store.open_write("d/w.bin", exclusive=True, size=len(big)) as f:
            f.write(big)
    assert store.read_bytes("d/w.bin") == b"theirs"
    with store.open_write("d/new.bin", exclusive=True, size=len(big)) as f:
        f.write(big)
    assert store.read_bytes("d/new.bin", limit=len(big)) == big
    assert store.walk_versions("d")["new.bin"] == (len(big), f.etag)  # type: ignore[attr-defined]


def test_gcs_chunks_grow_and_the_object_holds_every_byte(
        gcs_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A resumable upload's chunks double from CHUNK up to MAX_CHUNK (here
    256 KiB and 1 MiB); writes of odd sizes cross their edges; the object
    holds every byte and its generation is the writer's etag."""
    from registry.store import gcsupload

    monkeypatch.setattr(gcsupload, "CHUNK", 256 * 1024)
    monkeypatch.setattr(gcsupload, "MAX_CHUNK", 1024 * 1024)
    store = open_store(f"gs://{gcs_bucket}/root")
    data = os.urandom(5 * 1024 * 1024 + 12345)
    with store.open_write("d/big.bin", exclusive=True, size=len(data)) as f:
        for i in range(0, len(data), 100_003):
            f.write(data[i:i + 100_003])
    assert f._chunk == 1024 * 1024  # type: ignore[attr-defined]  # grew, and stopped at the cap
    assert store.read_bytes("d/big.bin", limit=len(data) + 1) == data
    assert store.walk_versions("d")["big.bin"] == (len(data), f.etag)  # type: ignore[attr-defined]


def test_a_block_corrupted_on_the_wire_is_refused(faulty: tuple[str, FaultProxy],
                                                  request: pytest.FixtureRequest) -> None:
    """Azure: a staged block whose bytes change on the way fails its
    Content-MD5 at the service. GCS: a resumable upload's chunk changed on
    the way is stored as sent, and the finished object's crc32c differs from
    the writer's; the write fails and nothing is visible."""
    url, proxy = faulty
    store = open_store(url)

    def flip(headers: dict[str, str], body: bytes) -> tuple[dict[str, str], bytes]:
        return headers, body[:-1] + bytes([body[-1] ^ 0xFF])

    if url.startswith("az://"):
        proxy.rules.append(_first("edit", lambda r: r.method == "PUT" and "blockid" in r.query,
                                  edit_request=flip))
    else:  # the session URL the emulator names is rewritten to go through the proxy
        emulator: FakeGCS = request.getfixturevalue("gcs_server")

        def via_proxy(req: Request, status: int, headers: list[tuple[str, str]],
                      body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
            return status, [(k, v.replace(emulator.endpoint, proxy.endpoint)
                             if k.lower() == "location" else v) for k, v in headers], body

        proxy.rules.append(lambda r: Action("edit", edit_response=via_proxy)
                           if r.method == "POST" and "resumable" in r.query.get("uploadType", [])
                           else None)
        proxy.rules.append(_first("edit", lambda r: r.method == "PUT" and "upload_id" in r.query,
                                  edit_request=flip))
    big = os.urandom(8 * 1024 * 1024 + 100)
    with pytest.raises(StorageError):
        with store.open_write("d/w.bin", size=len(big)) as f:
            f.write(big)
    assert not store.exists("d/w.bin")


# -- credentials ---------------------------------------------------------------------


def test_a_wrong_azure_key_is_named_never_printed(azurite_server: Azurite,
                                                  azure_container: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    wrong = "A" * 86 + "=="
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING",
                       azurite_server.connection_string.replace(KEY, wrong))
    url = f"az://{azure_container}/root"
    with pytest.raises(StoragePermissionError) as e:
        open_store(url).list_dir("")
    assert wrong not in str(e.value) and KEY not in str(e.value)
    assert "access denied" in str(e.value)
    r = run_cli("ckpt", "ls", "run-1", "--store", url)
    assert r.returncode == 6, (r.stdout, r.stderr)
    assert "access denied" in r.stderr and wrong not in r.stderr + r.stdout
    assert "Traceback" not in r.stderr


def test_azure_without_credentials_says_how_to_give_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_NAME"):
        monkeypatch.delenv(var, raising=False)
    r = run_cli("ckpt", "ls", "run-1", "--store", "az://c/root")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "AZURE_STORAGE_CONNECTION_STRING" in r.stderr and "Traceback" not in r.stderr


def test_a_missing_gcs_key_file_is_named(tmp_path: Path) -> None:
    """GOOGLE_APPLICATION_CREDENTIALS naming no file is refused at once (gcsfs
    would go on anonymously), by the API and the CLI (exit 2, one line)."""
    missing = tmp_path / "no-such-key.json"
    r = run_cli("ckpt", "ls", "run-1", "--store", "gs://b/root",
                env={"GOOGLE_APPLICATION_CREDENTIALS": str(missing)})
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert f"GOOGLE_APPLICATION_CREDENTIALS={missing}: no such file" in r.stderr
    assert "Traceback" not in r.stderr


# -- the README's tour --------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gcs", "azure"])
def test_the_tour_on_each_service(kind: str, request: pytest.FixtureRequest,
                                  tmp_path: Path) -> None:
    """``registry quickstart`` (train, SIGKILL and resume, release, sign, revoke
    a ledger source, alias, pull, verify) on fake-gcs-server and on Azurite."""
    if kind == "gcs":
        store = f"gs://{request.getfixturevalue('gcs_bucket')}/registry"
    else:
        store = f"az://{request.getfixturevalue('azure_container')}/registry"
    db = f"sqlite:///{tmp_path / 'index.db'}"
    r = run_cli("quickstart", "--store", store, "--db", db, "--workdir", str(tmp_path / "q"),
                cwd=tmp_path)
    assert r.returncode == 0, r.stderr + r.stdout
    check_outcome(store, tmp_path / "q", r.stdout)
