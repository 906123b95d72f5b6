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
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from alembic import command
from alembic.util.exc import CommandError
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from filelock import FileLock
from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.exc import DatabaseError, IntegrityError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from registry.errors import IndexDamagedError, IndexDatabaseError, IndexOutOfDateError
from registry.resources import resource_path

DEFAULT_DB = "sqlite:///registry.db"
T = TypeVar("T")
_RETRIES = 20


def db_url(url: str | None = None) -> str:
    """``url``, else ``$REGISTRY_DB``, else ``sqlite:///registry.db``."""
    return url or os.environ.get("REGISTRY_DB") or DEFAULT_DB


def _alembic_config(connection: Any) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(resource_path("migrations")))
    cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    """The single head of the shipped migrations (more than one is a packaging bug)."""
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


class Index:
    """A connection pool to the index database, with its schema checked.

    Raises:
        IndexDatabaseError: the database cannot be reached.
        IndexDamagedError: the SQLite file is not a database.
        IndexOutOfDateError: the schema is behind; ``registry db upgrade``.
    """

    def __init__(self, url: str | None = None, *, check: bool = True) -> None:
        self.url = db_url(url)
        try:
            self.engine: Engine = create_engine(self.url, future=True, pool_pre_ping=True)
        except (SQLAlchemyError, ImportError, ValueError) as e:
            raise IndexDatabaseError(f"{self.url}: cannot open the index: {e}") from None
        self.is_sqlite = self.engine.dialect.name == "sqlite"
        if self.is_sqlite:
            event.listen(self.engine, "connect", _sqlite_pragmas)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        if check:
            try:
                self._ensure_schema()
            except BaseException:
                self.engine.dispose()
                raise

    def __repr__(self) -> str:
        return f"Index({self.engine.url.render_as_string(hide_password=True)!r})"

    def _lock_path(self) -> str | None:
        db = self.sqlite_path()
        return f"{db}.lock" if db else None

    def current_revision(self) -> str | None:
        with self.engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()

    def _ensure_schema(self) -> None:
        try:
            head = head_revision()
            if self.current_revision() == head:
                return
            # A fresh database is migrated by whoever takes the lock first; the
            # others wait, then find it at head (never half-migrated).
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

    def _migrate(self) -> None:
        try:
            with self.engine.begin() as conn:
                command.upgrade(_alembic_config(conn), "head")
        except DatabaseError as e:
            if not isinstance(e, OperationalError):
                raise self._damaged(e) from None
            raise self._unknown_schema(e) from None
        except (CommandError, SQLAlchemyError) as e:
            raise self._unknown_schema(e) from None

    def _unknown_schema(self, e: Exception) -> IndexDatabaseError:
        return IndexDatabaseError(
            f"{self}: cannot upgrade the index schema ({str(e).splitlines()[0]}); if this "
            "database was not made by this registry, point --db at an empty database and "
            "run `registry index rebuild`")

    def upgrade(self) -> str:
        """Bring the schema to head (idempotent, serialized); returns the head.

        Raises:
            IndexDatabaseError: the database holds a schema the migrations do not
                know (an unknown revision, or tables without a version).
        """
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
    def session(self) -> Iterator[Session]:
        """A session in one transaction: commit on success, rollback on error."""
        with self._sessions() as s:
            try:
                yield s
                s.commit()
            except BaseException:
                s.rollback()
                raise

    def run(self, fn: Callable[[Session], T]) -> T:
        """Run ``fn`` in a transaction, retried while SQLite reports a lock.

        Raises:
            IndexDatabaseError: the database failed (after retries for locks).
        """
        for attempt in range(_RETRIES):
            try:
                with self.session() as s:
                    return fn(s)
            except IntegrityError:
                # Two writers inserted the same model or source row at once:
                # the transaction is replayed and now finds the other's row.
                if attempt < _RETRIES - 1:
                    time.sleep(0.01 * random.uniform(0.5, 1.5))
                    continue
                raise
            except OperationalError as e:
                if "locked" in str(e.orig).lower() and attempt < _RETRIES - 1:
                    time.sleep(min(1.0, 0.02 * 2**attempt) * random.uniform(0.5, 1.5))
                    continue
                raise IndexDatabaseError(f"{self}: {str(e.orig).strip()}") from None
            except DatabaseError as e:
                raise self._damaged(e) from None
            except SQLAlchemyError as e:
                raise IndexDatabaseError(f"{self}: {e}") from None
        raise AssertionError("unreachable")

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
