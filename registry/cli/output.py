"""Everything the CLI writes goes through here: inert and without secrets.

A store writer chooses file names, model card text, revocation reasons and
error details; a terminal interprets control characters in them (``\\r``
and ``ESC [ 2K`` erase a ``FAIL`` line and paint ``OK`` over it; OSC 8 makes
links; bidi overrides reorder text). :func:`inert` shows every such
character as a visible escape (``\\r``, ``\\x1b``, ``\\u202e``), keeping only
tabs and the line breaks the CLI itself writes; :func:`echo` applies it and
:func:`registry.host.redact.redact` to every line of output. ``--json`` output is
``json.dumps`` with ``ensure_ascii`` (every control character is a ``\\u``
escape there already), redacted too.
"""

from __future__ import annotations

import sys
import unicodedata

from registry.host.redact import redact


def _escape(ch: str) -> str:
    named = {"\r": "\\r", "\n": "\\n", "\t": "\\t"}
    if ch in named:
        return named[ch]
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


#: Cc: C0/C1 controls and DEL; Cf: bidi overrides, zero-width and other format
#: characters; Zl/Zp: line and paragraph separators; Cs: lone surrogates
_UNSAFE = ("Cc", "Cf", "Zl", "Zp", "Cs")


def inert(text: str, *, keep: str = "\n\t") -> str:
    """``text`` with every control or format character shown as an escape
    (``\\r``, ``\\x1b``, ``\\u202e``), except those in ``keep``."""
    if text.isprintable():
        return text
    return "".join(_escape(c) if unicodedata.category(c) in _UNSAFE and c not in keep else c
                   for c in text)


def shown(text: object) -> str:
    """A file name, model id or other store-supplied value for the middle of a
    line: :func:`inert` with line breaks and tabs escaped too."""
    return inert(str(text), keep="")


def echo(message: object = "", *, err: bool = False, nl: bool = True,
         lines: bool = False) -> None:
    """``typer.echo`` of ``message`` made inert and redacted: one line (a line
    break inside a value is shown as ``\\n``, so no value can forge a line of
    its own; tabs stay, as column separators), or with ``lines`` several (the
    CLI's own multi-line text)."""
    text = inert(str(message), keep="\n\t" if lines else "\t")
    write(redact(text), err=err, nl=nl)


def write(text: str, *, err: bool = False, nl: bool = True) -> None:
    """``text`` as ``typer.echo`` (click.echo) writes a string: to stdout (or
    stderr), a line break after unless ``nl`` is false, flushed; without
    loading typer (``registry ls`` and ``show`` answer without it). click
    strips ANSI escapes off a terminal: :func:`echo`'s text has none left."""
    stream = sys.stderr if err else sys.stdout
    if stream is None:
        return
    out = text + "\n" if nl else text
    if out:
        stream.write(out)
    stream.flush()


def print_json(doc: object) -> None:
    """One JSON document on stdout, sorted keys, indented (``--json``)."""
    from registry.rules import numbers

    echo(numbers.dumps(doc, indent=2, sort_keys=True, default=str), lines=True)
