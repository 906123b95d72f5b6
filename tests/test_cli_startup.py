"""Start-up cost of the command line (issue 44 item 6): ``import registry.cli``,
``registry --version`` and ``registry --help`` load none of the heavy modules
(``--help`` not even typer), ``registry ls`` and ``registry show`` on a local
store and SQLite index load only what they read with (no typer, SQLAlchemy nor
numpy), and the root's tables of commands and options
(registry.cli.table) say what the commands themselves say.

Each check runs a fresh interpreter and reads ``sys.modules`` when it exits:
no wall-clock time is asserted (bench/startup_bench.py measures those).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from registry.cli.commands import COMMANDS, first_paragraph
from tests.release_util import one_release_store

ROOT = Path(__file__).resolve().parent.parent

#: top-level packages that cost tens to hundreds of ms each to import, measured
#: with ``python -X importtime`` (bench/results.md, start-up): none is needed to
#: parse a command line, print the version or list the commands
HEAVY = ("fsspec", "s3fs", "aiobotocore", "boto3", "botocore", "sqlalchemy", "alembic",
         "numpy", "ml_dtypes", "torch", "safetensors", "cryptography", "jinja2",
         "starlette", "uvicorn", "httpx", "requests", "aiohttp", "prometheus_client",
         "rich", "yaml")

_PROBE = """
import atexit, json, sys
def _report():
    with open({out!r}, "w") as f:
        json.dump(sorted({{m.split(".")[0] for m in sys.modules}}), f)
atexit.register(_report)
{code}
"""


def _loaded(tmp_path: Path, code: str) -> set[str]:
    """Top-level packages imported by a fresh interpreter running ``code``."""
    out = tmp_path / "modules.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", _PROBE.format(out=str(out), code=code)],
                   env=env, cwd=tmp_path, capture_output=True, timeout=120)
    return set(json.loads(out.read_text()))


def _main(*args: str) -> str:
    return f"import sys; sys.argv = ['registry', *{list(args)!r}]\nfrom registry.cli import main\nmain()"


def test_import_registry_cli_loads_no_heavy_module(tmp_path: Path) -> None:
    """Not even typer: the console script's import is the package's own."""
    loaded = _loaded(tmp_path, "import registry.cli")
    assert "registry" in loaded
    assert sorted(loaded & {*HEAVY, "typer", "click"}) == []


def test_version_loads_no_heavy_module(tmp_path: Path) -> None:
    assert sorted(_loaded(tmp_path, _main("--version")) & {*HEAVY, "typer", "click"}) == []


def test_registry_cli_app_is_the_typer_app() -> None:
    """``registry.cli.app`` stays the Typer app (tests invoke it) even after
    its submodule of the same name is imported."""
    import registry.cli
    import registry.cli.app
    from registry.cli import app
    from registry.cli.app import RootTyper

    assert isinstance(app, RootTyper) and registry.cli.app is app


@pytest.mark.parametrize("args", [["--help"], []])
def test_help_loads_no_typer_click_or_rich(tmp_path: Path, args: list[str]) -> None:
    """The root's --help (and ``registry`` alone) lists every command from the
    table in plain text: no command's module, nor typer, click or rich."""
    loaded = _loaded(tmp_path, _main(*args))
    assert sorted(loaded & {*HEAVY, "typer", "click"}) == []


