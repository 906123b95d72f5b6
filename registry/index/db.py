"""Connecting to the index: SQLite (embedded default) or Postgres, schema at Alembic head.

``REGISTRY_DB`` (or ``--db``) is a SQLAlchemy URL: ``sqlite:///registry.db``
(the default, in the working directory) or
``postgresql+psycopg://user@host:5432/db``. A new, empty database is brought
to the head revision automatically (under a lock, so concurrent first uses are
safe); a database at an older revision is refused with IndexOutOfDateError
until ``registry db upgrade`` runs.

SQLite runs in WAL mode with a 30 s busy timeout, and every transaction is
retried when SQLite still reports "database is locked", so concurrent CLI
calls do not fail.

A SQLite index that cannot be written (a read-only file, or a file on a
read-only volume: a serving host or a dashboard reading a mounted snapshot)
is opened read-only: ``mode=ro``, plus ``immutable=1`` when its directory
cannot be written either (no ``-wal``/``-shm`` can be created there, so
nobody can be writing it), and no pragma that writes (``journal_mode``,
``synchronous``). Readers answer from it; a write raises
IndexReadOnlyError naming the file.
"""

from __future__ import annotations

import os
import random
import sqlite3
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from filelock import FileLock
from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.exc import (
    DatabaseError,
    DBAPIError,
    IntegrityError,
    OperationalError,
    SQLAlchemyError,
)
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from registry.host.redact import redact
from registry.errors import (
    IndexDamagedError,
    IndexDatabaseError,
    IndexOutOfDateError,
    IndexReadOnlyError,
)
from registry.host.resources import resource_path
from registry.index.lite import DEFAULT_DB, SCHEMA_HEAD, db_url, read_only_mode

T = TypeVar("T")
_RETRIES = 20


def _alembic_config(connection: Any) -> Any:
    from alembic.config import Config  # alembic loads only to migrate or check heads

    cfg = Config()
    cfg.set_main_option("script_location", str(resource_path("migrations")))
    cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    """The single head of the shipped migrations (more than one is a packaging bug)."""
    from alembic.script import ScriptDirectory

    heads = ScriptDirectory.from_config(_alembic_config(None)).get_heads()
    if len(heads) != 1:
        raise IndexDatabaseError(f"migrations have {len(heads)} heads, expected one")
    return heads[0]


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def _sqlite_ro_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA query_only=ON")
    cur.close()


def sqlite_path(url: str) -> str | None:
    """The file of a ``sqlite:///path`` URL (None: not SQLite, or in memory)."""
    if not url.startswith("sqlite"):
        return None
    try:
        from sqlalchemy.engine import make_url
        db = make_url(url).database
    except Exception:  # noqa: BLE001 - create_engine reports a bad URL
        return None
    return db if db and db != ":memory:" and not db.startswith("file:") else None


