"""Every command of the CLI, walked from the typer app (never a hand list), given a
usage error -- an unknown option, a bad option value, ``--db``/``--store`` where
they do not apply -- says so in one line on stderr, ``error: registry <command>:
...``, and exits with the error table's code for a usage error (2); with
``--json``, one JSON error document. All cases run in one child process
(``registry.cli.main`` per case, as the console script does)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import typer

import registry.errors as E
from registry.cli import app
from registry.cli.errors import EXIT_CODES
from registry.cli.reference import _walk
from tests.conftest import REPO
from tests.conftest import CLI_BATCH as BATCH
from tests.test_index_readonly import volume  # noqa: F401  (fixture)

USAGE = EXIT_CODES[E.UsageError]


def _commands() -> list[tuple[list[str], Any]]:
    return [(path[1:], cmd) for path, cmd in _walk(typer.main.get_command(app), ["registry"])
            if not hasattr(cmd, "list_commands")]


def _numeric(p: Any) -> bool:
    ann = getattr(getattr(p, "type_descriptor", None), "annotation", None)
    return any(a in (int, float) for a in (ann, *typing.get_args(ann)))


def _cases() -> list[tuple[str, list[str], str]]:
    """(command, argv, a word stderr must hold) for every command."""
    cases = []
    for path, cmd in _commands():
        name = " ".join(path)
        opts = [p for p in cmd.params if p.param_type_name == "option" and not p.is_flag
                and p.name != "help"]
        cases.append((name, [*path, "--no-such-option"],
                      "--no-such-option"))
        numeric = [p for p in opts if _numeric(p)]
        if numeric:
            opt = numeric[0].opts[0]
            cases.append((name, [*path, opt, "abc"], opt))
        if opts:  # a value-taking option given last, without its value
            opt = opts[-1].opts[0]
            cases.append((name, [*path, opt], opt))
        have = {o for p in cmd.params for o in p.opts}
        for opt in ("--db", "--store"):
            if opt not in have:
                cases.append((name, [*path, opt, "x"],
                              f"{opt} does not apply"))
    return cases


def _run(cwd: Path, argvs: list[list[str]], *,
         read_only: Path | None = None) -> list[tuple[int, str, str]]:
    """Run ``argvs`` in one child process in ``cwd`` (``read_only`` mounted
    read-only over itself in a private mount namespace, when given)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200",
           "REGISTRY_CACHE": str(cwd / "cache")}
    for var in ("REGISTRY_STORE", "REGISTRY_DB", "REGISTRY_DEBUG"):
        env.pop(var, None)
    argv = [sys.executable, "-c", BATCH]
    if read_only is not None:
        vol = shlex.quote(str(read_only))
        argv = ["unshare", "-m", "sh", "-c", f"mount --bind {vol} {vol} && "
                f"mount -o remount,bind,ro {vol} && exec {shlex.join(argv)}"]
    p = subprocess.run(argv, input=json.dumps(argvs), cwd=cwd,
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return [tuple(r) for r in json.loads(p.stdout)]


def test_every_command_reports_usage_errors_in_one_line(tmp_path: Path) -> None:
    cases = _cases()
    assert len(_commands()) > 30 and len(cases) > 100
    argvs = [argv for _, argv, _ in cases] + [
        [*argv[:len(name.split())], "--json", *argv[len(name.split()):]]
        for name, argv, _ in cases]
    results = _run(tmp_path, argvs)
    text, as_json = results[:len(cases)], results[len(cases):]
    for (name, argv, word), (code, out, err), (jcode, jout, jerr) in zip(cases, text, as_json):
        case = " ".join(argv)
        assert code == USAGE, (case, code, err)
        assert err.count("\n") == 1 and err.startswith(f"error: registry {name}: "), (case, err)
        assert word in err and "Traceback" not in err and "╭" not in err, (case, err)
        assert out == "", (case, out)
        assert jcode == USAGE and jout == "", (case, jcode, jout)
        doc = json.loads(jerr)  # one document, on one line
        assert doc["error"]["class"] == "UsageError" and doc["error"]["exit_code"] == USAGE
        assert word in doc["error"]["message"], (case, doc)
    # nothing was written: no store, no index, no cache
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_group_without_a_command_prints_its_help(tmp_path: Path) -> None:
    (code, out, err), = _run(tmp_path, [["ckpt"]])
    assert code == USAGE and "registry ckpt" in out and "gc" in out and err == ""


def test_text_output_has_no_python_reprs_and_counts_agree(tmp_path: Path) -> None:
    """A metric only one release has is ``absent`` in ``diff`` (not ``None``); a
    model with no passing version says ``none``; one source, one result, one
    file read as singulars."""
    from registry.api import Registry
    from tests.ckpt_util import save
    from tests.release_util import ledger_row, summary, summary2

    reg = Registry(str(tmp_path / "artifacts"), db=f"sqlite:///{tmp_path / 'registry.db'}")
    with reg.checkpoint_manager("r1", keep_ckpts=0) as m:
        save(m, 10)
    reg.create_release("r1", 10, "tiny", "1", ledger=[ledger_row("wiki")],
                       eval_summary=summary())
    reg.create_release("r1", 10, "tiny", "2", ledger=[ledger_row("wiki")],
                       eval_summary=summary2(0.9, 1.0))
    reg.create_release("r1", 10, "gone", "1", ledger=[ledger_row("books")],
                       eval_summary=summary())
    reg.revoke("books", "withdrawn")
    reg.close()
    (diff, ls, gate) = _run(tmp_path, [["diff", "tiny@1", "tiny@2"], ["ls"],
                                       ["gate", "check", "tiny@1"]])
    assert diff[0] == 0 and "copy/loss: absent -> 1 (n/a)" in diff[1], diff
    assert ls[0] == 0 and "gone\t1 release\t" in ls[1] and "tiny\t2 releases\t" in ls[1], ls
    assert "newest passing none" in ls[1], ls
    assert gate[0] == 0 and "1 source," in gate[1] and "1 result passed" in gate[1], gate
    for code, out, err in (diff, ls, gate):
        assert "None" not in out + err and "1 sources" not in out and "1 results" not in out


def test_a_read_only_store_is_one_line_naming_the_path_and_the_rule(
        tmp_path: Path, volume: Path) -> None:  # noqa: F811
    """Every write to a store on a read-only mount: exit 6 (storage), one line
    naming the file and "read-only file system", never OSError's repr; nothing
    changes in the store."""
    from registry.api import Registry
    from tests.ckpt_util import save
    from tests.release_util import ledger_row, summary

    store = volume / "artifacts"
    reg = Registry(str(store), db=f"sqlite:///{tmp_path / 'registry.db'}")
    with reg.checkpoint_manager("r1", keep_ckpts=0) as m:
        save(m, 10)
        save(m, 20)
        save(m, 30)  # gc --keep 1 deletes step 20 (10 is released, 30 the pointer's)
    reg.create_release("r1", 10, "tiny", "1", ledger=[ledger_row("wiki")],
                       eval_summary=summary())
    reg.close()
    (tmp_path / "ledger.json").write_text(json.dumps([ledger_row("wiki")]))
    (tmp_path / "summary.json").write_text(json.dumps(summary()))
    before = sorted(p.relative_to(store) for p in store.rglob("*"))
    s = ["--store", str(store)]
    results = _run(tmp_path, [
        ["alias", "set", "tiny", "prod", "1", *s], ["ledger", "revoke", "wiki", "--reason", "x", *s],
        ["policy", "set", "tiny", "--require", "copy/accuracy>=0.1", *s],
        ["ckpt", "gc", "r1", "--keep", "1", *s],
        ["publish", str(store / "models/tiny/1"), "--model-id", "tiny", "--version", "2",
         "--ledger", "ledger.json", "--evals", "summary.json", *s]], read_only=volume)
    for code, out, err in results:
        assert code == 6 and err.count("\n") == 1, (code, out, err)
        assert f"error: {store}/" in err and "read-only file system" in err, err
        assert "OSError" not in err and "Errno" not in err, err
    assert sorted(p.relative_to(store) for p in store.rglob("*")) == before
