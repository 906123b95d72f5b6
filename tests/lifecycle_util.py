"""Helpers of the release-lifecycle tests (issue 32 items 1-3)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from registry.api import Registry
from registry.events import iter_events
from registry.store import Store
from tests.release_util import ledger_row, summary
from tests.test_aliases import model_dir
from tests.support.forkclient import python_popen

REPO = Path(__file__).resolve().parent.parent
CHILD = REPO / "tests" / "support" / "lifecycle_child.py"


def publish(reg: Registry, tmp_path: Path, *versions: str, model_id: str = "m") -> None:
    for v in versions:
        reg.publish(model_dir(tmp_path), model_id, v, ledger=[ledger_row()],
                    eval_summary=summary(0.9, 0.5))


def cli_ok(p: subprocess.CompletedProcess[str]) -> Any:
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    return json.loads(p.stdout) if p.stdout.strip().startswith(("{", "[")) else p.stdout


def cli_error(p: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    assert p.stderr.startswith("error: ") and "Traceback" not in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    for n in needles:
        assert n in p.stderr, p.stderr


def event_names(store: Store) -> list[str]:
    return [e.name for e in iter_events(store)]


def children(*argvs: list[str]) -> list[subprocess.CompletedProcess[str]]:
    """Run ``tests/support/lifecycle_child.py`` once per argv, all at once."""
    procs = [python_popen([sys.executable, str(CHILD), *a], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=REPO,
                              env={**_env(), "PYTHONPATH": str(REPO)}) for a in argvs]
    out = []
    for p, a in zip(procs, argvs, strict=True):
        stdout, stderr = p.communicate(timeout=300)
        out.append(subprocess.CompletedProcess(a, p.returncode, stdout, stderr))
    return out


def workers_ok(store_url: str, db: str, op: str, workers: int, times: int) -> None:
    """``workers`` children at once, child i running ``op m 1 w<i> times``;
    each must exit 0."""
    for r in children(*[[store_url, db, op, "m", "1", f"w{i}", str(times)]
                        for i in range(workers)]):
        assert r.returncode == 0, r.stderr


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)
