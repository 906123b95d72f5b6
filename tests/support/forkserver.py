"""A fork server for the suite's child processes: each child is still a process
of its own (its own pid, exit code, environment, working folder, standard
streams, locks and signal handlers, gone when it exits, killable), forked from
a warm parent that has already imported the registry and the libraries it
loads, instead of a new interpreter that imports them again (about 1.2 s of
CPU per CLI call on S3, 2-3 s per child that imports torch; the suite starts
some two thousand such children).

What a forked child does not exercise is a fresh interpreter's import; that
is tested as itself (test_imports starts ``registry`` fresh, test_wheel runs
the installed console script). Children whose memory is measured, or that
depend on a pristine interpreter, keep ``subprocess``.

Protocol, over a Unix socket, one child per connection: the client sends one
JSON line (``mode``: ``cli`` with the ``registry`` argv, or ``python`` with
the arguments after ``python``: ``-c CODE ...``, ``-m MODULE ...`` or
``SCRIPT ...``; the environment, working folder and umask) with the child's
stdin, stdout and stderr as file descriptors (SCM_RIGHTS). The server forks a
monitor, which forks the child and writes back ``{"pid": N}`` when it starts
and ``{"status": S}`` (the exit code, or minus the signal) when it ends. The
server itself never runs a child, so nothing one child does (an import, a
signal handler, an environment variable) reaches the next one.

Run as ``python -m tests.support.forkserver SOCKET [torch]``.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import signal
import socket
import sys

#: Imported once by the server, so that its children find them loaded. Only
#: modules that read no environment at import (a child's own variables are
#: set after the fork): the Hugging Face stack, which reads HF_* at import, is
#: not here. Every module of the registry package is warmed too
#: (:func:`_registry_modules`).
WARM = (
    "typer._adapters", "s3fs", "aiobotocore.session", "botocore.session", "sqlalchemy",
    "psycopg", "numpy", "jsonschema", "jinja2", "filelock", "alembic.command",
    "cryptography.x509", "argparse", "runpy",
)
#: Also warmed by a ``torch`` server (the DCP ranks, the LoongSage savers).
WARM_TORCH = ("torch", "torch.distributed", "torch.distributed.checkpoint")
#: Top-level imports that keep a registry module out of the plain server: torch
#: (the torch server's), and the Hugging Face stack (reads HF_* at import).
_HEAVY = re.compile(r"^(?:import|from) (torch|transformers|huggingface_hub|"
                    r"sentence_transformers)\b", re.M)


def _registry_modules(flavour: str) -> tuple[str, ...]:
    """Every module of the ``registry`` package whose top-level imports the
    server may hold: one importing torch only in the torch server, one
    importing the Hugging Face stack in neither (a CLI call's first lazy import
    of the web stack or of pydantic costs a forked child 0.1-0.5 s)."""
    import pkgutil

    import registry

    names = []
    for info in pkgutil.walk_packages(registry.__path__, "registry."):
        if info.name == "registry.__main__":
            continue
        spec = importlib.util.find_spec(info.name)
        origin = getattr(spec, "origin", None) if spec else None
        try:
            with open(origin or "", encoding="utf-8") as f:
                heavy = {m.group(1) for m in _HEAVY.finditer(f.read())}
        except OSError:
            continue
        if heavy - ({"torch"} if flavour == "torch" else set()):
            continue
        names.append(info.name)
    return tuple(names)


def _warm(names: tuple[str, ...]) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # an optional extra not installed: its children import it themselves


def _warm_s3_models() -> None:
    """Parse botocore's S3 service model and endpoint rules once, into the
    loader every S3 store of the process shares (registry.store.s3session),
    so that a child's first S3 request does not parse them again. No request
    is sent; the loop is closed before the first fork."""
    import asyncio

    from registry.store import s3session

    async def client() -> None:
        async with s3session.new_session().create_client(
                "s3", region_name="us-east-1", endpoint_url="http://127.0.0.1:9",
                aws_access_key_id="warm", aws_secret_access_key="warm"):
            pass

    try:
        asyncio.run(client())
    except Exception:  # noqa: BLE001 - a warm-up only: children parse them themselves
        pass


def _warm_cli() -> None:
    """Build the click command tree of ``registry`` once, every command (typer builds it
    from the annotated functions: about 80 ms, which every forked CLI call
    would otherwise pay again). It reads no environment: option values and
    their ``envvar`` are read when a command line is parsed, in the child."""
    from registry.cli import _command
    from registry.cli.commands import COMMANDS

    root = _command()
    for name in COMMANDS:  # the root builds a command when it first runs: all of them here
        root.get_command(None, name)


def _streams(unbuffered: bool) -> None:
    """sys.std* over fds 0-2, buffered as a new interpreter's are: stdout by
    block (unbuffered with ``-u``), stderr by line."""
    import io

    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)),
                                 encoding="utf-8")
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)),
                                  encoding="utf-8", write_through=unbuffered)
    sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
                                  encoding="utf-8", errors="backslashreplace",
                                  line_buffering=True, write_through=unbuffered)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr


def _main(mode: str, args: list[str]) -> None:
    """Run what the request names, as ``registry ARGS`` or ``python ARGS``
    (``-u`` already applied to the streams) would."""
    import runpy

    if mode == "cli":
        sys.argv = ["registry", *args]
        from registry.cli import main

        main()
        return
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[1:1] = [p for p in extra if p not in sys.path]
    if args[0] == "-c":
        sys.argv = ["-c", *args[2:]]
        sys.path[0] = ""
        exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__",
                                                    "__builtins__": __builtins__})
    elif args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        script = os.path.abspath(args[0])
        sys.argv = [args[0], *args[1:]]
        sys.path[0] = os.path.dirname(script)
        runpy.run_path(script, run_name="__main__")


def _run_child(req: dict, fds: list[int]) -> None:
    """In the forked child: become the process the request describes, run it,
    and exit as the interpreter would (non-daemon threads joined, atexit,
    flushed streams; an uncaught exception printed, exit 1)."""
    import atexit
    import threading

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd, target in zip(fds, (0, 1, 2), strict=True):
        if fd != target:
            os.dup2(fd, target)
    os.closerange(3, 4096)  # as subprocess's close_fds: only 0-2 are the child's
    os.chdir(req["cwd"])
    os.umask(req["umask"])
    os.environ.clear()
    os.environ.update(req["env"])
    args = list(req["args"])
    unbuffered = False
    while req["mode"] == "python" and args and args[0] == "-u":
        unbuffered = True
        args.pop(0)
    _streams(unbuffered)
    code = 0
    try:
        _main(req["mode"], args)
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)  # exit as python does: by SIGINT
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code & 0xFF)


def _monitor(conn: socket.socket) -> None:
    """In the forked monitor: read the request, fork the child, report its pid
    and, when it ends, its status."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    data, fds = b"", []
    while not data.endswith(b"\n"):
        chunk, got, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        if not chunk:
            os._exit(1)
        data += chunk
        fds += got
    req = json.loads(data)
    pid = os.fork()
    if pid == 0:
        conn.close()
        _run_child(req, fds)
    for fd in fds:
        os.close(fd)
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    _, status = os.waitpid(pid, 0)
    try:
        conn.sendall(json.dumps({"status": os.waitstatus_to_exitcode(status)}).encode()
                     + b"\n")
    except OSError:
        pass
    os._exit(0)


def serve(path: str, flavour: str) -> None:
    _warm(WARM + (WARM_TORCH if flavour == "torch" else ()))
    _warm(_registry_modules(flavour))
    held = sorted({"torch", "transformers", "huggingface_hub"} & set(sys.modules)
                  - ({"torch"} if flavour == "torch" else set()))
    if held:  # imported by a warmed module's own imports: its children would inherit it
        raise SystemExit(f"forkserver: warming the registry imported {held}; keep them "
                         "out of the plain server (see _HEAVY)")
    _warm_s3_models()
    _warm_cli()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # monitors are reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # the client stops reading here; fd 1 stays taken
    os.close(null)
    while True:
        conn, _ = listener.accept()
        sys.stderr.flush()
        if os.fork() == 0:
            listener.close()
            _monitor(conn)
        conn.close()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "")
