"""Alias history (issue 32 item 4): one row per recorded move of an alias.

Derived from the alias pointer and the chain of entries under
``ledger/aliases/<m>/<alias>/`` (``registry.refs.alias_history``) and rebuilt
from them by ``registry index rebuild``. ``new`` is null for a removal;
``signed_by`` the fingerprint of the key that signed the move (protected
aliases), null when unsigned; ``actor`` the JSON of who moved it.

Idempotent (the table is created only when missing).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if "alias_moves" in set(sa.inspect(op.get_bind()).get_table_names()):
        return
    op.create_table(
        "alias_moves",
        sa.Column("model_pk", sa.Integer,
                  sa.ForeignKey("models.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("alias", sa.String(128), primary_key=True),
        sa.Column("seq", sa.BigInteger, primary_key=True),
        sa.Column("old", sa.String(128)),
        sa.Column("new", sa.String(128)),
        sa.Column("moved_at", sa.String(32), nullable=False),
        sa.Column("actor", sa.Text, nullable=False),
        sa.Column("signed_by", sa.String(64)),
        sa.Column("entry", sa.String(64), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("alias_moves")
