"""The index's rows of alias history (table ``alias_moves``, migration 0006).

The store is the truth (:mod:`registry.refs.alias_history`); these rows follow each
move and are rebuilt from the chains by ``registry index rebuild``.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from registry.refs.alias_history import AliasMove
from registry.index.record import model_pk
from registry.index.schema import AliasMove as AliasMoveRow
from registry.index.schema import Model


def record_move(s: Session, move: AliasMove) -> None:
    """Insert (or replace) the row of one move."""
    doc = move.doc
    mpk = model_pk(s, doc["model_id"])
    s.execute(delete(AliasMoveRow).where(AliasMoveRow.model_pk == mpk,
                                         AliasMoveRow.alias == doc["alias"],
                                         AliasMoveRow.seq == move.seq))
    sig = doc.get("signature") or {}
    s.add(AliasMoveRow(model_pk=mpk, alias=doc["alias"], seq=move.seq, old=doc["old"],
                       new=doc["new"], moved_at=doc["time"],
                       actor=json.dumps(doc["actor"], sort_keys=True),
                       signed_by=sig.get("key"), entry=move.name))


def alias_moves(s: Session, model_id: str, alias: str) -> list[dict[str, Any]]:
    """The indexed moves of an alias, newest first: ``seq, old, new, time,
    actor, signed_by, entry``."""
    rows = s.execute(select(AliasMoveRow).join(Model, Model.id == AliasMoveRow.model_pk)
                     .where(Model.model_id == model_id, AliasMoveRow.alias == alias)
                     .order_by(AliasMoveRow.seq.desc())).scalars()
    return [{"seq": r.seq, "old": r.old, "new": r.new, "time": r.moved_at,
             "actor": json.loads(r.actor), "signed_by": r.signed_by, "entry": r.entry}
            for r in rows]
