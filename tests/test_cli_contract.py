"""The CLI contract (issue 16): every command, given bad input, says what happened in
one line (or one JSON document with --json), exits with the code of the README's
table, and never prints a traceback.

One table of cases drives it: each case runs twice, as text and with ``--json``,
in one child process for the whole table (``registry.cli.main`` called per case,
output captured), against a small world on local disk: a run with one
checkpoint, a passing release, a release failing its gates since a revocation,
an alias on it, good and bad input documents, a damaged SQLite index.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from registry.rules import schemas
from registry.api import Registry
from registry.checkpoint import CheckpointManager
from registry.cli.errors import EXIT_CODES, EXIT_NOT_INDEXED
from tests.ckpt_util import save
from tests.conftest import REPO, run_cli_batch
from tests.release_util import head, ledger_row, summary

#: Each case: (id, argv, exit code, words stderr must hold in text mode).
#: ``{w}`` is the world's folder; every command runs in it, so the default
#: store is ./artifacts and the default index ./registry.db.
BAD_DB = "sqlite:///{w}/no-such-dir/index.db"
PG_DOWN = "postgresql+psycopg://postgres@127.0.0.1:1/x"
PUB = ["--model-id", "pub", "--ledger", "{w}/ledger.json", "--evals", "{w}/summary.json"]
#: a publish of the world's model directory as pub@9; a case appends what it changes
PUB9 = ["publish", "{w}/hf", *PUB, "--version", "9"]
REL = ["release", "create", "--run", "r1", "--model-id", "rel", "--evals", "{w}/summary.json"]
CASES: list[tuple[str, list[str], int, list[str]]] = [
    # -- 1. tracebacks for user errors
    ("ls-damaged-index", ["ls", "--db", "sqlite:///{w}/damaged.db"], 8,
     ["damaged.db", "not a usable SQLite index", "registry index rebuild"]),
    ("query-damaged-index", ["query", "tiny", "--passing", "--db", "sqlite:///{w}/damaged.db"],
     8, ["damaged.db"]),
    ("db-upgrade-damaged", ["db", "upgrade", "--db", "sqlite:///{w}/damaged.db"], 8,
     ["damaged.db"]),
    ("db-upgrade-unreachable", ["db", "upgrade", "--db", PG_DOWN], 8, ["cannot reach"]),
    ("ls-unreachable", ["ls", "--db", PG_DOWN], 8, ["cannot reach"]),
    ("rebuild-unreachable", ["index", "rebuild", "--db", PG_DOWN], 8, ["cannot reach"]),
    ("index-is-a-directory", ["ls", "--db", "sqlite:///{w}/artifacts"], 8, ["artifacts"]),
    ("release-negative-step", [*REL, "--version", "9", "--step", "-5", "--ledger",
                               "{w}/ledger.json"], 2, ["--step"]),
    ("ckpt-verify-negative-step", ["ckpt", "verify", "r1", "--step", "-1"], 2, ["--step"]),
    ("pull-zero-workers", ["pull", "tiny@1", "--workers", "0"], 2, ["--workers"]),
    ("publish-zero-group-size", ["publish", "{w}/hf", *PUB, "--version", "9",
                                 "--group-size", "0", "--dtype", "int4"], 2, ["--group-size"]),
    ("pull-range-negative", ["pull", "tiny@1", "--range-threshold-mib", "-1"], 2,
     ["--range-threshold-mib"]),
    ("pull-to-under-a-file", ["pull", "tiny@1", "--to", "{w}/afile/model"], 6, ["afile"]),
    ("pull-cache-is-a-file", ["pull", "tiny@1", "--cache", "{w}/afile"], 6, ["afile"]),
    ("pull-to-is-a-file", ["pull", "tiny@1", "--to", "{w}/afile"], 4, ["afile", "--force"]),
    # -- 2. nothing found is exit 3 naming it
    ("ckpt-ls-unknown-run", ["ckpt", "ls", "nosuchrun"], 3, ["nosuchrun", "no such run"]),
    ("ckpt-latest-unknown-run", ["ckpt", "latest", "nosuchrun"], 3, ["nosuchrun"]),
    ("ckpt-verify-unknown-run", ["ckpt", "verify", "nosuchrun"], 3, ["nosuchrun"]),
    ("ckpt-gc-unknown-run", ["ckpt", "gc", "nosuchrun", "--keep", "1"], 3, ["nosuchrun"]),
    ("ckpt-ls-unknown-tree", ["ckpt", "ls", "{w}/no-such-tree"], 3, ["no-such-tree"]),
    ("ckpt-adopt-unknown-tree", ["ckpt", "adopt", "{w}/no-such-tree"], 3, ["no-such-tree"]),
    ("ckpt-rollout-unknown-path", ["ckpt", "rollout", "{w}/no-such-rollout"], 3,
     ["no-such-rollout", "no such rollout_data_path"]),
    ("ckpt-refs-two-refs", ["ckpt", "refs", "--ref-dist-ckpt-path", "{w}/t/train_step_1/dist_ckpt",
                            "--ref-hf-model-path", "{w}/hf"], 2, ["pick exactly one"]),
    ("ckpt-verify-unknown-step", ["ckpt", "verify", "r1", "--step", "7"], 3,
     ["step-000007", "no such step"]),
    ("ckpt-gc-keep-0", ["ckpt", "gc", "r1", "--keep", "0"], 2, ["--keep"]),
    ("ckpt-gc-keep-negative", ["ckpt", "gc", "r1", "--keep", "-1"], 2, ["--keep"]),
    ("query-unknown-model", ["query", "tiny-lmm", "--passing"], 3,
     ["tiny-lmm", "no such model", "tiny"]),
    ("ls-unknown-model", ["ls", "tiny-lmm"], 3, ["tiny-lmm", "no such model"]),
    ("show-unknown-version", ["show", "tiny@9"], 3, ["'9'"]),
    ("show-unknown-model", ["show", "nosuch@1"], 3, ["nosuch"]),
    ("diff-unknown-version", ["diff", "tiny@1", "tiny@9"], 3, ["'9'"]),
    ("pull-unknown", ["pull", "nosuch@1"], 3, ["nosuch"]),
    ("gate-check-unknown", ["gate", "check", "tiny@9"], 3, ["'9'"]),
    ("alias-ls-unknown-model", ["alias", "ls", "nosuch"], 3, ["no model named 'nosuch'"]),
    ("alias-set-unknown-version", ["alias", "set", "tiny", "x", "9"], 3,
     ["model 'tiny' has no version '9' (versions: 1, 2)"]),
    ("alias-rm-unknown-alias", ["alias", "rm", "tiny", "nosuch"], 3, ["no alias 'nosuch'"]),
    ("events-ls-bad-since", ["events", "ls", "--since", "soon"], 2, ["--since 'soon'"]),
    ("events-tail-bad-since", ["events", "tail", "--since", "x"], 2, ["--since 'x'"]),
    ("events-deliver-bad-url", ["events", "deliver", "--webhook", "ftp://h/x", "--secret-file",
                                "{w}/nosecret"], 2, ["http://"]),
    ("events-repair-no-store", ["events", "repair", "--store", "{w}/nostore"], 6,
     ["nostore", "does not exist"]),
    ("alias-log-bad-time", ["alias", "log", "tiny", "prod", "--at", "noon"], 2,
     ["--at 'noon'", "2026-12-01"]),
    ("policy-show-unknown-model", ["policy", "show", "nosuch"], 3, ["nosuch"]),
    ("policy-set-unknown-model", ["policy", "set", "nosuch", "--require", "a>=1"], 3,
     ["nosuch"]),
    ("verify-unknown-dir", ["verify", "{w}/no-such-dir"], 3, ["no-such-dir", "no such"]),
    ("publish-unknown-dir", ["publish", "{w}/no-such-dir", *PUB, "--version", "9"], 3,
     ["no-such-dir", "no such model directory"]),
    ("release-unknown-run", [*REL, "--version", "9", "--step", "10", "--ledger",
                             "{w}/ledger.json", "--run", "nosuchrun"], 3, ["nosuchrun"]),
    ("gc-unknown-tree", ["gc", "--checkpoint-path", "no-such-tree"], 3, ["no-such-tree"]),
    # -- 3. bad input documents are exit 5 naming the file, before any gate
    ("publish-ledger-not-json", [*PUB9, "--ledger", "{w}/notjson.json"], 5,
     ["notjson.json", "not valid JSON"]),
    ("publish-ledger-schema", [*PUB9, "--ledger", "{w}/badledger.json"], 5,
     ["badledger.json", "required property"]),
    ("publish-evals-schema", [*PUB9, "--evals", "{w}/badsummary.json"], 5, ["badsummary.json"]),
    ("publish-ledger-missing", [*PUB9, "--ledger", "{w}/missing.json"], 5,
     ["missing.json", "cannot read"]),
    ("publish-ledger-directory", [*PUB9, "--ledger", "{w}/hf"], 5, ["hf", "cannot read"]),
    ("publish-evals-empty", [*PUB9, "--evals", "{w}/empty.json"], 5, ["empty.json"]),
    ("publish-head-schema", [*PUB9, "--head", "{w}/badledger.json"], 5, ["badledger.json"]),
    ("publish-card-missing", [*PUB9, "--card", "{w}/missing.md"], 5, ["missing.md"]),
    ("publish-empty-dir", ["publish", "{w}/emptydir", *PUB, "--version", "9"], 5,
     ["emptydir", "not a model directory"]),
    ("release-ledger-schema", [*REL, "--version", "9", "--step", "10", "--ledger",
                               "{w}/badledger.json"], 5, ["badledger.json"]),
    ("release-evals-not-json", [*REL, "--version", "9", "--step", "10", "--ledger",
                                "{w}/ledger.json", "--evals", "{w}/notjson.json"], 5,
     ["notjson.json"]),
    # -- 4. a write the index missed: committed, exit 10, the command that fixes it
    ("publish-not-indexed", ["publish", "{w}/hf", *PUB, "--version", "10", "--db", BAD_DB],
     EXIT_NOT_INDEXED, ["pub/10 is committed in the store", "registry index rebuild --db"]),
    ("alias-not-indexed", ["alias", "set", "tiny", "stable", "1", "--db", BAD_DB],
     EXIT_NOT_INDEXED, ["alias tiny@stable is committed", "registry index rebuild"]),
    ("revoke-not-indexed", ["ledger", "revoke", "news", "--reason", "r", "--db", BAD_DB],
     EXIT_NOT_INDEXED, ["revocation of news is committed", "registry index rebuild"]),
    ("policy-not-indexed", ["policy", "set", "tiny", "--db", BAD_DB],
     EXIT_NOT_INDEXED, ["policy of tiny is committed", "registry index rebuild"]),
    ("release-not-indexed", [*REL, "--version", "10", "--step", "10", "--ledger",
                             "{w}/ledger.json", "--db", BAD_DB], EXIT_NOT_INDEXED,
     ["rel/10 is committed in the store"]),
    # -- 5. memory:// is refused on the command line
    ("publish-memory", [*PUB9, "--store", "memory://x"], 2, ["memory://x", "one process"]),
    ("ls-memory", ["ls", "--store", "memory://x"], 2, ["memory://"]),
    ("ckpt-ls-memory", ["ckpt", "ls", "memory://x/tree"], 2, ["memory://"]),
    ("verify-memory", ["verify", "memory://x/dir"], 2, ["memory://"]),
    ("pull-memory", ["pull", "tiny@1", "--store", "memory://x"], 2, ["memory://"]),
    ("ledger-ls-memory", ["ledger", "ls", "--store", "memory://x"], 2, ["memory://"]),
    ("quickstart-memory", ["quickstart", "--store", "memory://x"], 2, ["memory://"]),
    # -- 6. failing gates
    ("pull-require-passing", ["pull", "tiny@prod", "--require-passing", "--to", "{w}/p"], 1,
     ["tiny@2", "books", "--require-passing"]),
    ("gate-check-failing", ["gate", "check", "tiny@prod"], 1, ["tiny@2", "books"]),
    ("alias-set-failing", ["alias", "set", "tiny", "beta", "2"], 1, ["fails the release gates"]),
    ("publish-failing-gate", [*PUB9, "--require", "accuracy>=0.99"], 1, ["not released"]),
    # -- bad names and arguments (2), conflicts (4), checks that say no (1)
    ("show-bad-ref", ["show", "../x@1"], 2, ["model_id"]),
    ("pull-bare-unknown-model", ["pull", "nosuch"], 3, ["nosuch", "no alias 'main'"]),
    ("load-unknown-version", ["load", "tiny@9", "--check"], 3, ["'9'"]),
    ("push-not-oci", ["push", "tiny@1", "notoci://x"], 2, ["notoci://x", "oci://"]),
    ("import-not-oci", ["import", "notoci://x", "--model-id", "m", "--version", "1"], 2,
     ["notoci://x", "oci://"]),
    ("gate-check-no-version", ["gate", "check", "tiny"], 2, ["MODEL_ID@VERSION"]),
    ("diff-different-models", ["diff", "tiny@1", "pub@1"], 2, ["different models"]),
    ("query-nothing-asked", ["query"], 2, ["--passing"]),
    ("query-bad-threshold", ["query", "tiny", "--passing", "--require", "acc>0.8"], 2,
     ["acc>0.8"]),
    ("policy-bad-threshold", ["policy", "set", "tiny", "--require", "acc=1"], 2, ["acc=1"]),
    ("policy-sign-key-unreadable", ["policy", "set", "tiny", "--require", "acc>=0",
                                    "--sign-key", "{w}/no-such-key.pem"], 5,
     ["no-such-key.pem", "cannot read the signing key"]),
    ("serve-open-host", ["serve", "--host", "0.0.0.0"], 2, ["--token-file"]),
    ("publish-bad-model-id", ["publish", "{w}/hf", *PUB[2:], "--model-id", "../x",
                              "--version", "9"], 2, ["model_id"]),
    ("publish-bad-dtype", [*PUB9, "--dtype", "f8"], 2, ["f8"]),
    ("release-bad-layout", [*REL, "--version", "9", "--step", "10", "--ledger",
                            "{w}/ledger.json", "--layout", "nope"], 2, ["nope"]),
    ("release-bad-card-field", [*REL, "--version", "9", "--step", "10", "--ledger",
                                "{w}/ledger.json", "--card-field", "novalue"], 2, ["novalue"]),
    ("ckpt-bad-run-name", ["ckpt", "ls", "bad run"], 2, ["bad run"]),
    ("ckpt-bad-layout", ["ckpt", "ls", "r1", "--layout", "nope"], 2, ["nope"]),
    ("revoke-empty-reason", ["ledger", "revoke", "wiki", "--reason", " "], 2, ["reason"]),
    # the life of a release (issue 32 items 1-3)
    ("yank-unknown-version", ["yank", "tiny@9", "--reason", "r"], 3, ["'9'"]),
    ("yank-empty-reason", ["yank", "tiny@1", "--reason", " "], 2, ["reason"]),
    ("unyank-unknown-version", ["unyank", "tiny@9"], 3, ["'9'"]),
    ("release-delete-aliased", ["release", "delete", "tiny@prod", "--reason", "r"], 4,
     ["alias prod", "move it first"]),
    ("release-gc-no-policy", ["release", "gc"], 2, ["--keep-last", "--unaliased"]),
    ("tag-set-no-equals", ["tag", "set", "tiny@1", "team"], 2, ["KEY=VALUE"]),
    ("tag-rm-absent-key", ["tag", "rm", "tiny@1", "team"], 2, ["no tag team"]),
    ("tag-ls-unknown-version", ["tag", "ls", "tiny@9"], 3, ["'9'"]),
    ("revoke-bad-source", ["ledger", "revoke", "../x", "--reason", "r"], 2, ["source_id"]),
    ("gc-bad-duration", ["gc", "--older-than", "soon"], 2, ["soon"]),
    ("store-bad-protocol", ["ls", "--store", "ftp://x/y"], 2, ["ftp"]),
    ("unknown-option", ["ls", "--bogus"], 2, ["--bogus"]),
    ("missing-argument", ["show"], 2, ["REF"]),
    ("publish-existing-version", ["publish", "{w}/hf", *PUB, "--version", "1"], 4,
     ["version exists"]),
    ("release-existing-version", [*REL[:4], "--model-id", "tiny", "--evals",
                                  "{w}/summary.json", "--version", "1", "--step", "10",
                                  "--ledger", "{w}/ledger.json"], 4, ["version exists"]),
    ("verify-uncommitted", ["verify", "{w}/uncommitted"], 1, ["uncommitted", "MANIFEST.json"]),
    ("ckpt-verify-damaged", ["ckpt", "verify", "r2"], 1, ["step-000010"]),
    ("ckpt-latest-damaged", ["ckpt", "latest", "r2"], 1, ["step-000010"]),
    # -- signing keys (issue 17)
    ("keys-generate-over-a-file", ["keys", "generate", "{w}/ledger.json"], 2,
     ["ledger.json", "refusing to overwrite"]),
    ("keys-generate-bad-curve", ["keys", "generate", "{w}/k.pem", "--curve", "p999"], 2,
     ["--curve", "p999"]),
    ("keys-fingerprint-missing", ["keys", "fingerprint", "{w}/nokey.pub"], 5, ["nokey.pub"]),
    ("keys-fingerprint-not-pem", ["keys", "fingerprint", "{w}/ledger.json"], 5,
     ["ledger.json", "PEM"]),
    ("keys-revoke-not-pem", ["keys", "revoke", "{w}/ledger.json", "--reason", "r",
                             "--trusted-keys", "{w}"], 5, ["ledger.json"]),
    ("pull-trusted-key-missing", ["pull", "tiny@1", "--trusted-key", "{w}/nokey.pub",
                                  "--to", "{w}/p2"], 5, ["nokey.pub"]),
    # -- the pull cache (issue 19)
    ("cache-ls-cache-is-a-file", ["cache", "ls", "--cache", "{w}/afile"], 6, ["afile"]),
    ("cache-verify-cache-is-a-file", ["cache", "verify", "--cache", "{w}/afile"], 6, ["afile"]),
    ("cache-verify-zero-workers", ["cache", "verify", "--workers", "0"], 2, ["--workers"]),
    ("cache-prune-bad-size", ["cache", "prune", "--max-size", "50Q"], 2, ["50Q"]),
    ("cache-prune-bad-duration", ["cache", "prune", "--older-than", "soon"], 2, ["soon"]),
    ("cache-prune-negative-keep", ["cache", "prune", "--keep-last", "-1"], 2, ["--keep-last"]),
    # NaN compares false with every bound: it once selected the whole cache.
    ("cache-prune-nan-age", ["cache", "prune", "--older-than", "nan"], 2, ["'nan'", "finite"]),
    ("cache-prune-inf-age", ["cache", "prune", "--older-than", "infd"], 2, ["'infd'", "finite"]),
    ("cache-prune-nan-size", ["cache", "prune", "--max-size", "nanG"], 2, ["'nanG'", "finite"]),
    ("cache-prune-inf-size", ["cache", "prune", "--max-size", "1e400"], 2, ["'1e400'"]),
    ("gc-nan-age", ["gc", "--older-than", "nan"], 2, ["'nan'", "finite"]),
    ("cache-ls-empty-path", ["cache", "ls", "--cache", ""], 2, ["non-empty path"]),
    ("keys-ca-days-too-many", ["keys", "ca", "{w}/big.pem", "--subject", "CN=x",
                               "--days", "3000000"], 2, ["--days 3000000"]),
    ("keys-ca-empty-path", ["keys", "ca", "", "--subject", "CN=x"], 2, ["must name a file"]),
    ("keys-ca-crt-key-path", ["keys", "ca", "{w}/same.crt", "--subject", "CN=x"], 2,
     ["same.crt", "give --cert"]),
    # -- certificates from a local CA (issue 17)
    ("keys-ca-over-a-file", ["keys", "ca", "{w}/ledger.json", "--subject", "CN=x"], 2,
     ["ledger.json", "refusing to overwrite"]),
    ("keys-issue-ca-missing", ["keys", "issue", "{w}/k2.pem", "--ca", "{w}/noca.pem",
                               "--subject", "CN=x"], 5, ["noca.pem"]),
    ("pull-trusted-ca-not-pem", ["pull", "tiny@1", "--trusted-ca", "{w}/ledger.json",
                                 "--to", "{w}/p3"], 5, ["ledger.json", "PEM"]),
    ("publish-sign-cert-without-key", ["publish", "{w}/hf", *PUB, "--version", "7",
                                       "--sign-cert", "{w}/ledger.json"], 2, ["--sign-key"]),
    # -- the config file and its profiles (issue 44)
    ("config-set-unknown-key", ["config", "set", "colour", "red"], 2, ["'colour'", "unknown"]),
    ("config-set-inline-secret", ["config", "set", "token", "s3cr3t"], 2,
     ["'token'", "token_file = PATH"]),
    ("config-set-bad-profile", ["config", "set", "store", "{w}/s", "--profile", "a b"], 2,
     ["profile 'a b'"]),
    ("config-show-unknown-profile", ["config", "show", "--profile", "nope"], 2,
     ["no profile 'nope'"]),
    ("profile-unknown", ["--profile", "nope", "ls"], 2, ["no profile 'nope'", "config.toml"]),
    # issue 50: signed snapshots and timestamps
    ("snapshot-sign-key-missing", ["snapshot", "sign", "tiny", "--sign-key", "{w}/nokey.pem"],
     5, ["nokey.pem"]),
    ("snapshot-sign-bad-expiry", ["snapshot", "sign", "tiny", "--sign-key", "{w}/nokey.pem",
                                  "--expires-in", "soon"], 2, ["--expires-in"]),
    ("snapshot-refresh-key-missing", ["snapshot", "refresh", "tiny", "--sign-key",
                                      "{w}/nokey.pem"], 5, ["nokey.pem"]),
    ("snapshot-refresh-no-key", ["snapshot", "refresh"], 2, ["--sign-key"]),
    ("publish-release-failing-source", ["publish", "{w}/artifacts/models/tiny/2", *PUB,
                                       "--version", "8"], 1, ["tiny@2", "revoked"]),
]

#: Cases that may leave stdout: a check that said no prints its report there; a
#: write the index missed prints what it committed.
REPORTS_ON_STDOUT = {"verify-uncommitted", "ckpt-verify-damaged", "ckpt-latest-damaged",
                     "gate-check-failing", "publish-not-indexed", "alias-not-indexed",
                     "revoke-not-indexed", "policy-not-indexed", "release-not-indexed",
                     "publish-failing-gate", "publish-release-failing-source"}



def _world(w: Path) -> None:
    """Checkpoints, releases (one failing since a revocation), an alias on the
    failing one, input documents good and bad, and a damaged index, in ``w``."""
    store_url = str(w / "artifacts")
    db = f"sqlite:///{w / 'registry.db'}"
    reg = Registry(store_url, db=db)
    with reg.checkpoint_manager("r1", keep_ckpts=0) as m:
        save(m, 10)
    with reg.checkpoint_manager("r2", keep_ckpts=0) as m:
        save(m, 10)
    damaged = w / "artifacts/runs/r2/ckpt/step-000010/model.safetensors"
    damaged.write_bytes(damaged.read_bytes()[:-4])  # a truncated copy
    reg.create_release("r1", 10, "tiny", "1", ledger=[ledger_row("wiki")],
                       eval_summary=summary())
    reg.create_release("r1", 10, "tiny", "2", ledger=[ledger_row("books")],
                       eval_summary=summary())
    reg.set_alias("tiny", "prod", "2")
    reg.revoke("books", "withdrawn")
    (w / "hf").mkdir()
    for name in ("model.safetensors", "config.json"):
        shutil.copy(w / "artifacts/models/tiny/1" / name, w / "hf" / name)
    reg.publish(w / "hf", "pub", "1", ledger=[ledger_row("wiki")], eval_summary=summary())
    reg.close()
    (w / "ledger.json").write_text(json.dumps([ledger_row("wiki")]))
    (w / "summary.json").write_text(json.dumps(summary()))
    (w / "notjson.json").write_text("nope")
    (w / "badledger.json").write_text(json.dumps([{"source_id": "x"}]))
    (w / "badsummary.json").write_text(json.dumps({"suite": "s"}))
    (w / "empty.json").write_text("")
    (w / "head.json").write_text(json.dumps(head(input_dim=8)))
    (w / "afile").write_text("a file, not a folder\n")
    (w / "emptydir").mkdir()
    (w / "uncommitted").mkdir()
    (w / "uncommitted" / "x.bin").write_bytes(b"x")
    (w / "damaged.db").write_bytes(os.urandom(4096))


def _run(w: Path, cases: list[list[str]]) -> list[tuple[int, str, str]]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    env.pop("REGISTRY_STORE", None)
    env.pop("REGISTRY_DB", None)
    env.pop("REGISTRY_DEBUG", None)
    env["REGISTRY_CONFIG"] = str(w / "config" / "config.toml")
    # a module-scoped caller runs before the per-test REGISTRY_CACHE is set:
    # never let a pull fill the user's ~/.cache/model-registry
    env.setdefault("REGISTRY_CACHE", str(w.parent / f"{w.name}-pull-cache"))
    return [(r.returncode, r.stdout, r.stderr) for r in run_cli_batch(cases, env=env, cwd=w)]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every case run as text, then every case again with --json, in a fresh world each."""
    out: dict[str, Any] = {}
    for mode in ("text", "json"):
        w = tmp_path_factory.mktemp(f"world-{mode}")
        _world(w)
        argvs = [[a.replace("{w}", str(w)) for a in argv] + (["--json"] if mode == "json"
                                                              else [])
                 for _, argv, _, _ in CASES]
        for (case_id, _, _, _), r in zip(CASES, _run(w, argvs), strict=True):
            out[f"{mode}:{case_id}"] = r
        out[f"{mode}:world"] = w
    return out


