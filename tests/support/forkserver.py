"""A fork server for the suite's CLI calls: each call is still a process of its
own (its own pid, exit code, environment, working folder, file descriptors,
locks and signal handlers, gone when it exits), forked from a warm parent that
has already imported the CLI and the libraries it loads, instead of a new
interpreter that imports them again (about 1.2 s of CPU per call on S3, some
two thousand calls per run).

What a forked call does not exercise is the import of a fresh interpreter;
that is tested as itself (test_imports starts ``registry`` fresh, test_wheel
runs the installed console script, test_cli_usage's ``--help`` checks run in
a new interpreter). Calls that signal or kill the CLI use their own Popen.

Protocol, over a Unix socket, one call per connection: the client sends one
JSON line (argv, env, cwd, umask, stdout and stderr file paths); the server
forks a monitor, which forks the call and writes back one JSON line
``{"pid": N}`` at its start and ``{"status": S}`` (the exit code, or minus
the signal) at its end. The server itself never runs a call, so nothing one
call does (an import, a signal handler, an environment variable) reaches the
next one.

Run as ``python -m tests.support.forkserver SOCKET``.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys

#: Imported once by the server, so that its calls find them loaded. Only
#: modules that read no environment at import (a call's own variables are set
#: after the fork): the Hugging Face stack, which reads HF_* at import, is not
#: here.
WARM = (
    "registry.cli", "registry.cli.release", "registry.cli.pull", "registry.cli.index",
    "registry.cli.ckpt", "registry.release", "registry.release.model_release",
    "registry.store.s3", "registry.index.db", "registry.schemas",
    "s3fs", "aiobotocore.session", "botocore.session", "sqlalchemy", "psycopg", "numpy",
    "jsonschema", "jinja2", "filelock", "alembic.command", "cryptography.x509",
)


def _warm() -> None:
    import importlib

    for name in WARM:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # an optional extra not installed: its calls import it themselves


def _run_call(req: dict) -> None:
    """In the forked call: become the process the request describes, run the
    CLI's entry point, and exit as the interpreter would (atexit, flushed
    streams)."""
    import atexit
    import io

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.chdir(req["cwd"])
    os.umask(req["umask"])
    os.environ.clear()
    os.environ.update(req["env"])
    fd_in = os.open(os.devnull, os.O_RDONLY)
    fd_out = os.open(req["stdout"], os.O_WRONLY | os.O_TRUNC)
    fd_err = os.open(req["stderr"], os.O_WRONLY | os.O_TRUNC)
    for fd, target in ((fd_in, 0), (fd_out, 1), (fd_err, 2)):
        os.dup2(fd, target)
        os.close(fd)
    enc = "utf-8"
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding=enc)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding=enc,
                                  line_buffering=False, write_through=False)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding=enc,
                                  errors="backslashreplace", line_buffering=True)
    sys.argv = ["registry", *req["argv"]]
    code = 0
    try:
        from registry.cli import main

        main()
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code & 0xFF)


def _monitor(conn: socket.socket) -> None:
    """In the forked monitor: read the request, fork the call, report its pid
    and, when it ends, its status."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    with conn.makefile("rb") as rf:
        req = json.loads(rf.readline())
    pid = os.fork()
    if pid == 0:
        conn.close()
        _run_call(req)
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    try:
        conn.sendall(json.dumps({"status": code}).encode() + b"\n")
    except OSError:
        pass
    os._exit(0)


def serve(path: str) -> None:
    _warm()
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
    serve(sys.argv[1])
