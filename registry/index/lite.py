"""Reading a SQLite index with the standard library's ``sqlite3``: what a
read-only command line call (``registry ls``, ``registry show``) asks, without
loading SQLAlchemy (its ORM and the index schema cost most of a second's start
on a loaded machine; issue 44 item 6).

:func:`open_lite` answers only for the common case: a ``sqlite:///FILE`` URL
(no query string) whose file exists and is stamped at :data:`SCHEMA_HEAD`.
Anything else (Postgres, a missing, damaged, older or newer index) is None,
and the caller takes the full path (:class:`registry.index.db.Index`), which
creates, migrates, refuses or reports as it always has. Each query here says
the same as the one of :mod:`registry.index.queries` it mirrors (the same
rows, types and order; tests/test_index_lite.py compares them), and answers
None where that one would raise (an unknown model, a release not in the
index), so errors keep their one wording.

The file is opened read-only (``mode=ro``; ``immutable=1`` where
:func:`read_only_mode` says so), with SQLite's 30 s busy timeout.

Also holds what :mod:`registry.index.db` shares with it and needs no
SQLAlchemy: :data:`DEFAULT_DB`, :func:`db_url`, :data:`SCHEMA_HEAD`,
:func:`read_only_mode`, and the gates of a release row (:func:`release_gates_of`).
"""

from __future__ import annotations

import json
import os
import sqlite3
import urllib.parse
from collections.abc import Iterable, Sequence
from typing import Any

from registry.gating.gates import GateResult, Threshold

DEFAULT_DB = "sqlite:///registry.db"

#: the revision of the newest shipped migration. An index already there is
#: opened without loading alembic (a third of a second of every command line
#: call); any other revision goes the full way, through alembic's own head.
#: tests/test_index.py keeps this equal to alembic's head.
SCHEMA_HEAD = "0006"


def db_url(url: str | None = None) -> str:
    """``url``, else ``$REGISTRY_DB``, else ``sqlite:///registry.db``."""
    return url or os.environ.get("REGISTRY_DB") or DEFAULT_DB


def read_only_mode(path: str) -> str | None:
    """How a SQLite file must be opened: None (read-write), ``"ro"`` (the file
    cannot be written), ``"immutable"`` (neither can its directory: a
    read-only volume or folder, where no ``-wal``/``-shm`` can be made)."""
    if not os.path.exists(path):
        return None
    folder = os.path.dirname(os.path.abspath(path)) or "."
    if not os.access(folder, os.W_OK):
        # A snapshot may hold committed pages still in its -wal file, which an
        # immutable open would not read: then read it as WAL, read-only.
        wal = f"{path}-wal"
        return "ro" if os.path.exists(wal) and os.path.getsize(wal) else "immutable"
    if not os.access(path, os.W_OK):
        return "ro"
    return None


def gates_of(rel: Any, revoked: list[tuple[str, str]], evals: list[tuple[str, str, float]],
             policy: list[Threshold], yank: tuple[str, str] | None = None) -> list[GateResult]:
    """The gates of one release row (attributes ``card_ok``, ``ledger_ok``,
    ``ledger_reason``, ``evals_passed``, ``evals_reason``), given its live
    revocations ``(source_id, reason)``, eval results ``(task, metric,
    value)``, its model's policy and its yank ``(reason, at)``."""
    card_ok = bool(rel.card_ok)
    card = GateResult("model_card", card_ok, "MODEL_CARD.md present" if card_ok
                      else "MODEL_CARD.md is missing or empty")
    if rel.ledger_ok and revoked:
        ledger = GateResult("ledger", False, "; ".join(
            f"source {sid} is revoked in the live ledger ({why})" for sid, why in revoked))
    else:
        ledger = GateResult("ledger", bool(rel.ledger_ok), rel.ledger_reason)
    results = [card, ledger, GateResult("evals", bool(rel.evals_passed), rel.evals_reason)]
    for t in policy:
        values = [v for task, metric, v in evals if t.metric in (metric, f"{task}/{metric}")]
        name = f"policy:{t}"
        if not values:
            results.append(GateResult(name, False, f"metric {t.metric} not in the eval summary"))
            continue
        bad = [v for v in values if not (v >= t.value if t.op == ">=" else v <= t.value)]
        results.append(GateResult(name, not bad, f"{t.metric}={bad[0]:g}, required {t.op} "
                                  f"{t.value:g}" if bad else
                                  f"{t.metric}={values[0]:g} {t.op} {t.value:g}"))
    if yank is not None:  # listed only when yanked, as registry.lifecycle.yank.yank_gate
        results.append(GateResult("yanked", False, f"yanked at {yank[1]}: {yank[0]}"))
    return results


