"""The CLI reference (``docs/cli.md``), generated from the commands themselves.

``python -m registry.cli.reference > docs/cli.md`` writes it; tests check that
``docs/cli.md`` is exactly this text, and that every usage line and metavar in
it is what the real ``--help`` of each command prints.
"""

from __future__ import annotations

from typing import Any

import typer

from registry.cli import app


def _walk(cmd: Any, path: list[str]) -> list[tuple[list[str], Any]]:
    out = [(path, cmd)]
    if hasattr(cmd, "list_commands"):
        ctx = type(cmd).context_class(cmd)  # type: ignore[attr-defined]
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                out += _walk(sub, [*path, name])
    return out


def _first_paragraph(text: str | None) -> str:
    return " ".join((text or "").strip().split("\n\n")[0].split())


def _usage(text: str) -> str:
    return " ".join(text.split()).removeprefix("Usage: ")


def render() -> str:
    """Markdown: one section per command (usage, summary, arguments and options)."""
    root = typer.main.get_command(app)
    lines: list[str] = []
    for path, cmd in _walk(root, ["registry"])[1:]:
        if hasattr(cmd, "list_commands"):
            continue
        ctx = type(cmd).context_class(cmd, info_name=" ".join(path))  # type: ignore[attr-defined]
        lines += [f"#### `{' '.join(path)}`", "", _first_paragraph(cmd.help), "", "```",
                  _usage(cmd.get_usage(ctx)),
                  "```", ""]
        for p in cmd.get_params(ctx):  # metavars as --help shows them (RegistryCommand)
            if p.name == "help":
                continue
            if p.param_type_name == "option":
                flags = ", ".join(f"`{o}{' ' + p.metavar if p.metavar else ''}`"
                                  for o in [*p.opts, *p.secondary_opts])
                required = " (required)" if p.required else ""
                lines.append(f"- {flags}{required}: {_first_paragraph(p.help)}")
            else:
                lines.append(f"- `{p.metavar}`: {_first_paragraph(getattr(p, 'help', ''))}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


HEADER = """# CLI reference

Every command and option of `registry`, generated from the commands themselves
(`python -m registry.cli.reference > docs/cli.md`); a test keeps this page
identical to what `--help` prints. Exit codes: [errors.md](errors.md).
Environment variables: [configuration.md](configuration.md).

"""


def page() -> str:
    """The whole of ``docs/cli.md``: a header, then :func:`render`."""
    return HEADER + render()


if __name__ == "__main__":
    print(page(), end="")
