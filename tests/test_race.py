"""Races between real processes on local disk and on a real S3 server (DESIGN section 3).

Every child is a separate Python process (``tests/support/commit_child.py``,
started with ``sys.executable``) that imports the registry and opens its store,
then waits on a barrier (a "go" file) so that all of them hit the contested
operation at once. S3 is the session's moto server with every request
serialized (``tests.support.s3server.S3Server(serialize=True)``), which makes
each conditional PUT atomic as on AWS; the children reach it through the
inherited ``AWS_*`` variables.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from registry.errors import CommitConflictError, PointerConflictError
from registry.protocol.manifest import MANIFEST, list_local_files
from registry.protocol.pointer import move_pointer, read_pointer
from registry.store import open_store
from registry.protocol.verify import is_committed, read_manifest, verify_directory
from tests.support.forkclient import python_popens

CHILD = Path(__file__).resolve().parent / "support" / "commit_child.py"
PREFIX = "runs/r/ckpt/step-000001"


def run_together(argvs: list[list[str]], tmp: Path, *,
                 timeout: float = 120.0) -> list[subprocess.CompletedProcess[str]]:
    """Start one child per argv, release them together, and wait for all."""
    tmp.mkdir(parents=True, exist_ok=True)
    go = tmp / "go"
    ready = [tmp / f"ready-{i}" for i in range(len(argvs))]
    with python_popens([[sys.executable, str(CHILD), *argv, "--ready", str(r), "--go", str(go)]
                        for argv, r in zip(argvs, ready, strict=True)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as procs:
        deadline = time.monotonic() + timeout
        while not all(r.exists() for r in ready):
            dead = [p for p in procs if p.poll() is not None]
            if dead:
                out, err = dead[0].communicate()
                raise AssertionError(f"child died before the barrier: {out}\n{err}")
            if time.monotonic() > deadline:
                raise AssertionError("children never reached the barrier")
            time.sleep(0.005)
        go.touch()
        results = []
        for argv, p in zip(argvs, procs, strict=True):
            out, err = p.communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(argv, p.returncode, out, err))
        return results


# -- two or four committers of the same directory ------------------------------


def make_source(root: Path, writer: int, round_: int) -> dict[str, bytes]:
    """A local directory whose every byte names its writer (and whose file set
    differs per writer), so any byte of a loser in the result is detectable."""
    tag = f"writer-{writer}-round-{round_}".encode()
    files = {
        "model.safetensors": tag * (400 + 37 * writer),
        "config.json": b'{"writer": %d, "round": %d}\n' % (writer, round_),
        "sub/optimizer.bin": bytes([writer]) * (2048 + writer) + tag,
        f"only-writer-{writer}.txt": tag,
    }
    for rel, data in files.items():
        path = root.joinpath(*rel.split("/"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    assert list_local_files(root) == sorted(files)
    return files


@pytest.mark.slow
@pytest.mark.parametrize(("writers", "rounds"), [(2, 5), (4, 3)])
def test_racing_commits_of_one_directory_exactly_one_wins(
        durable_store_url: str, tmp_path: Path, writers: int, rounds: int) -> None:
    store = open_store(durable_store_url)
    for rnd in range(rounds):
        prefix = f"runs/r{rnd}/ckpt/step-000001"
        sources = {}
        argvs = []
        for i in range(writers):
            src = tmp_path / f"src-{rnd}-{i}"
            sources[i] = make_source(src, i, rnd)
            # half the children use commit_local_directory, half DirectoryWriter
            argvs.append(["commit", durable_store_url, prefix, str(src),
                          "--via", "local" if i % 2 == 0 else "writer"])
        results = run_together(argvs, tmp_path / f"barrier-{rnd}")

        detail = "\n".join(f"writer {i}: rc={r.returncode} out={r.stdout!r} "
                           f"err={r.stderr[-2000:]!r}" for i, r in enumerate(results))
        winners = [i for i, r in enumerate(results) if r.returncode == 0]
        assert len(winners) == 1, f"round {rnd}: expected exactly one winner\n{detail}"
        for i, r in enumerate(results):
            if i in winners:
                assert r.stdout.strip() == "COMMITTED", detail
            else:
                assert r.returncode == 3, detail
                assert r.stdout.startswith(f"ERROR {CommitConflictError.__name__}: "), detail
                assert prefix in r.stdout, detail

        (winner,) = winners
        expected = sources[winner]
        report = verify_directory(store, prefix, full=True)
        assert report.ok, (report.to_dict(), detail)
        assert report.extras == (), f"files outside the manifest: {report.extras}"
        assert is_committed(store, prefix)
        manifest = read_manifest(store, prefix)
        assert [e.path for e in manifest.files] == sorted(expected)
        assert store.walk_files(prefix) == {MANIFEST: store.info(f"{prefix}/{MANIFEST}").size,
                                            **{k: len(v) for k, v in expected.items()}}
        for rel, data in expected.items():
            assert store.read_bytes(f"{prefix}/{rel}") == data, f"{rel}: not the winner's bytes"
        # nothing of any writer is left beside the directory: no claim, no staging
        assert store.list_dir(f"runs/r{rnd}/ckpt") == [("step-000001", True)], detail


# -- pointers ------------------------------------------------------------------------


@pytest.mark.slow
def test_racing_counter_increments_lose_no_update(durable_store_url: str,
                                                  tmp_path: Path) -> None:
    """Two processes each make N compare-and-swap increments of one pointer: no
    increment may be lost (the final value is 2N) and no value may be written
    twice (each successful increment moved the pointer from n to n + 1 itself)."""
    n = 30
    key = "runs/r/refs/counter"
    store = open_store(durable_store_url)
    move_pointer(store, key, "0", expected=None, check_expected=True)
    results = run_together([["counter", durable_store_url, key, str(n)]] * 2, tmp_path)
    for r in results:
        assert r.returncode == 0, r.stderr
    reports = [json.loads(r.stdout) for r in results]
    wrote = [v for rep in reports for v in rep["wrote"]]
    twice = sorted(v for v, c in Counter(wrote).items() if c > 1)
    final = read_pointer(store, key)
    conflicts = [rep["conflicts"] for rep in reports]
    assert not twice, (f"both processes report moving the counter to {twice}: an increment "
                       f"was lost (final {final}, conflicts {conflicts})")
    assert final == str(2 * n), f"final {final}, conflicts {conflicts}"
    assert sorted(wrote) == list(range(1, 2 * n + 1))


def test_stale_swap_is_refused_even_when_the_winner_wrote_the_same_value(
        durable_store_url: str) -> None:
    """The interleaving behind a lost counter update, made deterministic with two
    store objects: A and B both read "4"; B swaps in "5"; A's swap of "5" with
    its now-stale token must raise PointerConflictError (Store.swap: "replace
    only if its token is still expected"), else A counts an increment it never
    made. On S3, ``S3Store.swap`` reads the object back after the 412 and calls it
    a success because the bytes equal its own."""
    key = "runs/r/refs/counter"
    a, b = open_store(durable_store_url), open_store(durable_store_url)
    a.swap(key, b"4\n", None)
    _, token_a = a.read_versioned(key)
    _, token_b = b.read_versioned(key)
    b.swap(key, b"5\n", token_b)
    with pytest.raises(PointerConflictError):
        a.swap(key, b"5\n", token_a)


@pytest.mark.slow
def test_racing_forward_only_pointer_ends_at_the_max(durable_store_url: str,
                                                     tmp_path: Path) -> None:
    """One process moves LATEST to odd steps, one to even steps, interleaved;
    regressions are refused, and LATEST ends at the highest step."""
    last = 40
    key = "runs/r/ckpt/LATEST"
    store = open_store(durable_store_url)
    results = run_together([["forward", durable_store_url, key, "--parity", parity,
                             "--last", str(last)] for parity in ("odd", "even")], tmp_path)
    for r in results:
        assert r.returncode == 0, r.stderr
    reports = [json.loads(r.stdout) for r in results]
    assert read_pointer(store, key) == f"step-{last:06d}", reports
    # every process saw its own moves in increasing order, and the last even move won
    for rep in reports:
        steps = [int(v.split("-")[1]) for v in rep["moved"]]
        assert steps == sorted(steps)
    assert reports[1]["moved"][-1] == f"step-{last:06d}"
    assert store.read_bytes(key) == f"step-{last:06d}\n".encode()
    if store.local_path(key):  # only the lock file is left beside the pointer
        names = {name for name, _ in store.list_dir("runs/r/ckpt")}
        assert names <= {"LATEST", "LATEST.lock"}, names
        assert not os.path.exists(store.local_path(key) + ".tmp")