def test_the_table_covers_every_command_and_exit_code() -> None:
    import typer

    from registry.cli import app
    from registry.cli.reference import _walk
    commands = {" ".join(p[1:]) for p, c in _walk(typer.main.get_command(app), ["registry"])[1:]
                if not hasattr(c, "list_commands")}
    covered = set()
    for _, argv, _, _ in CASES:
        covered.add(" ".join(argv[:2]) if " ".join(argv[:2]) in commands else argv[0])
    assert commands - covered == set()
    # 7 (a checkpoint that cannot be saved or resumed) comes from training jobs and
    # 9 (index schema behind) from test_index, 11 (an event not recorded after its
    # write committed) from test_events: no command input here causes them
    assert {code for _, _, code, _ in CASES} == set(EXIT_CODES.values()) - {7, 9, 11} | {
        EXIT_NOT_INDEXED}


@pytest.mark.parametrize(("case_id", "argv", "code", "needles"), CASES,
                         ids=[c[0] for c in CASES])
def test_bad_input_text(results: dict[str, Any], case_id: str, argv: list[str], code: int,
                        needles: list[str]) -> None:
    got, out, err = results[f"text:{case_id}"]
    assert "Traceback" not in err + out, err
    assert got == code, (got, out, err)
    assert err.strip(), "a failure must say what happened"
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    if argv[0] not in ("--help",) and "Usage:" not in err:
        assert len(lines) == 1, err
    for n in needles:
        assert n in err, (n, err)
    if case_id not in REPORTS_ON_STDOUT:
        assert out == "", out


