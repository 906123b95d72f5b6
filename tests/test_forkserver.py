"""The suite's fork server (tests/support/forkserver.py) gives what a new
process gives, or every test that runs a child through it would be worth
less: the child's exit code, its own pid and environment, nothing carried from
one child to the next, and the same CLI answer as ``python -m registry``."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

from tests.conftest import run_cli
from tests.support.forkclient import python_popen, python_run


def test_exit_codes_tracebacks_and_signals_are_the_childs() -> None:
    assert python_run([sys.executable, "-c", "import sys; sys.exit(7)"]).returncode == 7
    r = python_run([sys.executable, "-c", "raise ValueError('boom')"], capture_output=True,
                   text=True)
    assert r.returncode == 1 and r.stderr.strip().endswith("ValueError: boom")
    p = python_popen([sys.executable, "-c", "import time; print('up', flush=True); "
                      "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "up\n" and p.pid != os.getpid()
    p.kill()
    assert p.wait(timeout=30) == -signal.SIGKILL
    p.stdout.close()


def test_nothing_one_child_does_reaches_the_next(tmp_path) -> None:
    code = ("import os, sys; print(os.environ.get('MARK'), 'json.tool' in sys.modules, "
            "os.getcwd()); import json.tool")
    a = python_run([sys.executable, "-c", code], capture_output=True, text=True,
                   env={**os.environ, "MARK": "a"}, cwd=tmp_path)
    b = python_run([sys.executable, "-c", code], capture_output=True, text=True)
    assert a.stdout.split() == ["a", "False", str(tmp_path)]
    assert b.stdout.split()[:2] == ["None", "False"]


def test_stdin_and_large_outputs_pass_whole() -> None:
    r = python_run([sys.executable, "-c", "import sys; d = sys.stdin.read(); "
                    "sys.stdout.write(d * 2); sys.stderr.write(str(len(d)))"],
                   input="x" * 300_000, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and len(r.stdout) == 600_000 and r.stderr == "300000"


def test_a_forked_cli_call_answers_as_a_new_interpreter(monkeypatch) -> None:
    argv = ("serve", "--port", "70000")
    forked = run_cli(*argv)
    monkeypatch.setenv("REGISTRY_TEST_FORK", "0")
    fresh = run_cli(*argv)
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        fresh.returncode, fresh.stdout, fresh.stderr)
    assert forked.returncode == 2 and forked.stderr.startswith("error: ")


BLAS_THREADS = ("import threadpoolctl, numpy\n"
                "print(max(p['num_threads'] for p in threadpoolctl.threadpool_info()"
                " if p['user_api'] == 'blas'))")


def test_a_thread_count_set_for_the_child_is_the_childs() -> None:
    """BLAS fixes its thread count when numpy loads (which the server did): a
    child given OPENBLAS_NUM_THREADS/OMP_NUM_THREADS other than the server's
    starts as a new interpreter, so it runs with its own count (a trainer's
    bitwise resume depends on it: test_trainer_kill)."""
    one = python_run([sys.executable, "-c", BLAS_THREADS], capture_output=True, text=True,
                     env={**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"})
    assert one.returncode == 0, one.stderr
    assert one.stdout.strip() == "1"
    forked = python_popen([sys.executable, "-c", "print(1)"], stdout=subprocess.PIPE)
    forked.communicate()
    pinned = python_popen([sys.executable, "-c", "print(1)"], stdout=subprocess.PIPE,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    pinned.communicate()
    if "OMP_NUM_THREADS" not in os.environ:
        assert not isinstance(forked, subprocess.Popen)
        assert isinstance(pinned, subprocess.Popen)


def test_the_example_trainer_is_a_new_interpreter() -> None:
    """The trainer pins BLAS to one thread before numpy loads, which a fork of
    the warm server (numpy loaded, two threads) cannot do."""
    p = python_popen([sys.executable, "-m", "registry.examples.tinytrainer", "--help"],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.communicate(timeout=120)
    assert isinstance(p, subprocess.Popen) and p.returncode == 0, err
