"""Issue 13 item 5: throttling and broken connections, as full fault matrices.

Three small operations run through the fault proxy in front of a real S3
server (moto, in its own process, with its minimum part size lowered so a
two-part multipart upload is 1 MiB):

- publish: a directory commit (a small file, a two-part multipart file, the
  claim, the manifest) then ``set_alias`` (the pointer move);
- alias: ``set_alias`` moving an existing alias to a second version;
- pull: ``pull`` of the alias into a fresh cache and target.

Each runs once cleanly to count its requests, then once per (fault, request)
pair with exactly that request faulted -- every fault at every request, no
sampling: 503 SlowDown, 500 InternalError, a connection reset, an answer
later than the read timeout, and an error reported after the server did the
work. Each run must succeed once (retried, bounded) or fail with one line;
never a committed directory that does not verify, never a pointer naming an
uncommitted directory, never a placed pull that does not verify. The
matrices are printed with the test output.

Cost: a fresh S3 client is ~0.3 s, so one store serves every cell, each
under its own model id; retries wait ~10 ms (``retry_delay``) and the read
timeout is 0.5 s, both store options (registry.store.s3retry).
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import boto3
import pytest

import registry.store.s3 as s3mod
from registry.aliases import set_alias
from registry.commit import commit_local_directory
from registry.errors import RegistryError
from registry.pointer import read_pointer
from registry.pull import pull
from registry.store import Store, open_store
from registry.store.s3probe import forget
from registry.verify import is_committed, read_manifest, verify_directory
from tests.support import moto_process
from tests.support.faultproxy import Action, FaultProxy, Request

READ_TIMEOUT = 0.3
#: parts of a file of known size are whole MiBs (registry.store.s3.part_size_for)
PART = 1024 * 1024
FAULTS = {
    "503": Action("error", status=503, code="SlowDown"),
    "500": Action("error", status=500, code="InternalError"),
    "reset": Action("reset"),
    "timeout": Action("delay", seconds=READ_TIMEOUT + 0.1),
    "done+500": Action("error_after", status=500, code="InternalError"),
}


@pytest.fixture(scope="module")
def field(s3_server: object) -> Iterator[FaultProxy]:
    """A fault proxy in front of a moto server of its own, holding bucket
    ``field``; ``proxy.upstream`` is the server itself."""
    with moto_process.start({"S3_UPLOAD_PART_MIN_SIZE": str(PART)}) as endpoint:
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="field")
        proxy = FaultProxy(endpoint).start()
        yield proxy
        proxy.stop()


@pytest.fixture
def stores(field: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Store, Store]]:
    """One store through the proxy (the operations run there; retries wait
    ~10 ms) and the same store straight on the server (the checks)."""
    monkeypatch.setattr(s3mod, "PART_SIZE", PART)
    field.reset()
    forget()
    url = f"s3://field/{uuid.uuid4().hex[:8]}"
    faulted = open_store(url, retry_delay=0.01, client_kwargs={"endpoint_url": field.endpoint},
                         config_kwargs={"read_timeout": READ_TIMEOUT, "connect_timeout": 2})
    direct = open_store(url, client_kwargs={"endpoint_url": field.upstream})
    yield faulted, direct
    field.wait_idle()
    field.reset()
    faulted.close()
    direct.close()
    forget()


@pytest.fixture
def source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text('{"a": 1}')
    (src / "model.bin").write_bytes(bytes(range(256)) * (PART // 256) + b"w" * 1000)  # 2 parts
    return src


def _commit(store: Store, src: Path, model: str, version: str) -> None:
    commit_local_directory(store, src, f"models/{model}/{version}", kind="checkpoint",
                           run_id="r", step=1)


def _check_store(store: Store, model: str) -> None:
    """Every committed version verifies in full; ``prod`` names a committed one."""
    for version, is_dir in store.list_dir(f"models/{model}"):
        if is_dir and version != "refs" and is_committed(store, f"models/{model}/{version}"):
            report = verify_directory(store, f"models/{model}/{version}", full=True)
            assert report.ok and report.extras == (), report.to_dict()
    pointer = read_pointer(store, f"models/{model}/refs/prod")
    if pointer is not None:
        assert is_committed(store, f"models/{model}/{pointer}"), pointer


Cell = Callable[[str], None]


def _matrix(title: str, proxy: FaultProxy, prepare: Cell, run: Cell, check: Cell,
            capsys: pytest.CaptureFixture[str]) -> Counter[str]:
    """Run ``run(cell)`` once cleanly, then under every fault at every request.

    ``prepare(cell)`` sets a cell up (unfaulted); ``check(cell)`` asserts the
    invariants after the run, whatever its outcome. Returns the outcomes.
    """
    prepare("warm")  # the store's one-time requests (the conditional-write probe)
    run("warm")
    prepare("clean")
    proxy.wait_idle()
    proxy.reset()
    run("clean")
    ops = [r.op for r in proxy.log]
    check("clean")
    rows, outcomes = [], Counter[str]()
    started = time.monotonic()
    for fault, action in FAULTS.items():
        line = []
        for target in range(len(ops)):
            cell = f"x{fault.replace('+', '')}-{target}"  # not version-shaped
            t0 = time.monotonic()
            prepare(cell)
            proxy.wait_idle()
            proxy.reset()
            hit: list[str] = []

            def rule(req: Request, target: int = target, act: Action = action,
                     hit: list[str] = hit) -> Action | None:
                if req.seq == target:
                    hit.append(req.op)
                    return act
                return None

            proxy.rules[:] = [rule]
            try:
                run(cell)
                outcome = "ok"
            except RegistryError as e:
                assert len(str(e).splitlines()) == 1, str(e)
                outcome = f"{type(e).__name__}: {e}"
            proxy.wait_idle()  # a delayed request lands before the check
            proxy.rules.clear()
            assert hit, f"{title} {cell}: request {target} never came"
            check(cell)
            outcomes["ok" if outcome == "ok" else outcome] += 1
            if os.environ.get("FAULT_TRACE"):
                print(title, cell, hit, outcome, f"{time.monotonic() - t0:.2f}s", flush=True)
            line.append("." if outcome == "ok" else "E")
        rows.append(f"{fault:>9} {''.join(line)}")
    header = " " * 10 + "".join(op[0] for op in ops)
    legend = ", ".join(f"{op[0]}={op}" for op in dict.fromkeys(ops))
    with capsys.disabled():
        print(f"\n{title} fault matrix: {len(ops)} requests x {len(FAULTS)} faults, every "
              f"cell ({time.monotonic() - started:.0f} s); . = succeeded (retried), "
              f"E = failed with one clear error\n{header}\n" + "\n".join(rows)
              + f"\n({legend})\noutcomes: {dict(outcomes)}")
    return outcomes


def test_publish_fault_matrix(field: FaultProxy, stores: tuple[Store, Store], source: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    store, direct = stores

    def publish(cell: str) -> None:
        _commit(store, source, cell, "1")
        set_alias(store, cell, "prod", "1")

    outcomes = _matrix("publish", field, lambda cell: None, publish,
                       lambda cell: _check_store(direct, cell), capsys)
    # One fault, whatever it is and wherever it lands, is retried to success:
    # a lost answer to a conditional write is recognised by content or ETag.
    assert set(outcomes) == {"ok"}, dict(outcomes)


def test_alias_fault_matrix(field: FaultProxy, stores: tuple[Store, Store], source: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    """Moving an existing alias (If-Match on its ETag), one alias per cell."""
    store, direct = stores
    _commit(store, source, "m", "1")
    _commit(store, source, "m", "2")

    def check(cell: str) -> None:
        _check_store(direct, "m")
        assert read_pointer(direct, f"models/m/refs/{cell}") in ("1", "2")

    outcomes = _matrix("alias set", field, lambda cell: set_alias(store, "m", cell, "1"),
                       lambda cell: set_alias(store, "m", cell, "2"), check, capsys)
    assert set(outcomes) == {"ok"}, dict(outcomes)


def test_pull_fault_matrix(field: FaultProxy, stores: tuple[Store, Store], source: Path,
                           tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store, _ = stores
    _commit(store, source, "pulled", "1")
    set_alias(store, "pulled", "prod", "1")
    files = read_manifest(store, "models/pulled/1").files

    def run(cell: str) -> None:
        pull(store, "pulled", "prod", to=tmp_path / cell / "model",
             cache=tmp_path / cell / "cache", workers=2)

    def check(cell: str) -> None:
        target, cache = tmp_path / cell / "model", tmp_path / cell / "cache"
        if target.exists():  # placed: it verifies in full, nothing else in it
            report = verify_directory(open_store(str(target.parent)), "model", full=True)
            assert report.ok and report.extras == (), report.to_dict()
            assert report.manifest is not None and report.manifest.files == files
        for blob in (cache / "blobs").rglob("*") if cache.exists() else ():
            if blob.is_file():
                assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name, blob

    outcomes = _matrix("pull", field, lambda cell: None, run, check, capsys)
    assert set(outcomes) == {"ok"}, dict(outcomes)
