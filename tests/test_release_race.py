"""Racing and crashing publishers of one release version (DESIGN section 3, seed 000).

Every publisher is a real process: ``sys.executable`` running :data:`CHILD_CODE`
(written once per session to a temporary file), which imports the registry,
opens its store and calls ``ModelRelease.publish``. The S3 backend is the
session's moto server with every request serialized
(``tests.support.s3server.S3Server(serialize=True)``), so each conditional PUT
is atomic as on AWS; children reach it through the inherited ``AWS_*`` variables.

Race: 8 children, each with its own small model directory (distinct bytes in
every file), wait on a barrier file and then publish the same version at once.
The 8 are a pool of long-lived processes per backend (:data:`POOL_CODE`), each
taking one race after another from its stdin, so the 10 repetitions pay for 8
interpreters, not 80 (issue 33 item 6); every race is still 8 processes
racing on a fresh store.
Exactly one exits 0; the 7 others report ``VersionExistsError``. The committed
release verifies fully, holds exactly the winner's bytes and nothing else, and
the losers leave nothing behind (no staging directory, no claim). Repeated 10
times on local disk (staging + atomic rename) and 10 times on S3 (claim +
conditional create of the manifest).

Crash: a child publishes version ``v1`` and SIGKILLs itself at one boundary of
the commit protocol. The boundaries come from wrapping the Store class's methods
in the child only (no hook in library code). Afterwards ``v1`` is either
committed and fully verifying (with the crashed publisher's bytes) or not
committed at all; ``registry gc --older-than 0s`` (a real process) removes the
leftovers -- staging directories, claims, uncommitted files -- and never a
committed release: the previously committed version is untouched and
verifies. Publishing ``v1`` again then succeeds when the crash left it
uncommitted, and is refused when it had committed.

gc: committed versions whose valid names look like leftovers
(``1.tmp-0123456789ab``, ``keep.claim``) are neither deleted nor reported as
removed.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from registry.errors import NotCommittedError, VersionExistsError
from registry.protocol.manifest import MANIFEST
from registry.release import ModelRelease, release_prefix
from registry.release.inputs import dump_doc as _dump
from registry.formats.safetensors_io import write_safetensors
from registry.store import Store, join, open_store
from registry.protocol.verify import is_committed, read_manifest, verify_directory
from tests.conftest import make_store_url, run_cli
from tests.release_util import ledger_row, summary
from tests.support.forkclient import python_popen, python_run
from tests.support.servers import reap

MODEL_ID = "racer"
PUBLISHERS = 8
REPETITIONS = 10

#: The crashing publisher process: publish with the Store methods wrapped,
#: SIGKILLing itself at one event (the racers are :data:`POOL_CODE`).
CHILD_CODE = r'''
import functools, os, re, signal, sys, time
from collections import Counter

from registry.errors import RegistryError
from registry.release import ModelRelease

mode, url, model_dir, model_id, version, ledger, evals = sys.argv[1:8]
rel = ModelRelease(url)
rel.store.exists("warm-up")  # open connections before the contested part

if mode == "crash":
    kill_at = sys.argv[8]  # "<event>" or "<event>#<n>"
    event, _, nth = kill_at.partition("#")
    nth = int(nth or 1)
    seen = Counter()

    def name_of(key):
        return re.sub(r"\.tmp-[0-9a-f]+$", ".tmp-*", key.rstrip("/").rsplit("/", 1)[-1])

    def emit(ev):
        seen[ev] += 1
        print(f"event {ev}", file=sys.stderr, flush=True)
        if ev == event and seen[ev] == nth:
            print(f"KILL at {ev}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    class Watched:
        def __init__(self, raw, name):
            self._raw, self._name = raw, name
        def __getattr__(self, attr):
            return getattr(self._raw, attr)
        def write(self, data):
            n = self._raw.write(data)
            emit(f"write:{self._name}")
            return n
        def copy_from_fd(self, src_fd, on_chunk, **kw):
            # the kernel-copy path (local to local): a write event per landed chunk
            def chunk(offset, length):
                on_chunk(offset, length)
                emit(f"write:{self._name}")
            return self._raw.copy_from_fd(src_fd, chunk, **kw)
        def pwrite_direct(self, view, offset):
            # the direct-I/O path (local to local, large files): one event per buffer
            self._raw.pwrite_direct(view, offset)
            emit(f"write:{self._name}")
        def close(self):
            self._raw.close()
            emit(f"closed:{self._name}")
        def __enter__(self):
            return self
        def __exit__(self, exc_type, *rest):
            self._raw.__exit__(exc_type, *rest)
            if exc_type is None:
                emit(f"closed:{self._name}")

    cls = type(rel.store)

    def wrap(method):
        original = getattr(cls, method)

        @functools.wraps(original)
        def wrapper(self, key, *a, **kw):
            name = name_of(a[0] if method == "rename_dir" else key)
            emit(f"before:{method}:{name}")
            result = original(self, key, *a, **kw)
            if method == "open_write":
                result = Watched(result, name)
            emit(f"after:{method}:{name}")
            return result

        setattr(cls, method, wrapper)

    for method in ("open_write", "create", "rename_dir", "fsync_dir", "delete"):
        wrap(method)

try:
    rel.publish(model_dir, model_id, version, ledger=ledger, eval_summary=evals)
except RegistryError as e:
    print(f"ERROR {type(e).__name__}: {e}", flush=True)
    sys.exit(3)
print("PUBLISHED", flush=True)
'''


def releases_left(store: Store) -> list[tuple[str, bool]]:
    """What the model's folder holds, less its release counter
    (``models/<m>/.sequence``, moved by every publish: issue 31)."""
    return [e for e in store.list_dir(f"models/{MODEL_ID}") if e[0] != ".sequence"]


@pytest.fixture(scope="session")
def child_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("child") / "publish_child.py"
    path.write_text(CHILD_CODE)
    return path


class Source:
    """One publisher's inputs: a model directory and its ledger and eval summary,
    every byte distinct from any other publisher's."""

    def __init__(self, root: Path, tag: str, seed: int) -> None:
        self.tag = tag
        self.dir = root / f"model-{tag}"
        self.dir.mkdir(parents=True)
        rng = np.random.default_rng(seed)
        tensors = {"embed.weight": rng.standard_normal((16, 8), dtype=np.float32),
                   "norm.bias": np.full(8, seed, dtype=np.float32)}
        with open(self.dir / "model.safetensors", "wb") as f:
            write_safetensors(f, tensors, metadata={"format": "pt"},
                              path="model.safetensors")
        (self.dir / "config.json").write_text(json.dumps({"hidden_size": 8, "tag": tag}))
        (self.dir / "MODEL_CARD.md").write_text(f"# racer\n\nPublished by {tag}.\n")
        self.ledger = [ledger_row(f"src-{tag}")]
        self.evals = summary(0.5 + (seed % 97) / 200)
        self.ledger_file = root / f"ledger-{tag}.json"
        self.evals_file = root / f"evals-{tag}.json"
        self.ledger_file.write_text(json.dumps(self.ledger))
        self.evals_file.write_text(json.dumps(self.evals))

    def expected(self) -> dict[str, bytes]:
        """Every file of a release published from this source, and its bytes."""
        out = {name: (self.dir / name).read_bytes()
               for name in ("model.safetensors", "config.json", "MODEL_CARD.md")}
        out["ledger.json"] = _dump(self.ledger)
        out["evals/summary.json"] = _dump(self.evals)
        return out

    def args(self, mode: str, url: str, version: str) -> list[str]:
        return [mode, url, str(self.dir), MODEL_ID, version, str(self.ledger_file),
                str(self.evals_file)]

    def publish(self, url: str, version: str) -> Any:
        return ModelRelease(url).publish(self.dir, MODEL_ID, version, ledger=self.ledger,
                                         eval_summary=self.evals)


