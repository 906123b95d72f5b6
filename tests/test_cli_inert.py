"""CLI output is inert and keeps secrets (issue 30, items 5 and 6).

A store writer names files, writes revocation reasons and model-card text;
every CLI output path that shows them -- text and ``--json``, stdout and
stderr, success and error -- must show control characters as visible escapes
(no ``\\r``/``ESC`` reaches the terminal, no forged line), and a database URL's
password never appears, in real ``registry`` processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from registry.cli.output import inert, shown
from registry.host.redact import redact
from registry.store import open_store
from tests.test_cli_contract import _run as run_batch
from tests.test_signing import MODEL, model_dir, publish

#: what the issue found: erase the FAIL line and paint a green OK over it
HOSTILE = "zz\r\x1b[2K\x1b[32mOK all files verified\x1b[0m\nOK forged line \u202e\x9b"


def clean(text: str) -> None:
    for bad in ("\r", "\x1b", "\u202e", "\x9b"):
        assert bad not in text, (bad, text)
    assert not any(line.startswith("OK forged") for line in text.splitlines()), text


def test_inert_and_redact_helpers() -> None:
    assert inert("a\tb\nc") == "a\tb\nc"
    assert inert("\x1b[31m\r\x07\x7f\u2028") == "\\x1b[31m\\r\\x07\\x7f\\u2028"
    assert shown("a\nb\tc") == "a\\nb\\tc"
    assert inert("模型 ü é") == "模型 ü é"
    assert redact("postgresql+psycopg2://admin:S3cret@db:5432/r") == \
        "postgresql+psycopg2://admin:***@db:5432/r"
    assert redact("https://h/o?X-Amz-Signature=abc&x=1") == "https://h/o?X-Amz-Signature=***&x=1"
    assert redact("s3://bucket/a@b") == "s3://bucket/a@b"


@pytest.fixture()
def hostile_store(tmp_path: Path) -> tuple[str, str]:
    """Releases 1 and 2 of MODEL, 2 with a file named HOSTILE; a revocation
    whose reason carries escapes (a store writer's file)."""
    url = str(tmp_path / "store")
    store = open_store(url)
    publish(store, model_dir(tmp_path, "a"), "1", None)
    src = model_dir(tmp_path, "b", seed=2)
    (src / "data" / HOSTILE.replace("/", "_")).write_bytes(b"x")
    publish(store, src, "2", None)
    db = f"sqlite:///{tmp_path / 'i.db'}"
    from registry.api import Registry
    with Registry(url, db) as reg:
        reg.rebuild_index()
    return url, db


def test_every_output_path_shows_a_hostile_name_inertly(hostile_store: tuple[str, str],
                                                        tmp_path: Path) -> None:
    url, db = hostile_store
    store = open_store(url)
    hostile = f"data/{HOSTILE}"
    # the store writer changes the hostile file's bytes (and not the manifest)
    store.write_bytes(f"models/{MODEL}/2/{hostile}", b"changed")
    store.write_bytes(f"models/{MODEL}/2/extra-{HOSTILE[:12]}", b"unlisted")
    rev = Path(url) / "ledger" / "revocations"
    rev.mkdir(parents=True, exist_ok=True)
    (rev / "books.json").write_text(json.dumps({
        "source_id": "books", "revoked_at": "2026-01-01T00:00:00Z",
        "revocation_reason": f"withdrawn {HOSTILE}"}))
    s = ["--store", url]
    runs = {
        "verify": ["verify", str(Path(url) / "models" / MODEL / "2"), "--full"],
        "show": ["show", f"{MODEL}@2", *s, "--db", db],
        "diff": ["diff", f"{MODEL}@1", f"{MODEL}@2", *s, "--db", db],
        "ls": ["ls", MODEL, *s, "--db", db],
        "ledger ls": ["ledger", "ls", *s],
        "pull": ["pull", f"{MODEL}@2", "--to", str(tmp_path / "out"), "--cache",
                 str(tmp_path / "cache"), *s],
        "gate check": ["gate", "check", f"{MODEL}@2", *s],
    }
    cases = [(what, bool(extra)) for what in runs for extra in ([], ["--json"])]
    # one real process runs every case (registry.cli.main per case)
    got = run_batch(tmp_path, [runs[w] + (["--json"] if j else []) for w, j in cases])
    seen = {}
    for case, (code, out, err) in zip(cases, got, strict=True):
        assert "Traceback" not in err, (case, err)
        clean(out)
        clean(err)
        seen[case] = (code, out, err)
    code, out, _ = seen[("verify", False)]
    assert code == 1 and "FAIL data/zz\\r\\x1b[2K\\x1b[32mOK" in out, out
    assert "\\nOK forged line" in out
    assert "zz\\r" in seen[("pull", False)][2], seen[("pull", False)]
    assert "withdrawn zz\\r\\x1b" in seen[("ledger ls", False)][1]
    assert "\\u001b" in seen[("verify", True)][1]  # JSON escapes it too
    assert "data/zz\\r" in seen[("diff", False)][1]


PASSWORD = "S3cretPW"


DATABASES = [
    f"postgresql+psycopg2://admin:{PASSWORD}@127.0.0.1:5432/x",  # driver missing
    f"postgresql+nosuch://admin:{PASSWORD}@127.0.0.1/x",  # no such dialect
    f"postgresql+psycopg://admin:{PASSWORD}@127.0.0.1:5432/nosuchdb_trust",  # unreachable
]


def test_database_passwords_never_printed(tmp_path: Path) -> None:
    store = str(tmp_path / "s")
    argvs = [[*argv, "--store", store, "--db", db, *extra] for db in DATABASES
             for argv in (["ls"], ["index", "rebuild"], ["ledger", "revoke", "books",
                                                          "--reason", "r"])
             for extra in ([], ["--json"])]
    for argv, (code, out, err) in zip(argvs, run_batch(tmp_path, argvs), strict=True):
        assert code != 0, (argv, out)
        assert PASSWORD not in out + err, (argv, out, err)
        assert "admin:***@" in out + err, (argv, err)
        assert "Traceback" not in err
