"""``registry ls`` and ``registry show``: what they read and print, without
typer (issue 44 item 6).

The Typer commands (:mod:`registry.cli.index`) call :func:`ls_rows` /
:func:`show_doc` and :func:`print_ls` / :func:`print_show`. A plain command
line (``registry ls [MODEL_ID] [--store URL] [--db URL] [--json]``, ``registry
show REF ...``, options as ``--store URL`` or ``--store=URL``, each at most once,
and none of the root options or their environment variables but
``REGISTRY_PROFILE``) is answered by :func:`run` before typer loads: the same
order of settings (flag, environment variable, the config file's profile,
built-in default), the same error boundary and exit codes, the same bytes.
Any other line (``--help``, a usage error, ``--debug``, ``--log-format``...)
returns None from :func:`run` and goes to typer.

May import: registry.cli.errors, registry.cli.output, registry.host.config, and
the library's rooms; never typer (nor registry.cli.app).
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any

from registry.cli.errors import error_boundary
from registry.cli.output import echo, print_json, shown, write
from registry.rules.words import count

#: root options' environment variables that need the Typer path (its root
#: callback acts on them: log format, metrics)
_ROOT_ENV = ("REGISTRY_LOG_FORMAT", "REGISTRY_METRICS_FILE", "REGISTRY_METRICS_PUSH")


def _registry(store: str | None, db: str | None) -> Any:
    from registry.api import Registry

    return Registry(store, db)


def show_doc(store: str | None, db: str | None, ref: str) -> dict[str, Any]:
    """The release ``ref`` names, as :meth:`registry.api.Registry.show` says it:
    from :mod:`registry.facade.quick` when it can answer alone."""
    from registry.facade import quick

    doc = quick.show(store, db, ref)  # SQLite, no store-decided gate: no SQLAlchemy
    if doc is None:
        reg = _registry(store, db)
        doc = reg.show(*reg.resolve(ref))
    return doc


def ls_rows(store: str | None, db: str | None,
            model_id: str | None) -> tuple[list[dict[str, Any]], Any]:
    """:meth:`registry.api.Registry.ls` of ``model_id`` and the Registry that
    answered (None when :mod:`registry.facade.quick` did: it answers only
    when there are rows)."""
    from registry.facade import quick

    rows = quick.ls(store, db, model_id)  # SQLite, no store-decided gate: no SQLAlchemy
    if rows is not None:
        return rows, None
    reg = _registry(store, db)
    return reg.ls(model_id), reg


def print_ls(rows: list[dict[str, Any]], model_id: str | None, reg: Any,
             as_json: bool) -> None:
    if as_json:
        print_json(rows)
        return
    if not rows:
        echo(f"no model in the index {reg.index}" if model_id is None
             else f"no model of {model_id} in the index {reg.index}" if model_id.endswith("/")
                   else f"{model_id} has no releases in the index {reg.index}", err=True)
    for why in sorted({(r.get("model_id") or model_id, r["quarantined"]) for r in rows
                       if r.get("quarantined")}):  # once per model, never stopping the rest
        echo(f"warning: quarantined {why[0]}: {why[1]} (passes nothing until mended)", err=True)
    for r in rows:
        if model_id is None or model_id.endswith("/"):
            echo(f"{r['model_id']}\t{count(r['releases'], 'release')}\tnewest {r['newest']}\t"
                 f"newest passing {r['newest_passing'] or 'none'}")
        else:
            echo(f"{r['version']}\t{r['created_at']}\t{r['dtype']}\t{r['bytes']}\t"
                 f"{'passing' if r['passing'] else 'FAILING'}\t{','.join(r['aliases'])}")


def print_show(doc: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(doc)
        return
    echo(f"{doc['model_id']}@{doc['version']}  {doc['uri']}")
    echo(f"  manifest sha256 {doc['manifest_sha256']}, {count(doc['files'], 'file')}, "
         f"{doc['bytes']} bytes, dtype {doc['dtype']}, created {doc['created_at']}")
    if doc.get("config_dtype"):
        write(f"  config.json dtype {doc['config_dtype']} (what engines load it as)")
    for w in doc.get("weights", []):
        names = ", ".join(w["tensors"][:6]) + (f" and {len(w['tensors']) - 6} more"
                                                if len(w["tensors"]) > 6 else "")
        echo(f"  weights {w['stored']}: {count(len(w['tensors']), 'tensor')}, "
             f"{count(w['parameters'], 'parameter')} ({names})")
    shards = doc.get("weight_files", [])
    if len(shards) > 1:
        echo(f"  weights in {count(len(shards) - 1, 'shard')}, "
             f"{count(doc['parameters'], 'parameter')}:")
        for f in shards:
            echo(f"    {shown(f['path'])}\t{f['bytes']} bytes\t{count(f['tensors'], 'tensor')}")
    for fmt, paths in (doc.get("other_weights") or {}).items():
        echo(f"  other weights ({fmt}, an engine preferring it loads these): "
             + ", ".join(shown(p) for p in paths))
    sig = doc.get("signature")
    if sig is not None:
        state = {True: "verified against the policy's keys",
                 False: "NOT verified by the policy's keys", None: "unverified"}[sig["verified"]]
        who = (f"certificate {sig['subject']!r} ({sig['fingerprint']}, issued by "
               f"{sig['issuer']!r})" if sig.get("kind") == "certificate"
               else f"key {sig['fingerprint']}")
        echo(f"  signed: {sig['path']} by {who} ({state})")
    code = doc.get("code")
    if code is not None:
        from registry.release.code import describe as describe_code

        echo(f"  code: {shown(describe_code(code))}")
    if doc.get("tags"):
        echo("  tags: " + " ".join(f"{k}={v}" for k, v in doc["tags"].items()))
    for g in doc["gates"]:
        echo(f"  {'PASS' if g['passed'] else 'FAIL'} {g['gate']}: {g['reason']}")
    for r in doc["evals"]["results"]:
        echo(f"  eval {r['task']}/{r['metric']} = {r['value']:g} (threshold "
             f"{r['threshold']:g}, n={r['n']})")
    for src in doc["sources"]:
        echo(f"  source {src['source_id']} ({src['license']})"
             + (f" REVOKED: {src['revocation_reason']}" if src["revoked"] else ""))


def _parse(args: list[str]) -> tuple[list[str], dict[str, str], bool] | None:
    """``(positionals, {"store"/"db": value}, --json)`` of a plain line (see
    the module docstring), or None."""
    positional: list[str] = []
    options: dict[str, str] = {}
    as_json = False
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--json" and not as_json:
            as_json = True
        elif arg.split("=", 1)[0] in ("--store", "--db"):
            name, eq, value = arg.partition("=")
            if not eq:
                if i + 1 >= len(args):
                    return None
                i += 1
                value = args[i]
            key = name[2:]
            if key in options or not value:
                return None
            options[key] = value
        elif arg.startswith("-") or not arg:
            return None
        else:
            positional.append(arg)
        i += 1
    return positional, options, as_json


def run(args: list[str]) -> int | None:
    """Answer ``registry ls`` / ``registry show`` (``args``: the line after
    ``registry``) without typer, returning the exit status; None: not a plain
    line (see the module docstring), for typer to answer."""
    if not args or args[0] not in ("ls", "show") or any(os.environ.get(v) for v in _ROOT_ENV):
        return None
    parsed = _parse(args[1:])
    if parsed is None:
        return None
    positional, options, as_json = parsed
    if len(positional) != (1 if args[0] == "show" else len(positional)) or len(positional) > 1:
        return None
    try:
        return _answer(args[0], positional[0] if positional else None, options, as_json)
    except KeyboardInterrupt:  # as typer answers it: the caller says what was interrupted
        from registry.host.interrupt import EXIT_SIGINT

        return EXIT_SIGINT
    except RuntimeError as exc:  # typer's Exit, raised by the error boundary
        if type(exc).__name__ != "Exit" or not isinstance(getattr(exc, "exit_code", None), int):
            raise
        return exc.exit_code  # type: ignore[attr-defined,no-any-return]
    except OSError as exc:  # a closed pipe (`registry ls | head`): exit 1, as typer
        if exc.errno != errno.EPIPE:
            raise
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def _answer(command: str, arg: str | None, options: dict[str, str], as_json: bool) -> int:
    """The command's work once parsed: the root callback's part (the profile,
    no memory:// store), then the command's."""
    from registry.host import config
    from registry.store import refuse_memory_stores

    with error_boundary(as_json):  # as the root callback applies the profile
        cfg = config.load()
        values = config.settings(cfg, cfg.selected(os.environ.get("REGISTRY_PROFILE") or None))
    defaults = {config.PARAMS[k]: v for k, v in values.items() if k in config.PARAMS}
    for key, var in config.ENV_KEYS.items():
        if key in values and not os.environ.get(var):
            os.environ[var] = values[key]
    refuse_memory_stores()
    store = options.get("store") or os.environ.get("REGISTRY_STORE") or defaults.get("store")
    db = options.get("db") or os.environ.get("REGISTRY_DB") or defaults.get("db")
    if command == "show":
        assert arg is not None
        with error_boundary(as_json):
            doc = show_doc(store, db, arg)
        print_show(doc, as_json)
    else:
        with error_boundary(as_json):
            rows, reg = ls_rows(store, db, arg)
        print_ls(rows, arg, reg, as_json)
    return 0


__all__ = ["ls_rows", "print_ls", "print_show", "run", "show_doc"]