def assert_release_of(store: Store, version: str, src: Source) -> None:
    """``version`` is committed, verifies fully, and holds exactly ``src``'s bytes."""
    prefix = release_prefix(MODEL_ID, version)
    report = verify_directory(store, prefix, full=True)
    assert report.ok, report.to_dict()
    manifest = report.manifest
    assert manifest is not None
    assert manifest.meta["source"] == {"uri": str(src.dir.resolve())}
    expected = src.expected()
    assert {e.path for e in manifest.files} == set(expected)
    # Nothing else under the prefix: no byte of another publisher.
    assert set(store.walk_files(prefix)) == set(expected) | {MANIFEST}
    for name, data in expected.items():
        assert store.read_bytes(join(prefix, name)) == data, (version, name)


def snapshot(store: Store, version: str) -> tuple[str, dict[str, bytes]]:
    prefix = release_prefix(MODEL_ID, version)
    return (read_manifest(store, prefix).digest,
            {rel: store.read_bytes(join(prefix, rel)) for rel in store.walk_files(prefix)})


# -- 1. eight publishers, one version -----------------------------------------------------

#: A pooled publisher: one JSON job per stdin line (store URL, inputs, barrier
#: files), one JSON result per stdout line: rc 0 and ``PUBLISHED``, rc 3 and
#: ``ERROR <type>: <message>`` for a RegistryError, rc 1 for anything else
#: (its traceback on stderr). Each job opens its own store.
POOL_CODE = r'''
import json, os, sys, time, traceback

from registry.errors import RegistryError
from registry.release import ModelRelease

for line in sys.stdin:
    job = json.loads(line)
    rc, out = 1, "CRASHED"
    try:
        rel = ModelRelease(job["url"])
        rel.store.exists("warm-up")  # open connections before the contested part
        open(job["ready"], "w").close()
        deadline = time.monotonic() + 120
        while not os.path.exists(job["go"]):
            if time.monotonic() > deadline:
                raise TimeoutError("barrier: no go signal")
            time.sleep(0.0005)
        try:
            rel.publish(job["model_dir"], job["model_id"], job["version"],
                        ledger=job["ledger"], eval_summary=job["evals"])
            rc, out = 0, "PUBLISHED"
        except RegistryError as e:
            rc, out = 3, f"ERROR {type(e).__name__}: {e}"
        rel.store.close()
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
    print(json.dumps({"rc": rc, "out": out}), flush=True)
'''


