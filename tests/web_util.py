"""A small registry for the web tests, and a live `registry serve` process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from registry.api import Registry
from tests.ckpt_util import adamw, trainer_state
from tests.release_util import head, ledger_row, summary2  # noqa: F401  (re-exported)

#: what the model card's description says: markup that must render as text
EVIL = '<script>window.__pwned = 1; alert("pwned")</script><img src=x onerror="alert(2)">'
LOSSES = {10: 3.25, 20: 2.5, 30: 1.75}


def build(store_url: str, db_url: str) -> None:
    """Run ``r1`` (steps 10, 20, 30, each with a loss), model ``tiny`` with
    versions 1 (fails: source ``books`` revoked, and the policy), 2 (passes,
    alias ``prod``, a head) and 3 (passes; the only one trained on ``news``),
    and a revocation of ``books``."""
    with Registry(store_url, db=db_url) as reg:
        with reg.checkpoint_manager("r1", keep_ckpts=0, async_save=False) as m:
            for step, loss in LOSSES.items():
                rng = np.random.default_rng(step)
                params = {"embed.weight": rng.standard_normal((16, 8), dtype=np.float32),
                          "head.bias": rng.standard_normal(16, dtype=np.float32)}
                m.save(step, params, adamw(params), optimizer="adamw",
                       config={"hidden_size": 8},
                       trainer_state={**trainer_state(step), "loss": loss})
        reg.create_release("r1", 10, "tiny", "1", ledger=[ledger_row("wiki"),
                           ledger_row("books")], eval_summary=summary2(0.9, 2.0),
                           card_fields={"description": EVIL})
        reg.create_release("r1", 20, "tiny", "2", dtype="bf16", ledger=[ledger_row("wiki")],
                           eval_summary=summary2(0.95, 1.5), heads=[head(input_dim=8)])
        reg.create_release("r1", 30, "tiny", "3", ledger=[ledger_row("wiki"),
                           ledger_row("news")],
                           eval_summary=summary2(0.97, 1.2))
        reg.set_alias("tiny", "prod", "2")
        reg.set_policy("tiny", ["copy/accuracy>=0.92"])
        reg.revoke("books", "the publisher withdrew the licence")
        assert not reg.index_errors, reg.index_errors


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A module's fixture (import it by name): one local store and SQLite index
    holding :func:`build`'s registry, (store, db), for read-only tests."""
    root = tmp_path_factory.mktemp("web")
    store, db = str(root / "store"), f"sqlite:///{root / 'index.db'}"
    build(store, db)
    return store, db


@contextmanager
def serve(store_url: str, db_url: str, *args: str,
          env: dict[str, str] | None = None) -> Iterator[str]:
    """A real ``registry serve --port 0`` process; yields its base URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "registry", "serve", "--port", "0", "--store", store_url,
         "--db", db_url, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **(env or {})})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        if not m:
            proc.kill()
            raise AssertionError(f"registry serve did not start: {line!r} "
                                 f"{proc.communicate(timeout=30)[1]}")
        base = f"http://127.0.0.1:{m.group(1)}"
        _wait(base)
        yield base
    finally:
        global last_stderr
        proc.terminate()
        try:
            last_stderr = proc.communicate(timeout=20)[1]
        except subprocess.TimeoutExpired:
            proc.kill()
            last_stderr = proc.communicate()[1]


#: the stderr of the last process :func:`serve` ran (its log)
last_stderr = ""


def _wait(base: str) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(base + "/api/v1/openapi.json", timeout=5).read()
            return
        except urllib.error.HTTPError:
            return  # it answers (a token may be required)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
