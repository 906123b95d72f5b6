"""``registry snapshot sign`` and ``refresh``: a model's signed snapshot and timestamp
(issue 50 item 3, :mod:`registry.trust.snapshot`)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from registry.cli.app import JsonOpt, RegistryTyper, StoreOpt, app, print_json
from registry.cli.errors import error_boundary
from registry.cli.output import echo

snapshot_app = RegistryTyper(help="Signed snapshots and timestamps of a model's trust "
                                  "records (yanks, tombstones, aliases, revocations, policy).",
                             no_args_is_help=True)
app.add_typer(snapshot_app, name="snapshot")

SnapshotKeyOpt = Annotated[str | None, typer.Option(
    "--sign-key", metavar="PATH",
    help="EC private key (PEM) of a key the reading hosts trust: sign the model's snapshot "
         "and timestamp again after the change (registry snapshot sign).")]
ExpiresOpt = Annotated[str, typer.Option(
    "--expires-in", metavar="DURATION",
    help="How long the signed timestamp is valid (default 1d); the unit is required (90s, "
         "15m, 2h, 7d). Hosts with trusted keys refuse the model once it expired.")]


def _expires(text: str) -> float:
    from registry.lifecycle.gc import parse_duration

    return parse_duration(text, what="--expires-in")


def report(done: list[dict[str, Any]]) -> None:
    """One line per re-signed snapshot (the lifecycle commands' --sign-key)."""
    for d in done:
        echo(f"signed snapshot {d['snapshot']} of {d['model_id']} ({d['records']} records; "
             f"timestamp valid until {d['expires']})")


def signed(done: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"snapshots": done}`` for a command's --json document, {} when none was signed."""
    return {"snapshots": done} if done else {}


@snapshot_app.command("sign")
def snapshot_sign(
    model_id: Annotated[list[str], typer.Argument(help="Model id (repeatable).")],
    sign_key: Annotated[str, typer.Option("--sign-key", metavar="PATH",
                                          help="EC private key (PEM) of a key the reading "
                                               "hosts trust.")],
    expires_in: ExpiresOpt = "1d",
    store: StoreOpt = None, as_json: JsonOpt = False,
) -> None:
    """Sign a new snapshot of each model's trust records and a timestamp naming it.

    Hosts pulling with trusted keys then refuse a listed record that is gone
    or changed (a removed yank, a rolled-back alias), and the model once the
    timestamp expired (refresh it: registry snapshot refresh)."""
    with error_boundary(as_json):
        from registry.store import open_store
        from registry.trust.snapshot import sign_snapshot

        s = open_store(store)
        seconds = _expires(expires_in)
        done = [sign_snapshot(s, m, sign_key, expires_in=seconds) for m in model_id]
    if as_json:
        print_json({"signed": done})
        return
    for d in done:
        echo(f"signed snapshot {d['snapshot']} of {d['model_id']} ({d['records']} records, "
             f"key {d['key'][:16]}); timestamp {d['timestamp']} valid until {d['expires']}")


@snapshot_app.command("refresh")
def snapshot_refresh(
    model_id: Annotated[list[str] | None, typer.Argument(
        help="Model id (repeatable; default: every model that has a signed snapshot).")] = None,
    sign_key: Annotated[str, typer.Option("--sign-key", metavar="PATH",
                                          help="EC private key (PEM) of a key the reading "
                                               "hosts trust (required).")] = "",
    expires_in: ExpiresOpt = "1d",
    store: StoreOpt = None, as_json: JsonOpt = False,
) -> None:
    """Sign the timestamp of each model's current snapshot again (cron-able).

    The new timestamp is valid for --expires-in from now: run it well within
    that, e.g. every 6 hours for the default of 1d."""
    with error_boundary(as_json):
        from registry.errors import UsageError
        from registry.store import open_store
        from registry.trust.snapshot import refresh_timestamp, signed_models

        if not sign_key:
            raise UsageError("--sign-key: required (the key that signs the timestamp)")
        s = open_store(store)
        seconds = _expires(expires_in)
        models = model_id or signed_models(s)
        done = [refresh_timestamp(s, m, sign_key, expires_in=seconds) for m in models]
    if as_json:
        print_json({"refreshed": done})
        return
    if not done:
        echo("no model has a signed snapshot (registry snapshot sign MODEL_ID --sign-key KEY)")
    for d in done:
        echo(f"refreshed the timestamp of {d['model_id']} (snapshot {d['snapshot']}, "
             f"timestamp {d['timestamp']}) valid until {d['expires']}")