class PublisherPool:
    """PUBLISHERS long-lived publisher processes for one backend, started with
    the environment of the first test that uses them (the backend's AWS_*)."""

    def __init__(self, script: Path, logs: Path) -> None:
        logs.mkdir(parents=True, exist_ok=True)
        self.logs = [logs / f"publisher-{i}.log" for i in range(PUBLISHERS)]
        self._files = [log.open("w") for log in self.logs]
        self.procs = [python_popen([sys.executable, str(script)], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=f, text=True)
                      for f in self._files]

    def _log_tail(self, i: int) -> str:
        return self.logs[i].read_text()[-800:]

    def race(self, sources: list[Source], url: str, version: str,
             tmp: Path) -> list[subprocess.CompletedProcess[str]]:
        """Each process publishes ``version`` from its source after one barrier;
        returns each one's outcome (rc, stdout line, its log's tail)."""
        go = tmp / "go"
        ready = [tmp / f"ready-{s.tag}" for s in sources]
        for p, s, r in zip(self.procs, sources, ready, strict=True):
            assert p.poll() is None and p.stdin is not None, "a pooled publisher died"
            p.stdin.write(json.dumps({
                "url": url, "model_dir": str(s.dir), "model_id": MODEL_ID,
                "version": version, "ledger": str(s.ledger_file),
                "evals": str(s.evals_file), "ready": str(r), "go": str(go)}) + "\n")
            p.stdin.flush()
        deadline = time.monotonic() + 120
        while not all(r.exists() for r in ready):
            dead = [i for i, p in enumerate(self.procs) if p.poll() is not None]
            if dead:
                raise AssertionError(f"a publisher died before the barrier:\n"
                                     f"{self._log_tail(dead[0])}")
            assert time.monotonic() < deadline, "publishers never reached the barrier"
            time.sleep(0.005)
        go.touch()
        results = []
        for i, (s, p) in enumerate(zip(sources, self.procs, strict=True)):
            assert p.stdout is not None
            line = p.stdout.readline()
            if not line:
                raise AssertionError(f"publisher {i} died mid-race:\n{self._log_tail(i)}")
            got = json.loads(line)
            results.append(subprocess.CompletedProcess([s.tag], got["rc"], got["out"] + "\n",
                                                       self._log_tail(i)))
        return results

    def close(self) -> None:
        for p in self.procs:
            if p.stdin is not None:
                p.stdin.close()
        for p in self.procs:
            reap(p, 30)
        for f in self._files:
            f.close()


class _Pools(dict[str, PublisherPool]):
    def __init__(self, script: Path, root: Path) -> None:
        super().__init__()
        self.script, self.root = script, root

    def __missing__(self, backend: str) -> PublisherPool:
        pool = self[backend] = PublisherPool(self.script, self.root / backend)
        return pool


@pytest.fixture(scope="module")
def publisher_pools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, PublisherPool]]:
    """backend -> its PublisherPool, started on first use, closed with the module."""
    root = tmp_path_factory.mktemp("pool")
    script = root / "pool_publisher.py"
    script.write_text(POOL_CODE)
    pools = _Pools(script, root)
    yield pools
    for pool in pools.values():
        pool.close()


