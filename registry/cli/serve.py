"""``registry serve``: the read-only web pages and JSON API (needs the ``web`` extra)."""

from __future__ import annotations

import ipaddress
import socket
import threading
from pathlib import Path
from typing import Annotated, Any

import typer

from registry.cli.app import DbOpt, JsonOpt, StoreOpt, app, print_json
from registry.cli.errors import error_boundary
from registry.cli.output import echo
from registry.cli.trustopts import (
    TrustedCasOpt,
    TrustedKeysOpt,
    host_trust,
    trusted_ca_option,
    trusted_key_option,
)
from registry.errors import UsageError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080


def is_loopback(host: str) -> bool:
    """``host`` only ever resolves to loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def read_token(path: str) -> str:
    """The bearer token in ``path`` (first line, stripped).

    Raises:
        UsageError: the file cannot be read, or holds no token.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--token-file {path}: cannot read it ({e})") from None
    token = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not token:
        raise UsageError(f"--token-file {path}: holds no token (the first line is empty)")
    return token


@app.command()
def serve(
    host: Annotated[str, typer.Option("--host", help="Address to bind; anything but loopback "
                                                     "needs --token-file.")] = DEFAULT_HOST,
    port: Annotated[int, typer.Option("--port", help="TCP port (0: any free port).",
                                      min=0, max=65535)] = DEFAULT_PORT,
    token_file: Annotated[str | None, typer.Option(
        "--token-file", help="File whose first line is the bearer token every request "
                             "must send (Authorization: Bearer TOKEN).")] = None,
    hub_namespace: Annotated[str, typer.Option(
        "--hub-namespace", metavar="NAME",
        help="Hugging Face Hub API: repo ids are NAME/MODEL_ID (or a bare MODEL_ID).")
    ] = "registry",
    allow_failing: Annotated[bool, typer.Option(
        "--allow-failing", help="Hub API: also serve releases that fail their gates now "
                                "(by default they are refused, 403 GatedRepo).")] = False,
    trusted_key: Annotated[list[str] | None, trusted_key_option(
        "Hub API: public key (PEM) a release must be signed by (repeatable); unsigned or "
        "badly signed releases are refused.")] = None,
    trusted_keys: TrustedKeysOpt = None,
    trusted_ca: Annotated[list[str] | None, trusted_ca_option(
        "Hub API: CA certificate (PEM) a release's signing certificate must chain to "
        "(repeatable).")] = None,
    trusted_cas: TrustedCasOpt = None,
    mirror_cache: Annotated[str | None, typer.Option(
        "--mirror-cache", metavar="PATH",
        help="Front the store as a verifying mirror: keep every verified file in this "
             "content-addressed cache (a registry pull cache) and serve it from there; "
             "each byte is read from the store once. `registry cache prune --cache PATH` "
             "bounds it.")] = None,
    allowed_host: Annotated[list[str] | None, typer.Option(
        "--allowed-host", help="Another name this server answers to (repeatable; e.g. the "
                               "name a proxy forwards). Requests whose Host header is not the "
                               "--host address, localhost, a loopback address or one of these "
                               "get 421 (refuses DNS rebinding).")] = None,
    webhook: Annotated[str | None, typer.Option(
        "--webhook", metavar="URL",
        help="Also deliver the store's events to URL while serving (as `registry events "
             "deliver --follow`; needs --webhook-secret-file).")] = None,
    webhook_secret_file: Annotated[str | None, typer.Option(
        "--webhook-secret-file", metavar="PATH",
        help="File holding the --webhook's HMAC-SHA256 secret.")] = None,
    fresh_for: Annotated[float | None, typer.Option(
        "--fresh-for", metavar="SECONDS", min=0,
        help="Hub API: read each mutable fact (a model's versions, an alias, gate and "
             "signature verdicts) from the store at most once per SECONDS, shared by all "
             "requests (default: 5 with --mirror-cache, else 0: every request).")] = None,
    stale_for: Annotated[float, typer.Option(
        "--stale-for", metavar="SECONDS", min=0,
        help="Hub API: while the store cannot be reached, keep answering with facts read "
             "up to SECONDS past --fresh-for (marked X-Registry-Stale); 0: never stale.")
    ] = 300.0,
    drain_timeout: Annotated[float, typer.Option(
        "--drain-timeout", metavar="SECONDS", min=0,
        help="On SIGTERM: stop accepting, let responses in flight finish for up to SECONDS, "
             "then close them and exit 0.")] = 30.0,
    keep_alive: Annotated[float, typer.Option(
        "--keep-alive", metavar="SECONDS", min=0.1,
        help="Close a keep-alive connection idle for SECONDS.")] = 5.0,
    header_timeout: Annotated[float, typer.Option(
        "--header-timeout", metavar="SECONDS", min=0.1,
        help="Close a connection that has not sent a whole request head SECONDS after it "
             "opened or its last response ended (slowloris).")] = 10.0,
    request_log: Annotated[bool, typer.Option(
        "--request-log", envvar="REGISTRY_REQUEST_LOG",
        help="Write one line per request to stderr: method, path without its query, route "
             "class, status, bytes, seconds; never a header or the query string (always on "
             "with --log-format json, as JSON).")] = False,
    store: StoreOpt = None, db: DbOpt = None, as_json: JsonOpt = False,
) -> None:
    """Serve web pages, a JSON API (/api/v1) and the Hugging Face Hub download API, read-only.

    Serving stacks pull releases with HF_ENDPOINT=http://HOST:PORT (repo id
    NAMESPACE/MODEL_ID, revision a version, an alias or a commit id); see
    docs/hub.md. OCI clients (skopeo, oras, containerd) pull the same releases
    as ModelPack artifacts from /v2/NAMESPACE/MODEL_ID; see docs/oci.md. SIGTERM
    drains and exits 0 (docs/mirror-operations.md)."""
    with error_boundary(as_json):
        try:
            import uvicorn  # noqa: F401  (the web extra's server)

            from registry.web import create_app
        except ImportError as e:
            raise UsageError(f"registry serve needs the web extra ({e.name} is missing): "
                             "pip install 'modeldir-registry[web]'") from None
        from registry.api import Registry

        token = read_token(token_file) if token_file else None
        if token is None and not is_loopback(host):
            raise UsageError(f"--host {host}: serving beyond this machine needs "
                             "--token-file (every request must then carry the token)")
        # re-read when its files change
        trust = host_trust(trusted_key, trusted_keys, trusted_ca, trusted_cas, live=True)
        from registry.rules.names import check_name
        from registry.web.hub import HubStats
        from registry.web.hubrefs import HubPolicy

        check_name(hub_namespace, "--hub-namespace")
        from registry.web.security import allowed_hosts

        try:
            hosts = allowed_hosts(host, allowed_host or ())
        except ValueError as e:
            raise UsageError(str(e)) from None
        hook = _webhook(webhook, webhook_secret_file)
        reg = Registry(store, db)
        from registry.trust.marks import Marks
        from registry.web.fresh import MIRROR_FRESH_FOR, Facts

        policy = HubPolicy(reg.store, namespace=hub_namespace, allow_failing=allow_failing,
                           trust=trust, marks=Marks.for_store(reg.store.url),
                           facts=Facts(fresh_for if fresh_for is not None
                                       else MIRROR_FRESH_FOR if mirror_cache else 0.0,
                                       stale_for))
        stats = HubStats()
        source = None
        if mirror_cache is not None:
            from registry.web.mirror import MirrorSource

            source = MirrorSource(reg.store, mirror_cache, on_store_bytes=stats.from_store)
        web = create_app(reg, token=token, hub_policy=policy, hub_source=source,
                         hub_stats=stats, hosts=hosts, request_log=request_log)
        from registry.web.server import make_server, run

        server = make_server(web, header_timeout=header_timeout, keep_alive=keep_alive,
                             drain=drain_timeout)
        # the bound port is known only once the socket is open (--port 0); a
        # port in use is one line, not uvicorn's log and exit
        try:
            sock = socket.create_server(
                (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
        except OSError as e:
            reg.close()
            raise UsageError(f"--host {host} --port {port}: cannot listen there "
                             f"({e.strerror or e})") from None
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{bound}/"
    if as_json:
        print_json({"url": url, "store": reg.store.url, "index": str(reg.index),
                    "api": f"{url}api/v1", "docs": f"{url}api/v1/docs",
                    "allowed_hosts": sorted(hosts)})
    else:
        echo(f"serving {reg.store.url} and {reg.index} read-only at {url} "
                   "(API: /api/v1, docs: /api/v1/docs); Ctrl-C stops")
    stop = threading.Event()
    if hook is not None:
        threading.Thread(target=_deliver_forever, args=(reg.store, *hook, stop),
                         name="webhook", daemon=True).start()

    def cleanup() -> None:
        stop.set()
        reg.close()
    run(server, sock, cleanup)  # a SIGTERM stop ends here with status 0 (registry.web.server)


def _webhook(url: str | None, secret_file: str | None) -> tuple[str, bytes] | None:
    """``--webhook`` and its secret, checked before serving. Raises UsageError."""
    if url is None:
        if secret_file is not None:
            raise UsageError("--webhook-secret-file: give the --webhook URL too")
        return None
    from registry.events.deliver import check_url, read_secret

    if secret_file is None:
        raise UsageError("--webhook: give its secret with --webhook-secret-file")
    return check_url(url), read_secret(secret_file)


def _deliver_forever(store: Any, url: str, secret: bytes, stop: threading.Event) -> None:
    """The serve process's webhook thread: deliver, and on an error say it on
    stderr and start again from the cursor a little later."""
    from registry.errors import RegistryError
    from registry.events.deliver import Cursor, default_cursor, deliver

    cursor = Cursor(default_cursor(store.url, url))
    while not stop.is_set():
        try:
            deliver(store, url, secret, cursor, max_attempts=0, follow=True,
                    stop=stop.is_set)
        except (RegistryError, OSError) as e:
            echo(f"warning: webhook {url}: {e}; retrying", err=True)
            stop.wait(5.0)