VALIDATOR = Draft202012Validator(schemas.load_schema("cli-error"))


@pytest.mark.parametrize(("case_id", "code"), [(c[0], c[2]) for c in CASES],
                         ids=[c[0] for c in CASES])
def test_bad_input_json(results: dict[str, Any], case_id: str, code: int) -> None:
    got, out, err = results[f"json:{case_id}"]
    assert "Traceback" not in err + out, err
    assert got == code, (got, out, err)
    doc = json.loads(err)  # exactly one document on stderr, nothing else
    assert list(VALIDATOR.iter_errors(doc)) == []
    assert doc["error"]["exit_code"] == code
    if case_id in REPORTS_ON_STDOUT:
        assert out == "" or isinstance(json.loads(out), dict | list)
    else:
        assert out == "", out


def test_nothing_was_committed_by_refused_commands(results: dict[str, Any]) -> None:
    """Only the exit-10 writes reached the store: refusals wrote nothing."""
    for mode in ("text", "json"):
        w = results[f"{mode}:world"]
        models = sorted(p.name for p in (w / "artifacts/models").iterdir())
        assert models == ["pub", "rel", "tiny"]
        # (".sequence": the release counter the two commits moved, registry.protocol.sequence)
        assert sorted(p.name for p in (w / "artifacts/models/pub").iterdir()) == [
            ".sequence", "1", "10"]
        assert sorted(p.name for p in (w / "artifacts/models/rel").iterdir()) == [
            ".sequence", "10"]
        assert json.loads((w / "artifacts/models/tiny/refs/stable").read_text())["new"] == "1"
        assert not (w / "artifacts/models/tiny/refs/beta").exists()
        assert not (w / "p").exists()
        assert (w / "damaged.db").exists()  # only `index rebuild` moves it aside


