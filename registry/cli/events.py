"""``registry events ls|tail|deliver|repair``: the store's event log and its webhook
delivery (issue 32 item 7; docs/lifecycle.md)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from registry.host import actor
from registry.cli.app import JsonOpt, RegistryTyper, StoreOpt, app, print_json
from registry.cli.errors import error_boundary
from registry.cli.output import echo
from registry.errors import UsageError

events_app = RegistryTyper(help="The store's event log (events/) and webhook delivery.",
                           no_args_is_help=True)
app.add_typer(events_app, name="events")

SinceOpt = Annotated[str | None, typer.Option(
    "--since", metavar="SEQ|TIME",
    help="Only events after event number SEQ, or at or after TIME (RFC 3339 or a date).")]
WebhookOpt = Annotated[str, typer.Option("--webhook", metavar="URL",
                                         help="http(s) URL the events are POSTed to.")]
SecretOpt = Annotated[str, typer.Option(
    "--secret-file", metavar="PATH",
    help="File holding the HMAC-SHA256 secret (X-Registry-Signature).")]


def _since(text: str | None) -> tuple[int, str | None]:
    """(events after this number, events at or after this time)."""
    if text is None:
        return 0, None
    if text.isdigit():
        return int(text), None
    from registry.cli.aliases import parse_time

    try:
        return 0, parse_time(text)
    except UsageError:
        raise UsageError(f"--since {text!r}: expected an event number or a time like "
                         "2026-12-01T14:00:00Z") from None


def _line(e: object) -> str:
    from registry.events.log import Event

    assert isinstance(e, Event)
    what = f"{e.model_id}@{e.version}" if e.model_id and e.version else (e.model_id or "-")
    extra = " ".join(f"{k}={'-' if v is None else v}" for k, v in sorted(e.data.items())
                     if k in ("alias", "previous", "source_id", "reason", "key", "value"))
    return f"{e.seq}\t{e.time}\t{e.name}\t{what}\t{actor.describe(e.actor)}" + (
        f"\t{extra}" if extra else "")


def _events(store: str | None, since: str | None, newest: int | None = None) -> list[object]:
    from registry.events.log import select_events
    from registry.store import open_store

    after, when = _since(since)
    damaged: list[str] = []
    out: list[object] = list(select_events(open_store(store), after=after, when=when,
                                           newest=newest, damaged=damaged))
    for note in damaged:
        echo(f"warning: damaged event skipped: {note}", err=True)
    return out


@events_app.command("ls")
def events_ls(since: SinceOpt = None, store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """List the events of the store, oldest first: number, time, name, release, actor."""
    with error_boundary(as_json):
        events = _events(store, since)
    if as_json:
        print_json([e.to_dict() for e in events])  # type: ignore[attr-defined]
        return
    for e in events:
        echo(_line(e))
    if not events:
        echo("no events", err=True)


@events_app.command("tail")
def events_tail(count: Annotated[int, typer.Option("--count", min=1, metavar="N",
                                                   help="How many of the newest.")] = 10,
                since: SinceOpt = None,
                follow: Annotated[bool, typer.Option(
                    "--follow", help="Keep printing new events as they are appended "
                                           "(Ctrl-C stops).")] = False,
                store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Print the newest events (with --follow, then each new one as it is appended)."""
    with error_boundary(as_json):
        events = _events(store, since, newest=count)
        for e in events:
            echo(json_line(e) if as_json else _line(e))
        last = events[-1].seq if events else _last(store)  # type: ignore[attr-defined]
        while follow:
            time.sleep(1.0)
            for e in _events(store, str(last)):
                echo(json_line(e) if as_json else _line(e))
                last = e.seq  # type: ignore[attr-defined]


def _last(store: str | None) -> int:
    from registry.events.log import event_numbers
    from registry.store import open_store

    numbers = event_numbers(open_store(store))
    return numbers[-1] if numbers else 0


def json_line(e: object) -> str:
    from registry.rules import numbers

    return numbers.dumps(e.to_dict(), sort_keys=True)  # type: ignore[attr-defined]


@events_app.command("deliver")
def events_deliver(webhook: WebhookOpt, secret_file: SecretOpt,
                   cursor: Annotated[str | None, typer.Option(
                       "--cursor", metavar="PATH",
                       help="Delivery cursor file (default: $REGISTRY_STATE_DIR/webhooks/"
                            "<digest of store and URL>.json).")] = None,
                   max_attempts: Annotated[int, typer.Option(
                       "--max-attempts", min=0,
                       help="Attempts per event before giving up (0: no limit).")] = 10,
                   backoff: Annotated[float, typer.Option(
                       "--backoff", min=0.0, help="First retry's wait in seconds; doubles "
                                                  "each attempt, capped at 60.")] = 0.5,
                   follow: Annotated[bool, typer.Option(
                       "--follow", help="Keep delivering new events (poll every 2 s).")
                   ] = False,
                   store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """POST every event after the cursor to WEBHOOK, signed, in order, at least once."""
    from registry.events.deliver import Cursor, check_url, default_cursor, deliver, read_secret
    from registry.store import open_store

    with error_boundary(as_json):
        url = check_url(webhook)
        secret = read_secret(secret_file)
        s = open_store(store)
        c = Cursor(default_cursor(s.url, url) if cursor is None else Path(cursor))
        start = c.read()
        aside: list[dict[str, Any]] = []

        def set_aside(e: Any, why: str) -> None:
            aside.append({"seq": e.seq, "id": e.id, "name": e.name, "reason": why})
            echo(f"warning: set aside event {e.seq} {e.name}: not true in the store ({why}); "
                 "not delivered", err=True)

        sent = deliver(s, url, secret, c, max_attempts=max_attempts, backoff=backoff,
                       follow=follow, on_event=None if as_json else lambda e, n: echo(
                           f"delivered {e.seq} {e.name} ({n} attempt{'s' if n > 1 else ''})"),
                       on_set_aside=set_aside)
    if as_json:
        print_json({"webhook": url, "cursor": str(c.path), "from": start, "delivered": sent,
                    "to": c.read(), "set_aside": aside})
    elif not sent:
        echo(f"nothing to deliver after event {start}", err=True)


@events_app.command("repair")
def events_repair(store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Append the events the store's releases, alias histories, tombstones, yank
    records and tags records imply and the log lacks."""
    from registry.events.repair import repair
    from registry.store import open_store

    damaged: list[str] = []
    with error_boundary(as_json):
        added = repair(open_store(store), damaged=damaged)
    for note in damaged:
        echo(f"warning: skipped, cannot be read: {note}", err=True)
    if as_json:
        print_json({"appended": added, "skipped": damaged})
        return
    for line in added:
        echo(f"appended {line}")
    if not added:
        echo("no event missing", err=True)
