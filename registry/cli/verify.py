"""``registry verify``: is a directory committed, and do its files verify."""

from __future__ import annotations

from typing import Annotated

import typer

from registry.cli.app import JsonOpt, app, nothing_stored, print_json
from registry.cli.errors import EXIT_FAILED, error_boundary, fail
from registry.cli.output import echo, shown
from registry.errors import ObjectNotFoundError
from registry.store import open_store
from registry.protocol.verify import verify_directory
from registry.rules.words import count


@app.command()
def verify(
    directory: Annotated[str, typer.Argument(help="Directory path or URL (s3://b/p/dir).")],
    full: Annotated[bool, typer.Option("--full", help="Compare the sha256 of every byte "
                                                      "(the default; kept for scripts).")
                    ] = False,
    quick: Annotated[bool, typer.Option("--quick", help="Compare sizes only (fast; a flipped "
                                                        "byte passes).")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Check that DIRECTORY is committed and every file matches its MANIFEST.json.

    Every byte is hashed by default (by pieces, on every core); --quick compares
    sizes only. Exits 0 when it verifies, 1 when it does not (one line per
    failing file).
    """
    with error_boundary(as_json):
        if full and quick:
            from registry.errors import UsageError

            raise UsageError("--full and --quick: give at most one")
        full = not quick
        store = open_store(directory)
        if nothing_stored(store, ""):
            raise ObjectNotFoundError(f"{store.url}: no such directory (nothing stored there)",
                                      key=store.url)
        report = verify_directory(store, "", full=full)
    if as_json:
        print_json(report.to_dict())
    else:
        if report.error is not None:
            echo(f"NOT COMMITTED {report.error}")
        for p in report.problems:
            echo(f"FAIL {shown(p.path)}: {shown(p.reason)}")
        for extra in report.extras:
            echo(f"EXTRA {shown(extra)}: not listed in MANIFEST.json")
        if report.ok:
            m = report.manifest
            assert m is not None
            mode = "sha256" if full else "sizes"
            echo(f"OK {store.url}: {count(len(m.files), 'file')}, {m.total_size} bytes, "
                       f"{mode} verified, manifest sha256 {m.digest}")
    if not report.ok:
        why = (str(report.error) if report.error is not None
               else f"{count(len(report.problems), 'file')} "
               f"{'differs' if len(report.problems) == 1 else 'differ'} from MANIFEST.json"
               if report.problems else f"{count(len(report.extras), 'file')} not in MANIFEST.json")
        fail(f"{store.url}: does not verify: {why}", EXIT_FAILED, as_json=as_json,
             path=store.url)