@pytest.mark.slow
@pytest.mark.parametrize("rep", range(REPETITIONS))
def test_publish_race_one_winner(durable_store_url: str, rep: int, tmp_path: Path,
                                 publisher_pools: dict[str, PublisherPool],
                                 request: pytest.FixtureRequest) -> None:
    store = open_store(durable_store_url)
    # An earlier release of the same model, so the race is not on an empty folder.
    Source(tmp_path, "earlier", 1000 + rep).publish(durable_store_url, "0.9")
    before = snapshot(store, "0.9")

    sources = [Source(tmp_path, f"p{i}", rep * PUBLISHERS + i) for i in range(PUBLISHERS)]
    version = f"1.{rep}"
    pool = publisher_pools[request.node.callspec.params["durable_store_url"]]
    results = pool.race(sources, durable_store_url, version, tmp_path)

    detail = "\n".join(f"{r.args[0]}: rc={r.returncode} {r.stdout.strip()} "
                       f"{r.stderr.strip()[-800:]}" for r in results)
    winners = [i for i, r in enumerate(results) if r.returncode == 0]
    assert len(winners) == 1, detail
    for i, r in enumerate(results):
        if i in winners:
            assert r.stdout.strip() == "PUBLISHED", detail
        else:
            assert r.returncode == 3, detail
            assert r.stdout.startswith("ERROR VersionExistsError: "), detail

    assert_release_of(store, version, sources[winners[0]])
    # The losers left nothing: only the two committed versions remain.
    assert releases_left(store) == [("0.9", True), (version, True)]
    assert snapshot(store, "0.9") == before


# -- 2. a publisher killed at each boundary --------------------------------------------------

# (backend, boundary, event[#n] the child dies at, v1 committed afterwards?)
#
# Events, from the Store methods wrapped in the child: before:/after:<method>:<name>
# for open_write, create, rename_dir (name of the destination), fsync_dir and
# delete; write:<name> after each write to a file from open_write and
# closed:<name> once it is closed (durable: fsynced locally, the completed PUT
# on S3). <name> is the key's last segment, a staging suffix shown as .tmp-*.
#
# Local: model.safetensors, config.json, MODEL_CARD.md, ledger.json and
# summary.json into v1.tmp-*/, then MANIFEST.json, fsync_dir v1.tmp-*,
# rename_dir -> v1, fsync_dir of the model folder.
# S3: create v1.claim, the same five files in place under v1/, create
# MANIFEST.json (the commit), delete v1.claim.
CRASHES = [
    ("local", "mid-model-write", "write:model.safetensors", False),
    ("local", "after-model", "closed:model.safetensors", False),
    ("local", "after-config", "closed:config.json", False),
    ("local", "after-card", "closed:MODEL_CARD.md", False),
    ("local", "after-ledger", "closed:ledger.json", False),
    ("local", "after-evals", "closed:summary.json", False),
    ("local", "before-manifest", "before:open_write:MANIFEST.json", False),
    ("local", "after-manifest-before-rename", "closed:MANIFEST.json", False),
    ("local", "after-staging-fsync", "after:fsync_dir:v1.tmp-*", False),
    ("local", "after-rename", "after:rename_dir:v1", True),
    ("local", "after-parent-fsync", "after:fsync_dir:racer", True),
    ("s3", "before-claim", "before:create:v1.claim", False),
    ("s3", "after-claim", "after:create:v1.claim", False),
    ("s3", "after-model", "closed:model.safetensors", False),
    ("s3", "after-config", "closed:config.json", False),
    ("s3", "after-card", "closed:MODEL_CARD.md", False),
    ("s3", "after-ledger", "closed:ledger.json", False),
    ("s3", "after-evals", "closed:summary.json", False),
    ("s3", "before-manifest", "before:create:MANIFEST.json", False),
    ("s3", "after-manifest", "after:create:MANIFEST.json", True),
    ("s3", "after-claim-deleted", "after:delete:v1.claim", True),
]

#: committed before the crash and never touched by it or by gc.
OLD_VERSIONS = ("v0",)


@pytest.mark.slow
@pytest.mark.parametrize("backend,boundary,kill_at,committed", CRASHES,
                         ids=[f"{c[0]}-{c[1]}" for c in CRASHES])
