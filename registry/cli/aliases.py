"""``registry alias rm`` and ``registry alias log``: removing an alias, and its history
(issue 32 item 4). ``alias set`` and ``alias ls`` are in :mod:`registry.cli.release`."""

from __future__ import annotations

from datetime import UTC, datetime, time
from typing import Annotated

import typer

from registry.host import actor
from registry.cli.app import DbOpt, JsonOpt, StoreOpt, print_json
from registry.cli.errors import error_boundary, index_writes, report_not_indexed
from registry.cli.output import echo
from registry.cli.release import MoveKeyOpt, _registry, alias_app
from registry.cli.trustopts import TrustedKeysOpt, host_trust, trusted_key_option
from registry.errors import UsageError


@alias_app.command("rm")
def alias_rm(model_id: Annotated[str, typer.Argument(help="Model id.")],
             alias: Annotated[str, typer.Argument(help="Alias to remove, e.g. staging.")],
             sign_key: MoveKeyOpt = None,
             store: StoreOpt = None, db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """Remove ALIAS of MODEL_ID (compare-and-swap, recorded in the alias's history)."""
    with error_boundary(as_json), index_writes():
        reg = _registry(store, db)
        previous = reg.remove_alias(model_id, alias, sign_key=sign_key)
    if as_json:
        from registry.cli.snapshot import signed

        print_json({"model_id": model_id, "alias": alias, "version": None,
                    "previous": previous, **signed(reg.snapshots)})
    else:
        from registry.cli.snapshot import report

        echo(f"{model_id}@{alias} removed (was "
             f"{previous if previous is not None else 'a damaged pointer'})")
        report(reg.snapshots)
    report_not_indexed(reg.index_errors, store=store, db=db, as_json=as_json)


def parse_time(text: str) -> str:
    """``--at``: an RFC 3339 time (``2026-12-01T14:00:00Z``, an offset, or none:
    UTC) or a date (``2026-12-01``: the end of that day, UTC), in the registry's
    time format for comparison with recorded times.

    Raises:
        UsageError: neither.
    """
    try:
        if len(text) == 10:
            when = datetime.combine(datetime.fromisoformat(text).date(), time.max, UTC)
        else:
            when = datetime.fromisoformat(text.replace("Z", "+00:00"))
            when = when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
    except ValueError:
        raise UsageError(f"--at {text!r}: expected a time like 2026-12-01T14:00:00Z or a "
                         "date like 2026-12-01") from None
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@alias_app.command("log")
def alias_log(model_id: Annotated[str, typer.Argument(help="Model id.")],
              alias: Annotated[str, typer.Argument(help="Alias, e.g. prod.")],
              at: Annotated[str | None, typer.Option(
                  "--at", metavar="TIME",
                  help="Say what ALIAS designated at TIME (RFC 3339, or a date: the end "
                       "of that day, UTC) instead of listing the moves.")] = None,
              trusted_key: Annotated[list[str] | None, trusted_key_option(
                  "Public key (PEM) to verify the moves' signatures with (repeatable); "
                  "without one a signature is shown as a claim, not verified.")] = None,
              trusted_keys: TrustedKeysOpt = None,
              store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """The moves of ALIAS of MODEL_ID, newest first: when, from, to, who, and their
    signatures: verified against --trusted-key(s), else shown as unverified claims."""
    from registry.refs.alias_history import AliasMove
    from registry.store import open_store
    from registry.trust.moves import alias_log as log_document

    with error_boundary(as_json):
        when = parse_time(at) if at is not None else None
        trust = host_trust(trusted_key, trusted_keys)
        s = open_store(store)
        doc = log_document(s, model_id, alias, at=when, trust=trust)
        if not doc["moves"] and not doc["broken"] and when is None:
            from registry.refs.aliases import unknown_ref
            from registry.protocol.layout import alias_key

            if not s.exists(alias_key(model_id, alias)):  # never set: a typo?
                raise unknown_ref(s, model_id, alias, kind="alias")
    for note in doc["broken"]:
        echo(f"warning: {note}", err=True)
    if as_json:
        print_json(doc)
        return
    if when is not None:
        move = doc["move"]
        if move is None:
            echo(f"{model_id}@{alias} had no recorded move by {when}", err=True)
        else:
            echo(f"{model_id}@{alias} at {when}: {doc['version'] or '(removed)'} (move "
                 f"{move['seq']} at {move['time']} by {actor.describe(move['actor'])})")
        return
    moves = [AliasMove(b"", m) for m in doc["moves"]]
    for m in moves:
        echo(f"{m.seq}\t{m.time}\t{m.old or '-'} -> {m.new or '(removed)'}\t"
             f"{actor.describe(m.doc['actor'])}\t{m.doc['signature_state']}")
    if not moves:
        echo(f"{model_id}@{alias} has no recorded moves", err=True)
