"""Interrupted after the commit, a command still says what it committed (issue 47 item 4).

``registry publish`` is sent SIGINT at every point of its run (the start of
each store call, tests/support/sigint_child.py), on local disk; on S3 (moto)
at every point around the commit and a sample before it. Whatever point it
lands on, what the command printed matches what the store holds: a committed release is named once on stdout with its
manifest sha256 (the ``--json`` record with ``--json``), whether the
interrupt came before or after the command's own report; an uncommitted one
is never named, and the store holds nothing of it.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from registry.store import open_store
from registry.protocol.verify import read_manifest
from tests.conftest import make_store_url
from tests.release_util import ledger_row, summary
from tests.support.forkclient import python_run
from tests.test_pull import release_files

REPO = Path(__file__).resolve().parent.parent


def _run(at: int, args: list[str]) -> tuple[int, str, str]:
    p = python_run([sys.executable, "-m", "tests.support.sigint_child", str(at), *args],
                   capture_output=True, text=True, timeout=300, cwd=REPO)
    return p.returncode, p.stdout, p.stderr


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "as_json"), [("local", False), ("s3", True)],
                         ids=["local-text", "s3-json"])
def test_sigint_at_every_point_of_a_publish(request: pytest.FixtureRequest, tmp_path: Path,
                                            kind: str, as_json: bool) -> None:
    src = tmp_path / "src"
    for rel, data in release_files().items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    (tmp_path / "l.json").write_text(json.dumps([ledger_row()]))
    (tmp_path / "e.json").write_text(json.dumps(summary()))
    base = make_store_url(kind, request, tmp_path)

    def args(n: int) -> list[str]:
        return ["publish", str(src), "--model-id", "tiny", "--version", "1", "--ledger",
                str(tmp_path / "l.json"), "--evals", str(tmp_path / "e.json"),
                "--store", f"{base}/s{n}", "--db", f"sqlite:///{tmp_path / f'{n}.db'}",
                *(["--json"] if as_json else [])]

    code, _, err = _run(0, args(0))
    assert code == 0, err
    calls = int(re.search(r"calls (\d+)", err).group(1))  # type: ignore[union-attr]
    committed_seen = 0
    # on S3 (a second per run on this VM) every point of the last 20, where
    # the commit and the report are, and every sixth before them
    points = range(1, calls + 1) if kind == "local" else sorted(
        set(range(1, calls - 19, 6)) | set(range(max(1, calls - 19), calls + 1)))
    for n in points:
        code, out, err = _run(n, args(n))
        assert "Traceback" not in err, (n, err)
        store = open_store(f"{base}/s{n}")
        store.ensure_root()  # interrupted before the store folder was made
        if store.exists("models/tiny/1/MANIFEST.json"):
            committed_seen += 1
            digest = read_manifest(store, "models/tiny/1").digest
            if as_json:
                records = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
                assert [r["manifest_sha256"] for r in records] == [digest], (n, out, err)
            else:
                assert out.count("released tiny@1") == 1, (n, out, err)
                assert f"manifest sha256 {digest}" in out, (n, out)
            assert code in (0, 130), (n, code, err)
        else:
            assert code == 130, (n, code, out, err)
            assert "released" not in out and "manifest_sha256" not in out, (n, out)
            assert "interrupted by SIGINT" in err, (n, err)
            assert store.walk_files("models/tiny") == {}, n
    assert 0 < committed_seen < len(points)  # points on both sides of the commit were hit
