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

Cost: a fresh S3 client is ~0.3 s, so a few stores serve every cell, each
cell under its own model id or alias; retries wait ~10 ms (``retry_delay``)
and the read timeout is 0.3 s, both store options (registry.store.s3retry);
cells run on three lanes at once (a proxy and a store each), so one cell's
waits overlap another's work. The checks read the server directly.
"""

from __future__ import annotations

import hashlib
import os
import queue
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest

import registry.store.s3upload as s3mod
from registry.refs.alias_history import read_head
from registry.refs.aliases import set_alias
from registry.protocol.commit import commit_local_directory
from registry.errors import RegistryError
from registry.protocol.pointer import read_pointer
from registry.pull import pull
from registry.store import Store, open_store
from registry.store.s3probe import forget
from registry.protocol.verify import is_committed, read_manifest, verify_directory
from tests.support import moto_process
from tests.support.faultproxy import Action, FaultProxy, Request

READ_TIMEOUT = 0.3
#: parts of a file of known size are whole MiBs (registry.store.s3upload.part_size_for)
PART = 1024 * 1024
FAULTS = {
    "503": Action("error", status=503, code="SlowDown"),
    "500": Action("error", status=500, code="InternalError"),
    "reset": Action("reset"),
    "timeout": Action("delay", seconds=READ_TIMEOUT + 0.1),
    "done+500": Action("error_after", status=500, code="InternalError"),
}


#: cells run on this many lanes at once, each a proxy of its own and a store
#: through it (a lane's requests are numbered apart from the others').
LANES = 3


@dataclass
class Lane:
    proxy: FaultProxy
    store: Store


@dataclass
class Field:
    lanes: list[Lane]
    direct: Store  # the same store straight on the server: the checks


@pytest.fixture(scope="module")
def server(s3_server: object) -> Iterator[str]:
    """A moto server of its own (minimum part size lowered), bucket ``field``."""
    with moto_process.start({"S3_UPLOAD_PART_MIN_SIZE": str(PART)}) as endpoint:
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="field")
        yield endpoint


@pytest.fixture(scope="module")
def field(server: str) -> Iterator[Field]:
    """``LANES`` fault proxies in front of the server, each with a store
    through it (retries wait ~10 ms, reads time out after READ_TIMEOUT s),
    shared by the matrices (their cells use distinct names)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(s3mod, "PART_SIZE", PART)
        forget()
        url = f"s3://field/{uuid.uuid4().hex[:8]}"
        lanes = []
        for _ in range(LANES):
            proxy = FaultProxy(server).start()
            lanes.append(Lane(proxy, open_store(
                url, retry_delay=0.01, client_kwargs={"endpoint_url": proxy.endpoint},
                config_kwargs={"read_timeout": READ_TIMEOUT, "connect_timeout": 2})))
        direct = open_store(url, client_kwargs={"endpoint_url": server})
        yield Field(lanes, direct)
        for lane in lanes:
            lane.proxy.wait_idle()
            lane.proxy.stop()
            lane.store.close()
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
    pointer = read_head(store, model, "prod").version
    if pointer is not None:
        assert is_committed(store, f"models/{model}/{pointer}"), pointer


Cell = Callable[[Store, str], None]


def _run_cell(title: str, lane: Lane, fault: str, target: int, prepare: Cell, run: Cell,
              check: Callable[[str], None]) -> str:
    """One cell on one lane: ``prepare``, then ``run`` with request number
    ``target`` faulted, then ``check``. Returns "ok" or the error's line."""
    cell = f"x{fault.replace('+', '')}-{target}"  # not version-shaped (alias names)
    t0 = time.monotonic()
    prepare(lane.store, cell)
    lane.proxy.wait_idle()
    lane.proxy.reset()
    hit: list[str] = []

    def rule(req: Request) -> Action | None:
        if req.seq == target:
            hit.append(req.op)
            return FAULTS[fault]
        return None

    lane.proxy.rules[:] = [rule]
    try:
        run(lane.store, cell)
        outcome = "ok"
    except RegistryError as e:
        assert len(str(e).splitlines()) == 1, str(e)
        outcome = f"{type(e).__name__}: {e}"
    lane.proxy.wait_idle()  # a delayed request lands before the check
    lane.proxy.rules.clear()
    assert hit, f"{title} {cell}: request {target} never came"
    check(cell)
    if os.environ.get("FAULT_TRACE"):
        print(title, cell, hit, outcome, f"{time.monotonic() - t0:.2f}s", flush=True)
    return outcome