#: Commands that succeed, run with --json: exactly one JSON document on stdout,
#: nothing on stderr. (quickstart and ckpt adopt have their own tests.)
SUCCESS: list[list[str]] = [
    ["query", "tiny", "--passing"], ["query", "--source", "wiki"], ["show", "tiny@1"],
    ["ls"], ["ls", "tiny"], ["diff", "tiny@1", "tiny@2"],
    ["pull", "tiny@1", "--to", "{w}/ok"], ["pull", "tiny@prod", "--to", "{w}/ok2"],
    ["publish", "{w}/hf", *PUB, "--version", "2"], ["gc"],
    ["verify", "{w}/artifacts/models/tiny/1"], ["ckpt", "ls", "r1"], ["ckpt", "latest", "r1"],
    ["ckpt", "verify", "r1"], ["ckpt", "gc", "r1", "--keep", "1"], ["db", "upgrade"],
    ["index", "rebuild"], ["ledger", "revoke", "news", "--reason", "r"], ["ledger", "ls"],
    [*REL, "--version", "1", "--step", "10", "--ledger", "{w}/ledger.json"],
    ["gate", "check", "tiny@1"], ["alias", "set", "tiny", "stable", "1"], ["alias", "ls", "tiny"],
    ["policy", "set", "tiny", "--require", "accuracy>=0.5"], ["policy", "show", "tiny"],
    ["pull", "tiny@1", "--to", "{w}/ok3", "--cache", "{w}/cache"],
    ["cache", "ls", "--cache", "{w}/cache"], ["cache", "verify", "--cache", "{w}/cache"],
    ["cache", "prune", "--keep-last", "0", "--cache", "{w}/cache"],
    ["config", "set", "store", "{w}/artifacts"], ["config", "show"],
]