class Index:
    """A connection pool to the index database, with its schema checked.

    A SQLite file that cannot be written is opened read-only (see the module
    docstring; ``read_only`` is then ``"ro"`` or ``"immutable"``).

    Raises:
        IndexDatabaseError: the database cannot be reached.
        IndexDamagedError: the SQLite file is not a database.
        IndexOutOfDateError: the schema is behind; ``registry db upgrade``.
    """

    def __init__(self, url: str | None = None, *, check: bool = True) -> None:
        self.url = db_url(url)
        self.path = sqlite_path(self.url)
        self.read_only = read_only_mode(self.path) if self.path else None
        try:
            if self.read_only:
                self.engine: Engine = create_engine("sqlite://", future=True,
                                                    creator=self._ro_connect)
            else:
                # no pool_pre_ping: it is one more round trip per checkout (a page
                # of `registry serve` would pay it on every request); a pooled
                # connection the server dropped is retried once instead (run, read)
                self.engine = create_engine(self.url, future=True)
        except (SQLAlchemyError, ImportError, ValueError) as e:
            raise IndexDatabaseError(redact(f"{self.url}: cannot open the index: {e}")) from None
        self.is_sqlite = self.engine.dialect.name == "sqlite"
        if self.is_sqlite:
            event.listen(self.engine, "connect",
                         _sqlite_ro_pragmas if self.read_only else _sqlite_pragmas)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        # Reads need no transaction: on Postgres (READ COMMITTED) every statement
        # takes its own snapshot anyway, and BEGIN and COMMIT would be two more
        # round trips. SQLite's driver begins no transaction for a SELECT either.
        self._readers = sessionmaker(
            self.engine.execution_options(isolation_level="AUTOCOMMIT")
            if self.engine.dialect.name == "postgresql" else self.engine,
            expire_on_commit=False)
        self._pid = os.getpid()
        if check:
            try:
                self._ensure_schema()
            except BaseException:
                self.engine.dispose()
                raise

    def _ro_connect(self) -> sqlite3.Connection:
        assert self.path is not None
        query = "mode=ro&immutable=1" if self.read_only == "immutable" else "mode=ro"
        uri = f"file:{urllib.parse.quote(os.path.abspath(self.path))}?{query}"
        return sqlite3.connect(uri, uri=True, check_same_thread=False, timeout=30)

    def __str__(self) -> str:
        """The database URL, its password hidden: what messages name."""
        return self.engine.url.render_as_string(hide_password=True)

    def __repr__(self) -> str:
        return f"Index({str(self)!r})"

    def _lock_path(self) -> str | None:
        db = self.sqlite_path()
        return f"{db}.lock" if db else None

    def current_revision(self) -> str | None:
        """The schema revision the database is stamped with (alembic's
        ``alembic_version`` table), None when it has none.

        Raises:
            IndexDatabaseError: more than one revision is stamped.
        """
        with self.engine.connect() as conn:
            if not inspect(conn).has_table("alembic_version"):
                return None
            stamped = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
        if len(stamped) > 1:
            raise IndexDatabaseError(f"{self}: the index is stamped with {len(stamped)} schema "
                                     f"revisions ({', '.join(sorted(stamped))}), expected one")
        return stamped[0] if stamped else None

    def _ensure_schema(self) -> None:
        try:
            if self.current_revision() == SCHEMA_HEAD:
                return
            head = head_revision()
            if self.current_revision() == head:
                return
            # A fresh database is migrated by whoever takes the lock first; the
            # others wait, then find it at head (never half-migrated).
            if self.read_only:
                current = self.current_revision()
                raise IndexOutOfDateError(
                    f"{self.path}: index schema at revision {current or 'none'}, this "
                    f"registry needs {head}, and the index is read-only (a read-only "
                    "file or volume): upgrade a writable copy with `registry db upgrade`")
            with self._schema_lock():
                current = self.current_revision()
                if current == head:
                    return
                if current is None:
                    with self.engine.connect() as conn:
                        empty = not inspect(conn).get_table_names()
                    if empty:
                        self._migrate()
                        return
            raise IndexOutOfDateError(
                f"{self}: index schema at revision {current or 'none'}, this registry needs "
                f"{head}: run `registry db upgrade`")
        except OperationalError as e:
            self._refuse_read_only(e)
            raise IndexDatabaseError(f"{self}: cannot reach the index: "
                                     f"{str(e.orig).strip()}") from None
        except DatabaseError as e:
            raise self._damaged(e) from None

    def sqlite_path(self) -> str | None:
        """The SQLite database file, or None (Postgres, in-memory SQLite)."""
        db = self.engine.url.database
        return db if self.is_sqlite and db and db != ":memory:" else None

    def _damaged(self, e: DatabaseError) -> IndexDatabaseError:
        """SQLite says the file is no database ("file is not a database",
        "database disk image is malformed"): name the file and the repair."""
        path = self.sqlite_path()
        reason = str(e.orig).strip()
        if path is None:
            return IndexDatabaseError(f"{self}: {reason}")
        return IndexDamagedError(f"{path}: not a usable SQLite index ({reason}); "
                                 "`registry index rebuild` moves it aside and rebuilds it "
                                 "from the store", path=path)

    def move_aside(self) -> str:
        """Rename a damaged SQLite file (and its -wal/-shm) to
        ``<file>.damaged-<UTC time>``; returns its absolute path. The store is the
        truth, so nothing is lost: the caller rebuilds the index from it.

        Raises:
            IndexDatabaseError: not a SQLite file index.
        """
        path = self.sqlite_path()
        if path is None:
            raise IndexDatabaseError(f"{self}: only a SQLite file can be moved aside")
        self.engine.dispose()
        aside = f"{path}.damaged-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
        for suffix in ("-wal", "-shm", ""):
            if os.path.exists(path + suffix):
                os.replace(path + suffix, aside + suffix)
        return os.path.abspath(aside)

    def _schema_lock(self) -> Any:
        lock = self._lock_path()
        return FileLock(lock) if lock else _advisory_lock(self.engine)

    def _migration_engine(self) -> Engine:
        """The engine migrations run on: this one on Postgres (transactional
        DDL); on SQLite one whose driver leaves transactions to SQLAlchemy,
        which opens each with ``BEGIN IMMEDIATE``. pysqlite's own transaction
        handling commits before every DDL statement (CREATE, ALTER, DROP), so
        a migration killed between two of them left a half-applied schema
        that no upgrade could finish ("duplicate column"). Foreign keys are off
        while migrating (SQLite's advice for schema changes: a batch table
        copy drops the old table, which would otherwise cascade)."""
        if not self.is_sqlite:
            return self.engine
        engine = create_engine(self.url, future=True, poolclass=NullPool)

        def connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None  # no implicit BEGIN/COMMIT by the driver
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=OFF")
            cur.close()

        def begin(conn: Any) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        event.listen(engine, "connect", connect)
        event.listen(engine, "begin", begin)
        return engine

    def _migrate(self) -> None:
        """Every pending migration and the version stamp in one transaction:
        a migration killed anywhere leaves the schema at the old revision or
        the new one, never between (issue 31 item 4)."""
        from alembic import command
        from alembic.util.exc import CommandError

        engine = self._migration_engine()
        try:
            with engine.begin() as conn:
                command.upgrade(_alembic_config(conn), "head")
        except DatabaseError as e:
            if not isinstance(e, OperationalError):
                raise self._damaged(e) from None
            raise self._unknown_schema(e) from None
        except (CommandError, SQLAlchemyError) as e:
            raise self._unknown_schema(e) from None
        finally:
            if engine is not self.engine:
                engine.dispose()

    def _unknown_schema(self, e: Exception) -> IndexDatabaseError:
        """The repair depends on the engine: a SQLite file is moved aside by
        ``index rebuild``; a Postgres database must be emptied by its owner."""
        why = str(e).splitlines()[0]
        if self.sqlite_path():
            return IndexDatabaseError(
                f"{self}: cannot upgrade the index schema ({why}); the index is derived from "
                f"the store: `registry index rebuild --db {self.url}` moves this file aside "
                "and rebuilds it")
        return IndexDatabaseError(
            f"{self}: cannot upgrade the index schema ({why}); if this database was not made "
            "by this registry, point --db at an empty database and run `registry index "
            "rebuild`")

    def upgrade(self) -> str:
        """Bring the schema to head (idempotent, serialized); returns the head.

        Raises:
            IndexDatabaseError: the database holds a schema the migrations do not
                know (an unknown revision, or tables without a version).
            IndexReadOnlyError: the SQLite file (or its volume) is read-only.
        """
        if self.read_only:
            raise IndexReadOnlyError(
                f"{self.path}: the index is read-only (a read-only file or volume); "
                "cannot upgrade its schema", path=self.path or "")
        try:
            with self._schema_lock():
                self._migrate()
        except OperationalError as e:
            raise IndexDatabaseError(f"{self}: cannot reach the index: "
                                     f"{str(e.orig).strip()}") from None
        except DatabaseError as e:
            raise self._damaged(e) from None
        return head_revision()

    @contextmanager
    def session(self, *, read_only: bool = False) -> Iterator[Session]:
        """A session in one transaction: commit on success, rollback on error.
        ``read_only``: no transaction on Postgres (each statement autocommits;
        see :meth:`read`)."""
        if self._pid != os.getpid():
            # A forked child must not use the parent's pooled connections
            # (SQLAlchemy's advice): it drops them without closing them.
            self.engine.dispose(close=False)
            self._pid = os.getpid()
        with (self._readers if read_only else self._sessions)() as s:
            try:
                yield s
                s.commit()
            except BaseException:
                s.rollback()
                raise

    def run(self, fn: Callable[[Session], T], *, read_only: bool = False) -> T:
        """Run ``fn`` in a transaction, retried while SQLite reports a lock,
        and once when a pooled connection turns out to have been closed by the
        server (a Postgres restart; every write of the index is idempotent, so
        the replay is safe).

        Raises:
            IndexReadOnlyError: ``fn`` wrote to a read-only SQLite index.
            IndexDatabaseError: the database failed (after retries for locks).
        """
        reconnected = False
        for attempt in range(_RETRIES):
            try:
                with self.session(read_only=read_only) as s:
                    return fn(s)
            except DBAPIError as e:
                if e.connection_invalidated and not reconnected:
                    reconnected = True  # the pool has dropped its stale connections
                    continue
                if isinstance(e, IntegrityError):
                    # Two writers inserted the same model or source row at once:
                    # the transaction is replayed and now finds the other's row.
                    if attempt < _RETRIES - 1:
                        time.sleep(0.01 * random.uniform(0.5, 1.5))
                        continue
                    raise
                if isinstance(e, OperationalError):
                    self._refuse_read_only(e)
                    if "locked" in str(e.orig).lower() and attempt < _RETRIES - 1:
                        time.sleep(min(1.0, 0.02 * 2**attempt) * random.uniform(0.5, 1.5))
                        continue
                    raise IndexDatabaseError(f"{self}: {str(e.orig).strip()}") from None
                if isinstance(e, DatabaseError):
                    raise self._damaged(e) from None
                raise IndexDatabaseError(f"{self}: {e}") from None
            except SQLAlchemyError as e:
                raise IndexDatabaseError(f"{self}: {e}") from None
        raise AssertionError("unreachable")

    def read(self, fn: Callable[[Session], T]) -> T:
        """:meth:`run` for an ``fn`` that only reads: on Postgres without a
        transaction (no BEGIN and COMMIT round trips; under READ COMMITTED
        each statement sees what was committed when it starts, as it would
        inside one). :class:`registry.api.Registry` and ``registry serve`` run
        every query of :mod:`registry.index.queries` this way.

        Raises:
            IndexDatabaseError: the database failed.
        """
        return self.run(fn, read_only=True)

    def _refuse_read_only(self, e: OperationalError) -> None:
        """A write refused by SQLite because the index is read-only becomes
        IndexReadOnlyError naming the file."""
        msg = str(e.orig).lower()
        if self.path and ("readonly" in msg or "read-only" in msg or "query_only" in msg
                          or (self.read_only and "unable to open" in msg)):
            raise IndexReadOnlyError(
                f"{self.path}: the index is read-only (a read-only file or volume); "
                "reading works, writing needs a writable index (--db)", path=self.path) from None

    def close(self) -> None:
        self.engine.dispose()


@contextmanager
def _advisory_lock(engine: Engine) -> Iterator[None]:
    """Serialize schema upgrades on Postgres (pg_advisory_lock)."""
    if engine.dialect.name != "postgresql":
        yield
        return
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_advisory_lock(748213)"))
        try:
            yield
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(748213)"))
            conn.commit()
