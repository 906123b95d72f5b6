"""Webhook delivery of the event log (issue 32 item 7).

Each event is POSTed, in order, to one webhook URL as its stored JSON document
(``Content-Type: application/json``) with these headers:

``X-Registry-Event-Id``
    the event's ``id``: the same on every redelivery, so a receiver dedups on it.
``X-Registry-Event``
    its name (``model_version.created``...).
``X-Registry-Timestamp``
    Unix seconds when this attempt was signed.
``X-Registry-Signature``
    ``sha256=<hex>``: HMAC-SHA256 keyed with the secret (the secret file's
    bytes, surrounding whitespace stripped) over the **signed string**
    ``<timestamp>.<body>`` -- the timestamp header's value, a dot, and the
    exact request body. A receiver recomputes it, compares in constant time
    and refuses old timestamps (replays).

Delivery is **at least once**: an event counts as delivered when the
receiver answers 2xx; until then it is retried with exponential backoff
(``base * 2**attempt`` seconds, capped, with jitter). Redirects are not
followed (a 3xx is a failure). The **cursor** -- the number of the last
delivered event -- is a small JSON file on the delivering host, replaced
atomically (write, fsync, rename) after each delivery, so a deliverer killed
at any point resumes after the last event the receiver acknowledged: the
event in flight is sent again (hence the id). It lives on the host, not in the
store, so a store writer cannot move it to skip events; its default place is
``$REGISTRY_STATE_DIR/webhooks/<id>.json`` (``~/.local/state/model-registry``),
``<id>`` a digest of the store URL and the webhook URL.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import random
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from registry.errors import DocumentError, RegistryError, UsageError
from registry.events.log import Event, iter_events
from registry.store import Store
from registry.trust.events import claim_refuted

HEADER_ID = "X-Registry-Event-Id"
HEADER_NAME = "X-Registry-Event"
HEADER_TIMESTAMP = "X-Registry-Timestamp"
HEADER_SIGNATURE = "X-Registry-Signature"
STATE_ENV = "REGISTRY_STATE_DIR"


class DeliveryError(RegistryError):
    """An event could not be delivered within the attempts allowed; the cursor
    still points before it, so the next run sends it again."""


def signature(secret: bytes, timestamp: str, body: bytes) -> str:
    """``sha256=<hex>``: HMAC-SHA256 of ``<timestamp>.<body>`` keyed with ``secret``."""
    return "sha256=" + hmac.new(secret, timestamp.encode() + b"." + body,
                                hashlib.sha256).hexdigest()


def read_secret(path: str | os.PathLike[str]) -> bytes:
    """The webhook secret from its file (whitespace around it stripped).

    Raises:
        UsageError: unreadable or empty.
    """
    try:
        secret = Path(path).read_bytes().strip()
    except OSError as e:
        raise UsageError(f"{path}: cannot read the webhook secret ({e.strerror})") from None
    if not secret:
        raise UsageError(f"{path}: the webhook secret file is empty")
    return secret


def check_url(url: str) -> str:
    """``url`` if it is an http(s) URL with a host. Raises UsageError."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--webhook {url!r}: expected an http:// or https:// URL")
    return url


def default_cursor(store_url: str, webhook: str) -> Path:
    """Where the cursor of ``webhook`` for the store at ``store_url`` lives by default."""
    base = os.environ.get(STATE_ENV) or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"),
        "model-registry")
    digest = hashlib.sha256(f"{store_url}\n{webhook}".encode()).hexdigest()[:16]
    return Path(base) / "webhooks" / f"{digest}.json"


@dataclass
class Cursor:
    """The last delivered event's number, kept in a file (atomically replaced)."""

    path: Path

    def read(self) -> int:
        """The number (0: nothing delivered yet). Raises DocumentError if garbled."""
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return 0
        except (OSError, ValueError) as e:
            raise DocumentError(str(self.path), f"not a delivery cursor ({e})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("delivered"), int):
            raise DocumentError(str(self.path), "not a delivery cursor: no integer 'delivered'")
        return int(doc["delivered"])

    def write(self, seq: int, event_id: str) -> None:
        """Record ``seq`` as delivered (durable on return). The folder is
        created 0700 and the file 0600 whatever the umask: another local user
        who could rewrite the cursor could silence the notifications."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.path.with_name(f"{self.path.name}.tmp-{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"delivered": seq, "event_id": event_id}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def post(url: str, event: Event, secret: bytes, *, timeout: float = 10.0) -> int:
    """POST one event; returns the HTTP status (0: no answer). Never raises for
    the receiver's failures."""
    body = json.dumps(event.to_dict(), sort_keys=True, separators=(",", ":")).encode()
    stamp = str(int(time.time()))
    req = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", HEADER_ID: event.id, HEADER_NAME: event.name,
        HEADER_TIMESTAMP: stamp, HEADER_SIGNATURE: signature(secret, stamp, body),
        "User-Agent": "model-registry-webhook/1"})
    try:
        with _OPENER.open(req, timeout=timeout) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        e.close()
        return int(e.code)
    except (urllib.error.URLError, OSError, ValueError):
        return 0


def deliver(store: Store, url: str, secret: bytes, cursor: Cursor, *,
            max_attempts: int = 10, backoff: float = 0.5, max_backoff: float = 60.0,
            follow: bool = False, poll: float = 2.0,
            on_event: Callable[[Event, int], None] | None = None,
            stop: Callable[[], bool] | None = None,
            on_set_aside: Callable[[Event, str], None] | None = None) -> int:
    """Deliver every event after the cursor, in order; returns how many.

    Args:
        max_attempts: attempts per event before DeliveryError (0: no limit).
        backoff, max_backoff: the first retry's wait and the cap, seconds.
        follow: keep polling the log for new events (every ``poll`` seconds)
            until ``stop()`` says so.
        on_event: called with each event and the attempts it took.
        on_set_aside: called with each event not delivered because what it
            claims is not true in the store (a store writer's event:
            :func:`registry.trust.events.claim_refuted`) and why; the cursor
            moves past it and delivery goes on.

    Raises:
        DeliveryError: an event was refused ``max_attempts`` times (cursor
            left before it).
        DocumentError: the cursor file is garbled, or an event is damaged.
        StorageError: the store could not be read.
    """
    sent = 0
    while True:
        for event in iter_events(store, after=cursor.read()):
            why = claim_refuted(store, event)
            if why is not None:  # set aside, named; never signed and sent
                cursor.write(event.seq, event.id)
                if on_set_aside is not None:
                    on_set_aside(event, why)
                continue
            attempt = 0
            while True:
                attempt += 1
                status = post(url, event, secret)
                if 200 <= status < 300:
                    break
                if max_attempts and attempt >= max_attempts:
                    raise DeliveryError(f"{url}: event {event.seq} ({event.name}, id "
                                        f"{event.id}) refused {attempt} times (last answer: "
                                        f"{status or 'none'}); it is sent again next run")
                wait = min(max_backoff, backoff * 2 ** (attempt - 1))
                time.sleep(wait * random.uniform(0.8, 1.2))
            cursor.write(event.seq, event.id)
            sent += 1
            if on_event is not None:
                on_event(event, attempt)
        if not follow or (stop is not None and stop()):
            return sent
        time.sleep(poll)