#: Empty answers, in text mode: exit 0 and a sentence on stderr, stdout clean.
EMPTY: list[tuple[list[str], str]] = [
    (["query", "tiny", "--passing", "--require", "accuracy>=0.99"],
     "no version of tiny passes its gates with accuracy>=0.99 now"),
    (["query", "--source", "nosrc"], "no release in the index was trained on source nosrc"),
    (["ckpt", "gc", "r1", "--keep", "5"], "nothing to delete in"),
    (["gc"], "nothing to remove in"),
    (["alias", "ls", "pub"], "pub has no aliases"),
    (["ledger", "ls", "--store", "{w}/empty-store"], "no data source is revoked"),
    (["ls", "--db", "sqlite:///{w}/new.db"], "no model in the index"),
    (["cache", "ls", "--cache", "{w}/no-cache"], "no release in the cache"),
    (["cache", "prune", "--cache", "{w}/no-cache"], "nothing to prune in"),
]


def test_every_command_prints_one_json_document_on_success(tmp_path: Path) -> None:
    _world(tmp_path)
    runs = _run(tmp_path, [[a.replace("{w}", str(tmp_path)) for a in argv] + ["--json"]
                           for argv in SUCCESS])
    for argv, (code, out, err) in zip(SUCCESS, runs, strict=True):
        assert code == 0 and err == "", (argv, code, err)
        assert isinstance(json.loads(out), dict | list), (argv, out)
    docs = {argv[0] + (" " + argv[1] if argv[0] in ("pull",) else ""): json.loads(out)
            for argv, (_, out, _) in zip(SUCCESS, runs, strict=True)}
    # pull says whether the release passes its gates now (tiny@prod is 2: books revoked)
    assert docs["pull tiny@1"]["passing"] is True
    assert docs["pull tiny@prod"]["passing"] is False
    assert docs["pull tiny@prod"]["failing_gates"][0]["gate"] == "ledger"
    # ledger revoke lists the aliases now pointing at failing versions
    # (each revocation records who revoked it, registry.host.actor; docs/lifecycle.md)
    assert all(r.pop("actor")["user"] for r in docs["ledger"])
    assert docs["ledger"] == [{"source_id": "books", "revoked_at": docs["ledger"][0]["revoked_at"],
                               "revocation_reason": "withdrawn"},
                              {"source_id": "news", "revoked_at": docs["ledger"][1]["revoked_at"],
                               "revocation_reason": "r"}]
    revoke = json.loads(runs[SUCCESS.index(["ledger", "revoke", "news", "--reason", "r"])][1])
    assert revoke["failing_aliases"] == [{"model_id": "tiny", "alias": "prod", "version": "2",
                                          "reason": revoke["failing_aliases"][0]["reason"]}]
    # the cache commands' documents follow their schemas (schemas/cache-*.schema.json)
    cache_docs = {argv[1]: json.loads(out) for argv, (_, out, _) in zip(SUCCESS, runs, strict=True)
                  if argv[0] == "cache"}
    for name, doc in cache_docs.items():
        schema = schemas.load_schema(f"cache-{name}")
        assert list(Draft202012Validator(schema).iter_errors(doc)) == []
    assert [v["version"] for v in cache_docs["ls"]["versions"]] == ["1"]
    assert [p["version"] for p in cache_docs["prune"]["pruned"]] == ["1"]
    assert "books" in revoke["failing_aliases"][0]["reason"]


