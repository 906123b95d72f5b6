"""SIGTERM (what Kubernetes, systemd and ``docker stop`` send) is handled like
Ctrl-C by ``registry publish``, ``registry pull``, ``registry serve`` and a
training job's checkpoint save: real processes, signalled mid-work; each exits
143 with one line, leaves no staging directory, claim, partial download or held
lease, and commits nothing half-way (docs/errors.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from registry.api import Registry
from registry.checkpoint import CheckpointTree, run_root
from registry.host.interrupt import EXIT_SIGTERM
from registry.store import open_store
from tests.conftest import REPO
from tests.release_util import ledger_row, summary


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), **extra}


def _term_when(proc: subprocess.Popen[str], ready: Callable[[], bool],
               timeout: float = 120) -> tuple[int, str]:
    """SIGTERM ``proc`` as soon as ``ready()``; its exit code and stderr."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"finished before the signal: {proc.communicate()}"
        assert time.monotonic() < deadline, "never got ready"
        time.sleep(0.002)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def _model_dir(path: Path, mib: int) -> Path:
    """A model directory whose weights take ``mib`` MiB (long enough to signal mid-write)."""
    path.mkdir()
    rows = mib * 1024 * 1024 // 4 // 1024
    save_file({"w": np.random.default_rng(0).standard_normal((rows, 1024), np.float32)},
              str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"hidden_size": 1024}))
    return path


def _mib(url: str) -> int:
    """Weights large enough to signal a process mid-write (S3 through moto is slower)."""
    return 4 if url.startswith("s3://") else 16


def _keys(url: str, prefix: str) -> list[str]:
    """Every key under ``prefix`` (files, folder markers of staging and claims)."""
    store = open_store(url)
    try:
        out, todo = [], [prefix]
        while todo:
            here = todo.pop()
            for name, is_dir in store.list_dir(here):
                out.append(f"{here}/{name}")
                if is_dir:
                    todo.append(f"{here}/{name}")
        return sorted(out)
    finally:
        store.close()