#: a release passes the gates the index holds: the stored facts, no live
#: revocation of its sources, not yanked, and every threshold of its model's
#: policy met (queries.passing and queries._models_summary say the same)
_PASSES = """
 r.card_ok AND r.ledger_ok AND r.evals_passed
 AND NOT EXISTS (SELECT 1 FROM release_sources rs JOIN ledger_sources ls ON rs.source_pk = ls.id
                 JOIN revocations v ON v.source_id = ls.source_id WHERE rs.release_pk = r.id)
 AND NOT EXISTS (SELECT 1 FROM yanks y WHERE y.release_pk = r.id)
 AND NOT EXISTS (
   SELECT 1 FROM policies p WHERE p.model_pk = r.model_pk AND (
     NOT EXISTS (SELECT 1 FROM eval_results e WHERE e.release_pk = r.id
                 AND (e.metric = p.metric OR e.task_metric = p.metric))
     OR EXISTS (SELECT 1 FROM eval_results e WHERE e.release_pk = r.id
                AND (e.metric = p.metric OR e.task_metric = p.metric)
                AND NOT (CASE WHEN p.op = '>=' THEN e.value >= p.value
                              ELSE e.value <= p.value END))))
"""


class _Row:
    """A row whose columns are attributes (as SQLAlchemy's rows)."""

    def __init__(self, cursor: sqlite3.Cursor, values: Sequence[Any]) -> None:
        for (name, *_), value in zip(cursor.description, values):
            setattr(self, name, value)