def test_publish_killed(backend: str, boundary: str, kill_at: str, committed: bool,
                        request: pytest.FixtureRequest, tmp_path: Path,
                        child_script: Path) -> None:
    url = make_store_url(backend, request, tmp_path)
    store = open_store(url)
    old = {v: Source(tmp_path, f"old{i}", 100 + i) for i, v in enumerate(OLD_VERSIONS)}
    for v, src in old.items():
        src.publish(url, v)
    before = {v: snapshot(store, v) for v in OLD_VERSIONS}
    crashing = Source(tmp_path, "crash", 7)
    recovery = Source(tmp_path, "recovery", 8)
    prefix = release_prefix(MODEL_ID, "v1")

    proc = python_run([sys.executable, str(child_script), *crashing.args("crash", url, "v1"),
                           kill_at], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
    assert f"KILL at {kill_at.partition('#')[0]}" in proc.stderr

    # All or nothing: committed and fully verifying with the crashed publisher's
    # bytes, or not committed at all.
    report = verify_directory(store, prefix, full=True)
    assert (report.manifest is not None) == committed, (report.to_dict(), proc.stderr)
    if committed:
        assert_release_of(store, "v1", crashing)
    else:
        assert not is_committed(store, prefix)
        with pytest.raises(NotCommittedError):
            ModelRelease(url).facts(MODEL_ID, "v1")

    if backend == "s3" and store.exists(prefix + ".claim"):
        # A crashed claim names its writer, whose process is gone: it is not
        # live, so a new publisher or gc may take it over at once.
        from registry.protocol.claim import read_state
        seen = read_state(store, prefix + ".claim")
        assert seen is not None and seen[0].writer_gone and not seen[0].live

    gc = run_cli("gc", "--older-than", "0s", "--store", url, "--json")
    assert gc.returncode == 0, gc.stdout + gc.stderr
    removed = json.loads(gc.stdout)["removed"]
    assert removed == [] or all(re.search(r"/models/racer/v1((\.tmp-[0-9a-f]+)?(\.claim)?|/[^/]+ \(multipart upload\))$", k)
                                for k in removed), removed
    if committed:
        assert store.url_of(prefix) not in removed

    # Nothing but committed releases is left, and the old one is untouched.
    left = releases_left(store)
    leftovers = [n for n, _ in left if ".tmp-" in n or n.endswith(".claim")]
    assert not leftovers, f"gc left {leftovers} behind; it reported removing {removed}"
    expected_left = sorted([*OLD_VERSIONS, *(["v1"] if committed else [])])
    assert left == [(v, True) for v in expected_left], (left, removed)
    for v, src in old.items():
        assert_release_of(store, v, src)
        assert snapshot(store, v) == before[v]
    if committed:
        assert_release_of(store, "v1", crashing)
    else:
        assert store.walk_files(prefix) == {}

    # Publishing v1 again: a new release when the crash left none, else refused.
    if committed:
        with pytest.raises(VersionExistsError):
            recovery.publish(url, "v1")
        assert_release_of(store, "v1", crashing)
    else:
        recovery.publish(url, "v1")
        assert_release_of(store, "v1", recovery)
    assert releases_left(store) == [(v, True) for v in sorted([*OLD_VERSIONS, "v1"])]


# -- 3. gc and committed versions whose names look like leftovers ---------------------------

#: valid version names (``[A-Za-z0-9][A-Za-z0-9._-]{0,127}``) that look like a
#: staging directory or a claim to a collector going by names.
LOOKALIKES = ("1.tmp-0123456789ab", "keep.claim", "x.lock")


@pytest.mark.parametrize("version", LOOKALIKES)
def test_protocol_lookalike_versions_are_refused(durable_store_url: str, tmp_path: Path,
                                                 version: str) -> None:
    """Names that look like staging dirs, claims or locks are reserved, so gc can
    never mistake a release for a leftover."""
    from registry.errors import InvalidNameError
    store = open_store(durable_store_url)
    store.ensure_root()  # reading a store folder that does not exist is an error
    with pytest.raises(InvalidNameError, match="reserved"):
        Source(tmp_path, "look", 300).publish(durable_store_url, version)
    assert store.walk_files("models") == {}


def test_gc_keeps_and_does_not_report_committed_releases(durable_store_url: str,
                                                         tmp_path: Path) -> None:
    """``registry gc`` lists what it removed (or, with --dry-run, would remove):
    committed releases are neither removed nor listed."""
    store = open_store(durable_store_url)
    sources = {v: Source(tmp_path, f"keep{i}", 310 + i) for i, v in enumerate(("1.0", "2"))}
    for v, src in sources.items():
        src.publish(durable_store_url, v)
    before = {v: snapshot(store, v) for v in sources}
    dry = run_cli("gc", "--older-than", "0s", "--dry-run", "--store", durable_store_url,
                  "--json")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert json.loads(dry.stdout)["removed"] == []
    gc = run_cli("gc", "--older-than", "0s", "--store", durable_store_url, "--json")
    assert gc.returncode == 0, gc.stdout + gc.stderr
    assert json.loads(gc.stdout)["removed"] == []
    for v, src in sources.items():
        assert_release_of(store, v, src)
        assert snapshot(store, v) == before[v]