def test_empty_answers_are_said_in_words(tmp_path: Path) -> None:
    _world(tmp_path)
    # an existing, empty store (a store folder that does not exist is exit 6)
    (tmp_path / "empty-store").mkdir()
    runs = _run(tmp_path, [[a.replace("{w}", str(tmp_path)) for a in argv] for argv, _ in EMPTY])
    for (argv, words), (code, out, err) in zip(EMPTY, runs, strict=True):
        assert code == 0, (argv, err)
        assert words in err, (argv, err)
        assert "Traceback" not in err
        if argv[0] in ("query", "ls", "alias", "ledger", "cache"):
            assert out == "", (argv, out)


def test_pull_warns_and_revoke_lists_failing_aliases_in_text(tmp_path: Path) -> None:
    _world(tmp_path)
    (code_pull, out_pull, err_pull), (code_rev, _, err_rev) = _run(tmp_path, [
        ["pull", "tiny@prod", "--to", str(tmp_path / "served"), "--quiet"],
        ["ledger", "revoke", "wiki", "--reason", "takedown"]])
    assert code_pull == 0 and out_pull.strip() == str(tmp_path / "served")
    assert err_pull.startswith("warning: tiny@2 fails its gates now (ledger: source books is "
                               "revoked"), err_pull
    assert (tmp_path / "served/model.safetensors").is_file()
    assert code_rev == 0
    # prod -> 2 (books) was failing already; nothing points at 1 (wiki) but pub@1 has no alias
    assert err_rev.splitlines() == [
        "warning: alias tiny@prod -> 2 fails its gates now (ledger: source books is revoked in "
        "the live ledger (withdrawn)); move it with `registry alias set`"]