@pytest.mark.parametrize("durable_store_url", ["local"], indirect=True)
def test_publish_sigterm_mid_write_commits_nothing_and_leaves_nothing(
        durable_store_url: str, tmp_path: Path) -> None:
    """Local disk only: on S3 a publish signalled mid-upload can leave its claim,
    or its uploaded files and claim (found by this test; not fixed yet, see
    docs/decisions.md): ``registry gc`` removes them, nothing is committed."""
    (tmp_path / "ledger.json").write_text(json.dumps([ledger_row()]))
    (tmp_path / "summary.json").write_text(json.dumps(summary()))
    db = f"sqlite:///{tmp_path / 'i.db'}"
    hf = _model_dir(tmp_path / "hf", _mib(durable_store_url))
    open_store(durable_store_url).ensure_root()
    proc = subprocess.Popen(
        [sys.executable, "-m", "registry", "publish", str(hf), "--model-id", "m", "--version",
         "1", "--ledger", str(tmp_path / "ledger.json"), "--evals",
         str(tmp_path / "summary.json"), "--store", durable_store_url, "--db", db],
        env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    code, err = _term_when(proc, lambda: bool(_keys(durable_store_url, "models/m")))
    assert code == EXIT_SIGTERM, err
    assert err.count("\n") == 1 and err.startswith("error: registry publish: interrupted by "
                                                   "SIGTERM") and "index rebuild" in err, err
    assert _keys(durable_store_url, "models/m") == []  # no staging, claim or file
    with Registry(durable_store_url, db) as reg:
        assert reg.rebuild_index()["releases"] == 0


def test_pull_sigterm_mid_download_leaves_no_partial_file_or_lease(
        durable_store_url: str, tmp_path: Path) -> None:
    with Registry(durable_store_url, f"sqlite:///{tmp_path / 'i.db'}") as reg:
        reg.publish(_model_dir(tmp_path / "hf", _mib(durable_store_url)), "m", "1",
                    ledger=[ledger_row()], eval_summary=summary())
    cache, target = tmp_path / "cache", tmp_path / "served"
    proc = subprocess.Popen(
        [sys.executable, "-m", "registry", "pull", "m@1", "--to", str(target), "--blobs",
         "--cache", str(cache), "--store", durable_store_url],
        env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    code, err = _term_when(proc, lambda: any((cache / "tmp").glob("*.incomplete")))
    assert code == EXIT_SIGTERM, err
    assert err == "error: registry pull: interrupted by SIGTERM\n", err
    assert not list((cache / "tmp").iterdir()) and not list((cache / "leases").iterdir())
    assert not target.exists() and not [p for p in tmp_path.iterdir()
                                        if p.name.startswith((".served", "served"))]


def test_checkpoint_save_sigterm_while_staged_commits_nothing(
        durable_store_url: str, tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.sigterm_saver_child", durable_store_url, "r1",
         str(tmp_path)], env=_env(), cwd=REPO, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    code, err = _term_when(proc, lambda: (tmp_path / "staged").exists())
    assert code == EXIT_SIGTERM and err == "interrupted by SIGTERM\n", err
    store = open_store(durable_store_url)
    tree = CheckpointTree(store, run_root("r1"))
    assert tree.steps() == [100] and tree.latest() == 100
    names = [n for n, _ in store.list_dir(run_root("r1"))]
    assert not [n for n in names if ".tmp" in n or n.endswith(".claim")], names
    lease = json.loads(store.read_bytes(f"{run_root('r1')}/WRITER.lease"))
    assert lease["released"] is True
    store.close()


def test_tinytrainer_sigterm_exits_143_and_resumes(tmp_path: Path) -> None:
    """The example trainer, signalled while it trains and saves every 3 steps."""
    store = str(tmp_path / "store")
    argv = [sys.executable, "-m", "registry.examples.tinytrainer", "--store", store,
            "--run-id", "r", "--ckpt-every", "3", "--steps", "60"]
    latest = tmp_path / "store/runs/r/ckpt/LATEST"
    proc = subprocess.Popen(argv, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    code, err = _term_when(proc, latest.exists)
    assert code == EXIT_SIGTERM, err
    assert err == "tinytrainer: interrupted by SIGTERM: resume with --resume\n", err
    names = os.listdir(tmp_path / "store/runs/r/ckpt")
    assert not [n for n in names if ".tmp" in n], names
    lease = json.loads((tmp_path / "store/runs/r/ckpt/WRITER.lease").read_text())
    assert lease["released"] is True
    step = latest.read_text().strip()
    p = subprocess.run([*argv, "--resume"], env=_env(), capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and f"resumed from {tmp_path}/store/runs/r/ckpt/{step}" in p.stderr, \
        p.stderr


@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_serve_sigterm_stops_with_143(tmp_path: Path) -> None:
    pytest.importorskip("uvicorn")
    proc = subprocess.Popen([sys.executable, "-m", "registry", "serve", "--port", "0",
                             "--store", str(tmp_path / "store"),
                             "--db", f"sqlite:///{tmp_path / 'i.db'}"],
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("serving ") and "Index(" not in line, line
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_SIGTERM, err
    assert err.endswith("error: registry serve: interrupted by SIGTERM\n"), err


# -- an interrupt between taking a claim and the `with` that would release it ------------
#
# Found by test_publish_sigterm_mid_write_commits_nothing_and_leaves_nothing
# (which signals as soon as anything appears under models/m, i.e. the claim):
# a SIGTERM landing inside DirectoryWriter's constructor, after the claim was
# created, left the claim behind, since `with` had not yet entered.


@pytest.mark.parametrize("where", ["learn_token", "start"])
def test_claim_interrupted_right_after_its_create_is_deleted(
        durable_store_url: str, where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from registry.protocol.claim import Claim

    store = open_store(durable_store_url)
    store.ensure_root()

    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(Claim, f"_{where}", interrupted)
    with pytest.raises(KeyboardInterrupt):
        Claim(store, "models/m/1.claim").take()
    assert not store.exists("models/m/1.claim")


#: Takes a claim, then dies by SIGKILL: its claim names a dead process on this host.
_DIES_HOLDING = ("import os, signal, sys\n"
                 "from registry.protocol.claim import Claim\n"
                 "from registry.store import open_store\n"
                 "Claim(open_store(sys.argv[1]), 'models/m/1.claim').take()\n"
                 "os.kill(os.getpid(), signal.SIGKILL)\n")


@pytest.mark.parametrize("where", ["swap", "learn_token", "start"])
def test_claim_takeover_interrupted_leaves_no_claim_of_ours(
        durable_store_url: str, where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Taking over a dead writer's claim (compare-and-swap on it), interrupted
    right after the swap landed on the server, or while the new claim is being
    recorded: the claim now holding our body is deleted, so no claim outlives
    a writer that never used it (the dead one's was replaced: it is gone too)."""
    from registry.protocol.claim import Claim, read_state
    from tests.support.forkclient import python_run

    store = open_store(durable_store_url)
    store.ensure_root()
    killed = python_run([sys.executable, "-c", _DIES_HOLDING, durable_store_url],
                        env=_env(), capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    seen = read_state(store, "models/m/1.claim")
    assert seen is not None and not seen[0].live  # a dead writer's claim, there to take over

    def interrupted(*_: object, **__: object) -> None:
        raise KeyboardInterrupt

    if where == "swap":
        real = type(store).swap

        def swapped_then_interrupted(self: object, *a: object, **k: object) -> None:
            real(self, *a, **k)  # the server did the work; the answer never came
            raise KeyboardInterrupt

        monkeypatch.setattr(type(store), "swap", swapped_then_interrupted)
    else:
        monkeypatch.setattr(Claim, f"_{where}", interrupted)
    with pytest.raises(KeyboardInterrupt):
        Claim(store, "models/m/1.claim").take()
    monkeypatch.undo()
    assert not store.exists("models/m/1.claim")


@pytest.mark.parametrize("durable_store_url", ["local", "s3"], indirect=True)
def test_writer_interrupted_in_its_constructor_leaves_no_claim(
        durable_store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Local: the staging claim (sole writer: while its staging is cleared);
    S3: the directory's claim (while the leftovers of a crashed writer are
    deleted)."""
    from registry.protocol.commit import DirectoryWriter

    store = open_store(durable_store_url)
    store.ensure_root()

    def interrupted(*_: object, **__: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(type(store), "delete_prefix", interrupted)
    with pytest.raises(KeyboardInterrupt):
        DirectoryWriter(store, "runs/r/ckpt/step_1", kind="checkpoint", meta={}, sole_writer=True)
    monkeypatch.undo()
    assert [k for k in store.walk_files("runs") if k.endswith(".claim")] == []


def test_an_interrupt_during_a_deferred_step_is_raised_when_it_ends() -> None:
    """interrupt.deferred (around a claim's take in DirectoryWriter): the step
    finishes, then the signal's interrupt is raised, so a claim just taken is
    always recorded and can be released. Without it, a SIGTERM landing between
    the claim's create and its recording left the claim (the flaky
    test_publish_sigterm_mid_write_commits_nothing_and_leaves_nothing)."""
    import os
    import signal as sig

    from registry.host import interrupt

    interrupt.terminate_like_interrupt()
    done = []
    try:
        with pytest.raises(KeyboardInterrupt):
            with interrupt.deferred():
                os.kill(os.getpid(), sig.SIGTERM)
                done.append("step")
        assert done == ["step"]
    finally:
        sig.signal(sig.SIGTERM, sig.SIG_DFL)
