"""The README cannot drift from the CLI; every command has help; every error maps to a code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer

import registry.errors as E
from registry.cli import app
from registry.cli.errors import EXIT_CODES, error_boundary, exit_code_for
from registry.cli.reference import _walk, render

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_cli_reference_matches_the_commands() -> None:
    text = README.read_text()
    m = re.search(r"<!-- cli-reference:start -->\n(.*)<!-- cli-reference:end -->", text, re.S)
    assert m, "README lacks the cli-reference markers"
    assert m.group(1) == render(), "README CLI reference is stale: regenerate it with " \
                                   "python -m registry.cli.reference"


def test_every_command_has_help() -> None:
    for path, cmd in _walk(typer.main.get_command(app), ["registry"])[1:]:
        assert (cmd.help or "").strip(), f"{' '.join(path)} has no help text"
        for p in cmd.params:
            assert (getattr(p, "help", "") or "").strip(), f"{' '.join(path)} {p.name}: no help"


def _subclasses(cls: type) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub} | _subclasses(sub)
    return out


def test_every_registry_error_maps_to_a_one_line_message_and_exit_code(
        capsys: pytest.CaptureFixture[str]) -> None:
    import registry.api  # noqa: F401  (load every module that may define errors)
    import registry.examples.tinytrainer  # noqa: F401
    import registry.quickstart  # noqa: F401
    classes = sorted(_subclasses(E.RegistryError) | {E.RegistryError}, key=lambda c: c.__name__)
    assert len(classes) > 20
    for cls in classes:
        exc = cls.__new__(cls)
        Exception.__init__(exc, "models/m/1/MANIFEST.json: a rule\nsecond line")
        with pytest.raises(typer.Exit) as e, error_boundary():
            raise exc
        assert e.value.exit_code == exit_code_for(exc) > 0, cls
        err = capsys.readouterr().err
        assert err == "error: models/m/1/MANIFEST.json: a rule\n", (cls, err)
    assert all(issubclass(c, E.RegistryError) for c in EXIT_CODES)
    assert exit_code_for(E.VersionExistsError("x")) == 4
    assert exit_code_for(E.IndexOutOfDateError("x")) == 9