def test_plain_help_says_what_the_app_says(tmp_path: Path) -> None:
    """The plain help lists each command's first paragraph and each root
    option of the Typer app with its metavar, help and environment variable;
    ``registry`` alone prints it and exits 2 (no command), ``--help`` exits 0."""
    import typer

    from registry.cli import app
    from registry.cli.table import ROOT_HELP, ROOT_OPTIONS

    full = typer.main.get_command(app)
    assert full.help == ROOT_HELP
    options = [(p.opts[0], p.metavar or "", p.help or "", p.envvar or "")
               for p in full.params]
    assert options + [("--help", "", "Show this message and exit.", "")] == list(ROOT_OPTIONS)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    for args, code in (["--help"], 0), ([], 2):
        p = subprocess.run([sys.executable, "-c", "from registry.cli import main; main()", *args],
                           env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert p.returncode == code, p.stderr
        text = " ".join(p.stdout.split())
        assert text.startswith("Usage: registry [OPTIONS] COMMAND [ARGS]...")
        for name, (_, _, help_text) in COMMANDS.items():
            assert f"{name} {' '.join(help_text.split())}" in text, name
        for flag, metavar, help_text, envvar in ROOT_OPTIONS:
            assert " ".join(f"{flag} {metavar} {help_text}".split()) in text, flag
            assert not envvar or f"[env var: {envvar}]" in text


#: what a read of the index needs none of: the ORM and SQL toolkit (a SQLite
#: index is read with sqlite3; registry.index.lite), the command line toolkit
#: (registry.cli.reads answers a plain line before typer loads), weights
#: formats (headers are read without numpy), remote stores, signing, templates,
#: terminal rendering
NOT_FOR_READS = ("sqlalchemy", "alembic", "typer", "click", "pydantic", "numpy", "ml_dtypes",
                 "torch", "safetensors", "fsspec", "s3fs", "aiobotocore", "boto3", "botocore",
                 "cryptography", "jinja2", "rich", "yaml", "httpx", "requests", "blake3")


@pytest.mark.parametrize(("args", "listed"), [
    (["ls"], "m"), (["ls", "m"], "1"), (["show", "m@1"], "m@1"),
    (["show", "m@1", "--json"], "{")])
def test_a_read_loads_only_what_it_reads_with(tmp_path: Path, args: list[str],
                                              listed: str) -> None:
    """``registry ls`` (models, and a model's releases) and ``registry show``
    on a local store and SQLite index print the release, reading the index
    with sqlite3 and loading none of :data:`NOT_FOR_READS`."""
    store, db = one_release_store(tmp_path)
    out = tmp_path / "read.txt"
    code = (f"import sys\nsys.stdout = open({str(out)!r}, 'w')\n"
            + _main(*args, "--store", store, "--db", db))
    loaded = _loaded(tmp_path, code)
    assert listed == out.read_text().split()[0], out.read_text()
    assert "sqlite3" in loaded
    assert sorted(loaded & set(NOT_FOR_READS)) == []


def test_a_command_loads_only_its_own_modules(tmp_path: Path) -> None:
    out = tmp_path / "cli.json"
    code = ("import json, sys\nsys.argv = ['registry', 'verify', '--help']\n"
            "from registry.cli import main\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
            f"open({str(out)!r}, 'w').write(json.dumps(sorted(m for m in sys.modules "
            "if m.startswith('registry.cli.'))))")
    _loaded(tmp_path, code)
    loaded = set(json.loads(out.read_text()))
    assert "registry.cli.verify" in loaded
    assert not loaded & {"registry.cli.release", "registry.cli.pull", "registry.cli.serve",
                         "registry.cli.index", "registry.cli.ckpt"}


def _modules_of(cmd: object) -> set[str]:
    callback = getattr(cmd, "callback", None)
    found = {getattr(callback, "__wrapped__", callback).__module__} if callback else set()
    for sub in getattr(cmd, "commands", {}).values():
        found |= _modules_of(sub)
    return found


def test_table_matches_the_commands() -> None:
    """Every command registered on the app is in the table, as a group or not,
    with its help's first paragraph, and the modules that define it."""
    import typer

    from registry.cli import app

    full = typer.main.get_command(app)
    assert set(full.commands) == set(COMMANDS)  # type: ignore[attr-defined]
    for name, cmd in full.commands.items():  # type: ignore[attr-defined]
        modules, group, text = COMMANDS[name]
        assert hasattr(cmd, "list_commands") == group, name
        assert first_paragraph(cmd.short_help or cmd.help) == text, name
        defined = _modules_of(cmd) - {"registry.cli.app"}
        assert defined <= set(modules), (name, defined)


@pytest.mark.parametrize("name", ["ls", "release", "alias", "ckpt", "config"])
def test_built_command_is_the_full_one(name: str) -> None:
    """The lazily built command has the same parameters and subcommands as
    the one typer builds from the whole app."""
    import typer

    from registry.cli import _command, app

    lazy = _command().get_command(None, name)
    full = typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
    assert [p.name for p in lazy.params] == [p.name for p in full.params]
    assert sorted(getattr(lazy, "commands", {})) == sorted(getattr(full, "commands", {}))


def test_modules_lists_every_module_of_the_table() -> None:
    from registry.cli.commands import MODULES

    assert {m for mods, _, _ in COMMANDS.values() for m in mods} == set(MODULES)


def test_importing_one_command_module_loads_no_other(tmp_path: Path) -> None:
    """The web pages import registry.cli.aliases for its time parser: a
    command module registering itself must not start loading every other
    one (some import each other: a half-imported module broke that)."""
    out = tmp_path / "cli.json"
    code = ("import json, sys\nimport registry.cli.commands\nimport registry.cli.aliases\n"
            f"open({str(out)!r}, 'w').write(json.dumps(sorted(m for m in sys.modules "
            "if m.startswith('registry.cli.'))))")
    _loaded(tmp_path, code)
    loaded = set(json.loads(out.read_text()))
    assert {"registry.cli.aliases", "registry.cli.release"} <= loaded
    assert not loaded & {"registry.cli.pull", "registry.cli.serve", "registry.cli.lifecycle"}
