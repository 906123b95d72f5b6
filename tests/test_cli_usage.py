"""Every command of the CLI, walked from the typer app (never a hand list), given a
usage error -- an unknown option, a bad option value, ``--db``/``--store`` where
they do not apply -- says so in one line on stderr, ``error: registry <command>:
...``, and exits with the error table's code for a usage error (2); with
``--json``, one JSON error document. All cases run in one child process
(``registry.cli.main`` per case, as the console script does)."""

from __future__ import annotations

import json
import os
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
from tests.test_cli_contract import BATCH

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


def _run(cwd: Path, argvs: list[list[str]]) -> list[tuple[int, str, str]]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200",
           "REGISTRY_CACHE": str(cwd / "cache")}
    for var in ("REGISTRY_STORE", "REGISTRY_DB", "REGISTRY_DEBUG"):
        env.pop(var, None)
    p = subprocess.run([sys.executable, "-c", BATCH], input=json.dumps(argvs), cwd=cwd,
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