def _matrix(title: str, field: Field, prepare: Cell, run: Cell, check: Callable[[str], None],
            capsys: pytest.CaptureFixture[str]) -> Counter[str]:
    """Run ``run(store, cell)`` once cleanly, then under every fault at every
    request, cells spread over the lanes.

    ``prepare(store, cell)`` sets a cell up (unfaulted); ``check(cell)``
    asserts the invariants after the run, whatever its outcome. Returns the
    outcomes ("ok", or an error's class and line).
    """
    for i, lane in enumerate(field.lanes):  # each lane's one-time requests (the probe)
        prepare(lane.store, f"warm{i}")
        run(lane.store, f"warm{i}")
    first = field.lanes[0]
    prepare(first.store, "clean")
    first.proxy.wait_idle()
    first.proxy.reset()
    run(first.store, "clean")
    ops = [r.op for r in first.proxy.log]
    check("clean")
    cells: queue.SimpleQueue[tuple[str, int]] = queue.SimpleQueue()
    for fault in FAULTS:
        for target in range(len(ops)):
            cells.put((fault, target))
    results: dict[tuple[str, int], str] = {}

    def work(lane: Lane) -> None:
        while True:
            try:
                fault, target = cells.get_nowait()
            except queue.Empty:
                return
            results[fault, target] = _run_cell(title, lane, fault, target, prepare, run, check)

    started = time.monotonic()
    with ThreadPoolExecutor(len(field.lanes)) as pool:
        for done in [pool.submit(work, lane) for lane in field.lanes]:
            done.result()
    seconds = time.monotonic() - started
    rows = [f"{fault:>9} " + "".join("." if results[fault, t] == "ok" else "E"
                                    for t in range(len(ops))) for fault in FAULTS]
    header = " " * 10 + "".join(op[0] for op in ops)
    legend = ", ".join(f"{op[0]}={op}" for op in dict.fromkeys(ops))
    outcomes = Counter(results.values())
    with capsys.disabled():
        print(f"\n{title} fault matrix: {len(ops)} requests x {len(FAULTS)} faults, every "
              f"cell ({seconds:.0f} s on {len(field.lanes)} lanes); . = succeeded (retried), "
              f"E = failed with one clear error\n{header}\n" + "\n".join(rows)
              + f"\n({legend})\noutcomes: {dict(outcomes)}")
    return outcomes


@pytest.mark.slow
def test_publish_fault_matrix(field: Field, source: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    def publish(store: Store, cell: str) -> None:
        _commit(store, source, cell, "1")
        set_alias(store, cell, "prod", "1")

    outcomes = _matrix("publish", field, lambda store, cell: None, publish,
                       lambda cell: _check_store(field.direct, cell), capsys)
    # One fault, whatever it is and wherever it lands, is retried to success:
    # a lost answer to a conditional write is recognised by content or ETag.
    assert set(outcomes) == {"ok"}, dict(outcomes)


def test_alias_fault_matrix(field: Field, source: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    """Moving an existing alias (If-Match on its ETag), one alias per cell."""
    store = field.lanes[0].store
    _commit(store, source, "m", "1")
    _commit(store, source, "m", "2")

    def check(cell: str) -> None:
        _check_store(field.direct, "m")
        assert read_head(field.direct, "m", cell).version in ("1", "2")

    outcomes = _matrix("alias set", field, lambda store, cell: set_alias(store, "m", cell, "1"),
                       lambda store, cell: set_alias(store, "m", cell, "2"), check, capsys)
    assert set(outcomes) == {"ok"}, dict(outcomes)


def test_pull_fault_matrix(field: Field, source: Path, tmp_path: Path,
                           capsys: pytest.CaptureFixture[str]) -> None:
    store = field.lanes[0].store
    _commit(store, source, "pulled", "1")
    set_alias(store, "pulled", "prod", "1")
    files = read_manifest(store, "models/pulled/1").files

    def run(store: Store, cell: str) -> None:
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

    outcomes = _matrix("pull", field, lambda store, cell: None, run, check, capsys)
    assert set(outcomes) == {"ok"}, dict(outcomes)