def test_index_rebuild_moves_a_damaged_index_aside(tmp_path: Path) -> None:
    _world(tmp_path)
    junk = os.urandom(4096)
    (tmp_path / "registry.db").write_bytes(junk)
    (code_ls, _, err_ls), (code, out, err), (code_after, out_after, _) = _run(
        tmp_path, [["ls"], ["index", "rebuild"], ["ls", "tiny"]])
    assert code_ls == 8 and "registry.db: not a usable SQLite index" in err_ls
    assert code == 0, err
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("registry.db.damaged-")]
    assert len(aside) == 1 and aside[0].read_bytes() == junk
    assert out.splitlines()[0] == f"moved the damaged index aside to {aside[0]}"
    assert "3 releases" in out
    assert code_after == 0 and out_after.count("\n") == 2  # tiny 1 and 2, rebuilt


def _immutable(path: Path) -> bool:
    """chattr +i on ``path`` (refuses writes even to root); False where unsupported."""
    if shutil.which("chattr") is None:
        return False
    return subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0


def test_pull_into_an_immutable_directory_is_one_line_exit_6(tmp_path: Path) -> None:
    _world(tmp_path)
    locked = tmp_path / "locked"
    locked.mkdir()
    if not _immutable(locked):
        pytest.skip("chattr +i is not supported on this filesystem")
    try:
        (c1, _, e1), (c2, _, e2) = _run(tmp_path, [
            ["pull", "tiny@1", "--to", str(locked / "model")],
            ["pull", "tiny@1", "--to", str(locked), "--force"]])
    finally:
        subprocess.run(["chattr", "-i", str(locked)], check=True)
    for code, err in ((c1, e1), (c2, e2)):
        assert code == 6 and "Traceback" not in err, err
        assert err.count("\n") == 1 and str(locked) in err and "Operation not permitted" in err
    assert list(locked.iterdir()) == []


