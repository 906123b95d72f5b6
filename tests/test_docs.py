"""docs/ cannot drift from the CLI (docs/cli.md is generated, docs/errors.md lists every
exit code); every command has help; every error maps to a code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer

import registry.errors as E
from registry.cli import app
from registry.cli.errors import EXIT_CODES, error_boundary, exit_code_for
from registry.cli.reference import _walk, page

DOCS = Path(__file__).resolve().parent.parent / "docs"
CLI_MD = DOCS / "cli.md"


def test_docs_cli_reference_matches_the_commands() -> None:
    assert CLI_MD.read_text() == page(), "docs/cli.md is stale: regenerate it with " \
                                         "python -m registry.cli.reference > docs/cli.md"


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
    import registry.examples.quickstart  # noqa: F401
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


def _reference_sections() -> dict[str, tuple[str, list[str]]]:
    """docs/cli.md: command -> (usage line, bullet names such as ``--ledger PATH``)."""
    text = CLI_MD.read_text()
    out = {}
    for m in re.finditer(r"#### `registry ([^`]+)`\n.*?```\n(.*?)\n```\n\n(.*?)(?=\n####|\Z)",
                         text, re.S):
        names = re.findall(r"^- `([^`]+)`", m.group(3), re.M)
        out[m.group(1)] = (m.group(2), names)
    return out


def _help(path: list[str]) -> str:
    from tests.support.clirunner import CliRunner

    r = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200",
                                                        "TERMINAL_WIDTH": "200"})
    assert r.exit_code == 0, r.output
    return r.output


@pytest.mark.parametrize("path", [p[1:] for p, c in _walk(typer.main.get_command(app),
                                                           ["registry"])
                                  if not hasattr(c, "list_commands")] + [[]],
                         ids=lambda p: " ".join(p) or "registry")
def test_real_help_matches_docs_cli_and_shows_the_fields_metavars(path: list[str]) -> None:
    """The real ``--help`` (whatever typer/click render it): usage line as in
    docs/cli.md, each option followed by its metavar (flags by their help text, never
    by a value placeholder), no ``{model_dir}``, ``<str>`` or ``<bool>``."""
    out = _help(path)
    for bad in ("<str>", "<bool>", "<int>", "<list", "<path>", "TEXT", "BOOLEAN", "INTEGER"):
        assert bad not in out, (bad, out)
    assert not re.search(r"\{[a-z_]+\}", out), out
    for flag in ("--help", "--debug", "--json", "--force", "--verify", "--dry-run", "--full"):
        for m in re.finditer(re.escape(flag) + r"\s+(\S+)", out):
            assert not m.group(1).isupper(), (flag, m.group(0))  # a help word, no metavar
    if not path:
        return
    usage, names = _reference_sections()[" ".join(path)]
    flat = " ".join(out.replace("│", " ").split())
    assert f"Usage: {usage}" in flat, (usage, flat[:300])
    for name in names:
        if name.startswith("--"):
            opt, _, metavar = name.partition(" ")
            if metavar:
                assert re.search(re.escape(opt) + r"\s+" + re.escape(metavar) + r"(\s|$)", out), \
                    (name, out)
            else:
                # a --flag/--no-flag pair shows both names, then the help
                assert re.search(re.escape(opt) + r"(\s+--no-[a-z-]+)?\s+[A-Z][a-z]", out), \
                    (name, out)
        else:  # an argument: its name, in the usage line and the arguments panel
            assert re.search(r"\b" + re.escape(name) + r"\b", out.split("Usage:", 1)[1]), name


def test_docs_error_table_lists_every_exit_code_the_cli_uses() -> None:
    from registry.cli.errors import EXIT_NOT_INDEXED, EXIT_USAGE
    from registry.host.interrupt import EXIT_SIGINT, EXIT_SIGTERM

    section = (DOCS / "errors.md").read_text()
    listed = {int(m) for m in re.findall(r"^\| (\d+) \|", section, re.M)}
    used = set(EXIT_CODES.values()) | {0, EXIT_USAGE, EXIT_NOT_INDEXED, EXIT_SIGINT,
                                       EXIT_SIGTERM}
    assert listed == used
    assert "schemas/cli-error.schema.json" in section


def _links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in t]


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    heads = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", path.read_text(), flags=re.S),
                       re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


def test_readme_is_a_front_door_linking_every_docs_page() -> None:
    readme = DOCS.parent / "README.md"
    lines = readme.read_text().splitlines()
    assert len(lines) < 200, "the README is the front door: reference text goes to docs/"
    linked = {t.split("#")[0] for t in _links(readme)}
    for page in sorted(DOCS.glob("*.md")):
        assert f"docs/{page.name}" in linked, f"README does not link docs/{page.name}"
    assert any(ln.startswith("The suite (about") for ln in lines), "the suite time line"


@pytest.mark.parametrize("doc", ["README.md", *sorted(f"docs/{p.name}" for p in DOCS.glob("*.md"))])
def test_every_relative_link_resolves(doc: str) -> None:
    src = DOCS.parent / doc
    for target in _links(src):
        file, _, anchor = target.partition("#")
        dest = (src.parent / file).resolve() if file else src
        assert dest.exists(), f"{doc}: link {target} names no file"
        if anchor and dest.suffix == ".md":
            assert anchor in _anchors(dest), f"{doc}: link {target}: no such heading"


def test_readme_says_its_install_commands_share_one_venv() -> None:
    """A newcomer runs the README's commands in one checkout: when they create
    the same virtual environment, the README says so (issue 44)."""
    text = (DOCS.parent / "README.md").read_text()
    folders = re.findall(r"^python3 -m venv (\S+) ", text, re.M)
    assert len(folders) == 2
    if len(set(folders)) == 1:
        assert f"Both commands create the same `{folders[0]}` in the checkout" in text


def test_readme_names_the_command_adding_the_postgres_driver() -> None:
    """The quickstart lock has no Postgres driver: the README gives the one
    command that adds the postgres extra's requirement (issue 44)."""
    import tomllib

    project = tomllib.loads((DOCS.parent / "pyproject.toml").read_text())["project"]
    driver = project["optional-dependencies"]["postgres"][0]
    lock = (DOCS.parent / "requirements" / "quickstart.lock").read_text()
    if not re.search(r"^psycopg==", lock, re.M):
        text = (DOCS.parent / "README.md").read_text()
        assert f"`.venv/bin/pip install '{driver}'`" in text
