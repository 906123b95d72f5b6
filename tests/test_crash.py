"""Kill a committing process at every boundary of the commit protocol (DESIGN section 3).

A child process (``tests/support/commit_child.py crash``) commits
``runs/r/ckpt/step-000002`` (three data files, then MANIFEST.json) and moves
``LATEST`` to it. It wraps the Store methods *in its own process only* and
SIGKILLs itself at the chosen boundary; the library has no hooks. Before it runs,
``step-000001`` is committed and ``LATEST`` names it.

After the kill, a fresh reader must see the previous state (LATEST ->
step-000001, step-000002 not committed) or the new one (step-000002 committed
and fully verifying, LATEST -> step-000001 or step-000002), never a mix; the
verify CLI, run in its own process, must agree. Then a new writer recovers: it
commits step-000002 (overriding a crashed claim on S3 with ``sole_writer``), or,
when the crashed writer had already committed, is refused.

Local disk commits by staging + atomic rename; S3 (the session's serialized moto
server, reached by the children through the inherited ``AWS_*`` variables) by
claim + files in place + conditional create of the manifest.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from registry.protocol.commit import CLAIM_SUFFIX, DirectoryWriter
from registry.errors import CommitConflictError
from registry.protocol.manifest import MANIFEST
from registry.protocol.pointer import move_pointer, read_pointer
from registry.store import Store, open_store
from registry.protocol.verify import is_committed, verify_directory
from tests.conftest import run_cli
from tests.support.commit_child import CKPT, CRASH_FILES, LATEST, STEP2, step_order
from tests.support.forkclient import python_run

CHILD = Path(__file__).resolve().parent / "support" / "commit_child.py"
STEP1 = f"{CKPT}/step-000001"
STEP_RE = re.compile(r"step-\d{6,}")

STEP1_FILES = {
    "model.safetensors": b"m" * 2500 + b"model-step-1",
    "optimizer.bin": b"o" * 1500 + b"optim-step-1",
    "trainer_state.json": b'{"step": 1, "loss": 2.5}\n',
}
#: what the recovering writer commits: other bytes, and one file fewer, so a
#: leftover of the crashed writer would show.
RECOVERY_FILES = {
    "model.safetensors": b"R" * 1800 + b"model-step-2-recovered",
    "trainer_state.json": b'{"step": 2, "loss": 1.0, "recovered": true}\n',
}

# (backend, boundary, event:n the child dies at, step-000002 committed?, LATEST after)
#
# Event order in the child -- local: open_write/write/write/closed x 3 data files
# into step-000002.tmp-<id>/, open_write + closed of MANIFEST.json, fsync_dir of
# the staging dir, rename_dir, fsync_dir of ckpt/, swap of LATEST.
# S3: create (the .claim), open_write/write/write/closed x 3 data files in place
# (each closed is the completed PUT), create (MANIFEST.json), delete (the
# claim), swap of LATEST.
OLD, NEW = "step-000001", "step-000002"
CASES = [
    ("local", "before-data-1", "before:open_write:1", False, OLD),
    ("local", "mid-data-2", "write:3", False, OLD),
    ("local", "after-data-1", "closed:1", False, OLD),
    ("local", "after-data-2", "closed:2", False, OLD),
    ("local", "after-data-3-before-manifest", "closed:3", False, OLD),
    ("local", "after-manifest", "closed:4", False, OLD),
    ("local", "before-rename", "before:rename_dir:1", False, OLD),
    ("local", "after-rename", "after:rename_dir:1", True, OLD),
    ("local", "before-swap", "before:swap:1", True, OLD),
    ("local", "after-swap", "after:swap:1", True, NEW),
    ("s3", "before-claim", "before:create:1", False, OLD),
    ("s3", "after-claim-before-data-1", "before:open_write:1", False, OLD),
    ("s3", "mid-data-2", "write:3", False, OLD),
    ("s3", "after-data-1", "closed:1", False, OLD),
    ("s3", "after-data-2", "closed:2", False, OLD),
    # swap #1 on S3 is the claim's compare-and-swap renewal before the manifest
    ("s3", "at-claim-renewal", "before:swap:1", False, OLD),
    ("s3", "after-data-3-before-manifest", "before:create:2", False, OLD),
    ("s3", "after-manifest", "after:create:2", True, OLD),
    ("s3", "after-claim-release-before-swap", "before:swap:2", True, OLD),
    ("s3", "after-swap", "after:swap:2", True, NEW),
]


@pytest.fixture
def crash_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    backend = request.node.callspec.params["backend"]
    if backend == "local":
        return str(tmp_path / "store")
    return f"s3://{request.getfixturevalue('s3_bucket')}/root"


def commit_files(store: Store, prefix: str, files: dict[str, bytes], step: int, *,
                 sole_writer: bool = False) -> None:
    with DirectoryWriter(store, prefix, kind="checkpoint", meta={"run_id": "r", "step": step},
                         sole_writer=sole_writer) as w:
        for name, data in files.items():
            w.write_bytes(name, data)
        w.commit()


def assert_holds_exactly(store: Store, prefix: str, files: dict[str, bytes]) -> None:
    """``prefix`` is committed, verifies fully, and holds exactly ``files``."""
    report = verify_directory(store, prefix, full=True)
    assert report.ok, report.to_dict()
    assert report.extras == (), report.to_dict()
    assert report.manifest is not None
    assert sorted(e.path for e in report.manifest.files) == sorted(files)
    assert set(store.walk_files(prefix)) == {*files, MANIFEST}
    for name, data in files.items():
        assert store.read_bytes(f"{prefix}/{name}") == data, f"{prefix}/{name}"


def committed_steps(store: Store) -> list[str]:
    """What a reader that lists ckpt/ finds: step directories that are committed."""
    return [d for d in store.subdirs(CKPT)
            if STEP_RE.fullmatch(d) and is_committed(store, f"{CKPT}/{d}")]


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "boundary", "kill_at", "committed", "latest"), CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_kill_at_boundary_leaves_old_or_new_state(
        crash_store_url: str, backend: str, boundary: str, kill_at: str, committed: bool,
        latest: str) -> None:
    url = crash_store_url
    store = open_store(url)
    assert store.atomic_rename == (backend == "local")
    commit_files(store, STEP1, STEP1_FILES, 1)
    move_pointer(store, LATEST, OLD, order=step_order)

    child = python_run([sys.executable, str(CHILD), "crash", url, "--kill", kill_at],
                           capture_output=True, text=True, timeout=120)
    log = f"rc={child.returncode}\nstdout={child.stdout}\nstderr={child.stderr[-3000:]}"
    assert child.returncode == -signal.SIGKILL, f"the child was not killed at {kill_at}\n{log}"
    assert f"KILL at {kill_at.rpartition(':')[0]} #" in child.stderr, log

    # -- what a reader sees now (a fresh store object, as a new process would) --
    reader = open_store(url)
    assert_holds_exactly(reader, STEP1, STEP1_FILES)  # the previous state is intact

    pointed = read_pointer(reader, LATEST, pattern=STEP_RE)
    assert pointed == latest, log
    assert verify_directory(reader, f"{CKPT}/{pointed}", full=True).ok, \
        f"LATEST names {pointed}, which is not committed"

    full = verify_directory(reader, STEP2, full=True)
    assert is_committed(reader, STEP2) == committed, (full.to_dict(), log)
    assert full.ok == committed, (full.to_dict(), log)  # committed only if all bytes verify
    if committed:
        assert_holds_exactly(reader, STEP2, CRASH_FILES)
        assert committed_steps(reader) == [OLD, NEW]
    else:
        assert full.manifest is None and full.problems == (), full.to_dict()
        assert committed_steps(reader) == [OLD]
        if backend == "local":  # nothing at the final name until the rename
            assert not reader.exists(f"{STEP2}/{MANIFEST}")
            assert "step-000002" not in reader.subdirs(CKPT)

    # the CLI, in its own process, agrees: exit 0 iff committed
    cli = run_cli("verify", reader.url_of(STEP2), "--full")
    nothing = not reader.walk_files(STEP2)
    # exit 0 iff committed; nothing at all stored there is "no such directory" (3)
    assert cli.returncode == (0 if committed else 3 if nothing else 1), \
        f"{cli.stdout}\n{cli.stderr}"
    if committed:
        assert cli.stdout.startswith("OK "), cli.stdout
    elif nothing:
        assert "no such directory" in cli.stderr, cli.stderr
    else:
        assert cli.stdout.startswith("NOT COMMITTED "), cli.stdout

    # -- leftovers of the crashed writer, visible but never read as committed --
    names = {name for name, _ in reader.list_dir(CKPT)}
    staging = sorted(n for n in names if n.startswith("step-000002.tmp")
                     and not n.endswith(CLAIM_SUFFIX))  # a staging dir's claim is beside it
    claim = reader.exists(STEP2 + CLAIM_SUFFIX)
    if backend == "local":
        assert not claim
        staged = kill_at not in ("before:open_write:1",) and not committed
        assert len(staging) == (1 if staged else 0), names
    else:
        assert staging == []
        assert claim == (kill_at not in ("before:create:1", "before:swap:2", "after:swap:2")), names

    # -- recovery: a new writer of step-000002 --
    if committed:
        with pytest.raises(CommitConflictError, match="already committed"):
            commit_files(reader, STEP2, RECOVERY_FILES, 2, sole_writer=True)
        final_files = CRASH_FILES
    else:
        # The crashed writer's claim names a process that is gone (this host),
        # so an ordinary writer takes it over at once and commits.
        commit_files(reader, STEP2, RECOVERY_FILES, 2)
        final_files = RECOVERY_FILES
    assert_holds_exactly(reader, STEP2, final_files)
    assert not reader.exists(STEP2 + CLAIM_SUFFIX) or committed
    move_pointer(reader, LATEST, NEW, order=step_order)
    assert read_pointer(reader, LATEST, pattern=STEP_RE) == NEW
    assert committed_steps(reader) == [OLD, NEW]
    assert_holds_exactly(reader, STEP1, STEP1_FILES)