@pytest.mark.parametrize("link", ["up/model", "self", "deep/er/root"])
def test_symlink_loop_is_named_once(tmp_path: Path, link: str) -> None:
    """A symlinked folder leading back to the model directory (or one holding it)
    is refused in one short line naming the link, not ``up/model/up/model/...``."""
    from registry.protocol.manifest import list_local_files

    _world(tmp_path)
    model = tmp_path / "looped"
    shutil.copytree(tmp_path / "hf", model)
    (model / link).parent.mkdir(parents=True, exist_ok=True)
    target = {"up/model": "..", "self": ".", "deep/er/root": str(tmp_path)}[link]
    os.symlink(target, model / link)
    from registry.errors import UsageError
    with pytest.raises(UsageError, match="symlink loop") as e:
        list_local_files(model)
    assert str(e.value).count(f"{link}:") == 1 and f"{link}/" not in str(e.value)
    ((code, out, err),) = _run(tmp_path, [["publish", str(model), "--model-id", "loop",
                                           "--version", "1", "--ledger",
                                           str(tmp_path / "ledger.json"), "--evals",
                                           str(tmp_path / "summary.json")]])
    assert code == 2 and out == "" and "Traceback" not in err
    assert err == f"error: {model / link}: a symlink loop: it points back to " \
                  f"{os.path.realpath(model / link)}, which holds it; a model directory " \
                  "cannot contain itself\n"
    assert not (tmp_path / "artifacts/models/loop").exists()


def test_second_quickstart_is_refused_up_front(tmp_path: Path) -> None:
    """An earlier quickstart's run or models in the store, or files in the workdir:
    refused before anything runs (exit 4, one line naming them and the fix)."""
    (tmp_path / "artifacts/models/tiny-lm/1.0").mkdir(parents=True)
    (tmp_path / "artifacts/models/tiny-lm/1.0/MANIFEST.json").write_text("{}")
    (tmp_path / "quickstart").mkdir()
    (tmp_path / "quickstart/progress.jsonl").write_text('{"step": 300}\n')
    ((code, out, err),) = _run(tmp_path, [["quickstart"]])
    assert code == 4 and out == "", (out, err)
    assert err.startswith("error: ./artifacts/models/tiny-lm, ") and err.count("\n") == 1
    assert str(tmp_path / "quickstart") in err and "--workdir" in err
    assert not (tmp_path / "artifacts/runs").exists()  # no trainer ran
    assert (tmp_path / "quickstart/progress.jsonl").read_text() == '{"step": 300}\n'


def test_memory_stores_are_refused_by_the_cli_only() -> None:
    """The CLI refuses memory:// (the next process could not find what it wrote);
    the API keeps it, in the same process, after a CLI call too."""
    from tests.support.clirunner import CliRunner

    from registry.cli import app
    from registry.store import open_store
    from registry.store.memory import MemoryStore
    r = CliRunner().invoke(app, ["ledger", "ls", "--store", "memory://cli-x"])
    assert r.exit_code == 2 and "one process" in r.output
    s = open_store("memory://api-after-cli")
    assert isinstance(s, MemoryStore)
    s.write_bytes("k", b"v")
    assert open_store("memory://api-after-cli").read_bytes("k") == b"v"


def test_index_rebuild_json_names_the_file_it_moved_aside(tmp_path: Path) -> None:
    _world(tmp_path)
    (tmp_path / "registry.db").write_bytes(os.urandom(4096))
    ((code, out, err),) = _run(tmp_path, [["index", "rebuild", "--json"]])
    assert code == 0 and err == "", err
    doc = json.loads(out)
    assert doc["moved_aside"].startswith(str(tmp_path / "registry.db.damaged-"))
    assert Path(doc["moved_aside"]).is_file() and doc["releases"] == 3
