"""The README's CLI reference, generated from the commands themselves.

``python -m registry.cli.reference`` prints it; a test checks the README holds
exactly this text between its ``cli-reference`` markers, so it cannot drift
from ``--help``.
"""

from __future__ import annotations

import re
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
    text = " ".join(text.split()).removeprefix("Usage: ")
    text = re.sub(r"\{(\w+)\}", lambda m: m.group(1).upper(), text)
    return re.sub(r"\[([a-z_]+)\]", lambda m: f"[{m.group(1).upper()}]", text)


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
        for p in cmd.params:
            if p.param_type_name == "option":
                flags = ", ".join(f"`{o}`" for o in p.opts)
                required = " (required)" if p.required else ""
                lines.append(f"- {flags}{required}: {_first_paragraph(p.help)}")
            else:
                lines.append(f"- `{(p.name or '').upper()}`: "
                             f"{_first_paragraph(getattr(p, 'help', ''))}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(render(), end="")
