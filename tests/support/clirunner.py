"""typer's test runner on the registry's click command as the console script
builds it: once per process (:func:`registry.cli._command`), not once per
invocation (typer's own runner builds the whole tree again each time: about
80 ms, for a ``--help`` that takes 2)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from unittest import mock

import typer.testing

from registry.cli import _command
from registry.cli import app as registry_app


class CliRunner(typer.testing.CliRunner):
    """:class:`typer.testing.CliRunner` whose ``invoke(registry.cli.app, ...)``
    runs the cached command; any other app goes through typer as before."""

    def invoke(self, app: Any, args: str | Sequence[str] | None = None,  # type: ignore[override]
               **kw: Any) -> Any:
        if app is not registry_app:
            return super().invoke(app, args, **kw)
        # typer's invoke looks the builder up in its module on each call
        with mock.patch.object(typer.testing, "_get_command", lambda _app: _command()):
            return super().invoke(app, args, **kw)