class LiteIndex:
    """A SQLite index at :data:`SCHEMA_HEAD`, read with ``sqlite3``
    (:func:`open_lite` makes one)."""

    def __init__(self, url: str, path: str, conn: sqlite3.Connection) -> None:
        self.url, self.path, self._conn = url, path, conn

    def __str__(self) -> str:
        return self.url

    def close(self) -> None:
        self._conn.close()

    def _all(self, sql: str, args: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
        return self._conn.execute(sql, tuple(args)).fetchall()

    def _pk(self, model_id: str) -> int | None:
        row = self._all("SELECT id FROM models WHERE model_id = ?", [model_id])
        return row[0][0] if row else None

    def model_ids(self) -> list[str]:
        """Every model id in the index, sorted."""
        return [m for m, in self._all("SELECT model_id FROM models ORDER BY model_id")]

    def _policy(self, pk: int) -> list[Threshold]:
        return [Threshold(m, op, v) for m, op, v in self._all(
            "SELECT metric, op, value FROM policies WHERE model_pk = ? ORDER BY position", [pk])]

    def ls(self, model_id: str | None = None) -> list[dict[str, Any]] | None:
        """:func:`registry.index.queries.ls`; None for a model the index lacks."""
        if model_id is None:
            newest = ("(SELECT r.version FROM releases r WHERE r.model_pk = m.id{} "
                      "ORDER BY r.seq DESC, r.version DESC LIMIT 1)")
            summary = self._all(f"SELECT m.model_id, m.release_count, {newest.format('')}, "
                                f"{newest.format(' AND ' + _PASSES)} FROM models m "
                                "ORDER BY m.model_id")
            by_model: dict[str, list[str]] = {}
            for m, alias in self._all("SELECT m.model_id, a.alias FROM models m JOIN aliases a "
                                      "ON a.model_pk = m.id ORDER BY a.alias"):
                by_model.setdefault(m, []).append(alias)
            return [{"model_id": m, "releases": n, "newest": newest_version,
                     "newest_passing": newest_ok, "aliases": by_model.get(m, [])}
                    for m, n, newest_version, newest_ok in summary]
        pk = self._pk(model_id)
        if pk is None:
            return None
        ok = {v for v, in self._all(f"SELECT r.version FROM releases r WHERE r.model_pk = ? "
                                    f"AND {_PASSES}", [pk])}
        aliases: dict[str, list[str]] = {}
        for alias, version in self._all("SELECT alias, version FROM aliases WHERE model_pk = ?",
                                        [pk]):
            aliases.setdefault(version, []).append(alias)
        rows = self._all("SELECT id, version, created_at, dtype, bytes, manifest_sha256 "
                         "FROM releases WHERE model_pk = ? ORDER BY seq DESC, version DESC", [pk])
        tags: dict[int, dict[str, str]] = {}
        yanked: set[int] = set()
        if rows:
            marks = ",".join("?" * len(rows))
            pks = [r[0] for r in rows]
            for rpk, k, v in self._all("SELECT release_pk, key, value FROM release_tags "
                                       f"WHERE release_pk IN ({marks}) ORDER BY key", pks):
                tags.setdefault(rpk, {})[k] = v
            yanked = {y for y, in self._all(
                f"SELECT release_pk FROM yanks WHERE release_pk IN ({marks})", pks)}
        return [{"version": v, "created_at": at, "dtype": dtype, "bytes": size,
                 "manifest_sha256": sha, "passing": v in ok,
                 "aliases": sorted(aliases.get(v, [])), "tags": tags.get(rpk, {}),
                 "yanked": rpk in yanked}
                for rpk, v, at, dtype, size, sha in rows]

    def show(self, model_id: str, version: str) -> dict[str, Any] | None:
        """:func:`registry.index.queries.show`; None for a release the index lacks."""
        cur = self._conn.execute(
            "SELECT r.*, y.reason AS yank_reason, y.yanked_at AS yank_at, y.actor AS yank_actor "
            "FROM releases r JOIN models m ON r.model_pk = m.id "
            "LEFT JOIN yanks y ON y.release_pk = r.id "
            "WHERE m.model_id = ? AND r.version = ?", (model_id, version))
        found = cur.fetchone()
        if found is None:
            return None
        rel = _Row(cur, found)
        files = self._all("SELECT path, bytes, sha256 FROM release_files WHERE release_pk = ? "
                          "ORDER BY path", [rel.id])
        sources = self._all(
            "SELECT ls.source_id, rs.name, rs.license, rs.uri, rs.allowed_uses, v.reason "
            "FROM ledger_sources ls JOIN release_sources rs ON rs.source_pk = ls.id "
            "LEFT JOIN revocations v ON v.source_id = ls.source_id "
            "WHERE rs.release_pk = ? ORDER BY ls.source_id", [rel.id])
        evals = self._all("SELECT task, metric, value, n, threshold, higher_is_better, passed "
                          "FROM eval_results WHERE release_pk = ? ORDER BY id", [rel.id])
        aliases = [a for a, in self._all("SELECT alias FROM aliases WHERE model_pk = ? AND "
                                         "version = ? ORDER BY alias", [rel.model_pk, version])]
        tags = dict(self._all("SELECT key, value FROM release_tags WHERE release_pk = ? "
                              "ORDER BY key", [rel.id]))
        gates = gates_of(rel, [(s[0], s[5]) for s in sources if s[5] is not None],
                         [(e[0], e[1], e[2]) for e in evals], self._policy(rel.model_pk),
                         (rel.yank_reason, rel.yank_at) if rel.yank_at is not None else None)
        return {
            "model_id": model_id, "version": version, "uri": rel.uri,
            "manifest_sha256": rel.manifest_sha256, "bytes": rel.bytes, "files": len(files),
            "dtype": rel.dtype, "created_at": rel.created_at, "aliases": aliases,
            "tags": tags,
            "yanked": ({"reason": rel.yank_reason, "at": rel.yank_at,
                        "actor": json.loads(rel.yank_actor)} if rel.yank_at is not None
                       else None),
            "source": {"run_id": rel.source_run_id, "step": rel.source_step,
                       "uri": rel.source_uri, "manifest_sha256": rel.source_manifest_sha256},
            "passed": all(g.passed for g in gates), "gates": [g.to_dict() for g in gates],
            "evals": {"suite": rel.suite, "suite_version": rel.suite_version,
                      "results": [{"task": t, "metric": m, "value": v, "n": n,
                                   "threshold": th, "higher_is_better": bool(hib),
                                   "passed": bool(ok)}
                                  for t, m, v, n, th, hib, ok in
                                  sorted(evals, key=lambda e: (e[0], e[1]))]},
            "sources": [{"source_id": sid, "name": name, "license": lic, "uri": uri,
                         "allowed_uses": uses.split(",") if uses else [],
                         "revoked": why is not None, "revocation_reason": why}
                        for sid, name, lic, uri, uses, why in sources],
            "manifest": [{"path": p, "bytes": b, "sha256": h} for p, b, h in files],
        }


def sqlite_file(url: str) -> str | None:
    """The file of a plain ``sqlite:///FILE`` URL; None for any other URL
    (Postgres, in memory, a query string or a ``file:`` URI: the full path)."""
    if not url.startswith("sqlite:///") or "?" in url or "#" in url:
        return None
    path = urllib.parse.unquote(url[len("sqlite:///"):])
    return path if path and path != ":memory:" and not path.startswith("file:") else None


def open_lite(url: str | None = None) -> LiteIndex | None:
    """The index at ``url`` (:func:`db_url`'s default) read with ``sqlite3``,
    or None when the full path must answer (see the module docstring)."""
    url = db_url(url)
    path = sqlite_file(url)
    if path is None or not os.path.isfile(path):
        return None
    mode = read_only_mode(path)
    query = "mode=ro&immutable=1" if mode == "immutable" else "mode=ro"
    try:
        conn = sqlite3.connect(f"file:{urllib.parse.quote(os.path.abspath(path))}?{query}",
                               uri=True, timeout=30)
    except sqlite3.Error:
        return None
    try:
        stamped = conn.execute("SELECT version_num FROM alembic_version").fetchall()
    except sqlite3.Error:  # no table, not a database, locked past the timeout...
        conn.close()
        return None
    if stamped != [(SCHEMA_HEAD,)]:
        conn.close()
        return None
    return LiteIndex(url, path, conn)


__all__ = ["DEFAULT_DB", "SCHEMA_HEAD", "LiteIndex", "db_url", "gates_of", "open_lite",
           "read_only_mode", "sqlite_file"]
