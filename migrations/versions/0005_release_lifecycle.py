"""The life of a release (issue 32 items 1-3): yanks, tombstones, tags.

Three tables, each derived from objects beside the releases in the store
(``registry.protocol.layout``) and rebuilt from them by ``registry index rebuild``:

* ``yanks``: one row per yanked release (``models/<m>/.yanks/<version>.json``
  says ``"yanked": true``); the ``yanked`` gate joins it.
* ``tombstones``: one row per deleted release (``models/<m>/.tombstones/
  <version>.json``): who, when, why and the manifest digest; it outlives the
  release's own row, so it hangs off ``models``.
* ``release_tags``: the mutable tags of a release (``models/<m>/.tags/
  <version>.json``), indexed by ``(key, value)`` for ``registry query --tag``.

Idempotent (each table is created only when missing); on SQLite the whole
upgrade runs in one transaction (``registry.index.db``).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    tables = set(sa.inspect(op.get_bind()).get_table_names())
    if "yanks" not in tables:
        op.create_table(
            "yanks",
            sa.Column("release_pk", sa.Integer,
                      sa.ForeignKey("releases.id", ondelete="CASCADE"), primary_key=True),
            sa.Column("reason", sa.Text, nullable=False),
            sa.Column("yanked_at", sa.String(32), nullable=False),
            sa.Column("actor", sa.Text, nullable=False),
        )
    if "tombstones" not in tables:
        op.create_table(
            "tombstones",
            sa.Column("model_pk", sa.Integer,
                      sa.ForeignKey("models.id", ondelete="CASCADE"), primary_key=True),
            sa.Column("version", sa.String(128), primary_key=True),
            sa.Column("manifest_sha256", sa.String(64), nullable=False),
            sa.Column("seq", sa.BigInteger),
            sa.Column("deleted_at", sa.String(32), nullable=False),
            sa.Column("reason", sa.Text, nullable=False),
            sa.Column("actor", sa.Text, nullable=False),
        )
    if "release_tags" not in tables:
        op.create_table(
            "release_tags",
            sa.Column("release_pk", sa.Integer,
                      sa.ForeignKey("releases.id", ondelete="CASCADE"), primary_key=True),
            sa.Column("key", sa.String(128), primary_key=True),
            sa.Column("value", sa.String(256), nullable=False),
        )
        op.create_index("ix_release_tags_key_value", "release_tags", ["key", "value"])


def downgrade() -> None:
    op.drop_index("ix_release_tags_key_value", table_name="release_tags")
    op.drop_table("release_tags")
    op.drop_table("tombstones")
    op.drop_table("yanks")
