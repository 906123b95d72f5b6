"""``registry quickstart``: train, crash, resume, release, revoke, pull -- end to end."""

from __future__ import annotations

from typing import Annotated

import typer

from registry.cli.app import DbOpt, JsonOpt, StoreOpt, app, print_json
from registry.cli.errors import error_boundary
from registry.cli.output import echo


@app.command()
def quickstart(
    workdir: Annotated[str, typer.Option("--workdir", metavar="PATH",
                                         help="Scratch folder for the trainer's "
                                              "output, cache and serving dir.")]
    = "quickstart",
    store: StoreOpt = None, db: DbOpt = None, as_json: JsonOpt = False,
) -> None:
    """Run the whole workflow on STORE and DB, printing each step (a few minutes at most)."""
    from registry.examples import quickstart as qs

    with error_boundary(as_json):
        summary = qs.run(store, db, workdir, say=(lambda _msg: None) if as_json else echo)
    if as_json:
        print_json(summary)
