"""releases.seq: the store's order of a model's releases (issue 31 item 2).

"Latest" was the newest ``created_at``, a publisher's wall clock: a release
from a host an hour behind sorted as the oldest. A release now records the
sequence its commit took from the model's counter (``registry.protocol.sequence``);
the index keeps it in ``seq`` and every listing orders by it. Releases
indexed before this revision carry none in their manifests: they are
numbered 1..k per model in the order the index had, ``(created_at,
version)``, without touching the store. The listing index on
``(model_pk, created_at, version)`` becomes one on ``(model_pk, seq, version)``.

Every step is idempotent (it checks before it changes), and on SQLite the
whole upgrade runs in one transaction (``registry.index.db``).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    if "seq" not in {c["name"] for c in inspector.get_columns("releases")}:
        op.add_column("releases", sa.Column("seq", sa.BigInteger, nullable=False,
                                            server_default="0"))
    op.execute("UPDATE releases SET seq = ranked.n FROM (SELECT id, ROW_NUMBER() OVER "
               "(PARTITION BY model_pk ORDER BY created_at, version) AS n FROM releases) "
               "AS ranked WHERE ranked.id = releases.id AND releases.seq = 0")
    indexes = {i["name"] for i in inspector.get_indexes("releases")}
    if "ix_releases_model_seq" not in indexes:
        op.create_index("ix_releases_model_seq", "releases", ["model_pk", "seq", "version"])
    if "ix_releases_model_created" in indexes:
        op.drop_index("ix_releases_model_created", table_name="releases")


def downgrade() -> None:
    op.create_index("ix_releases_model_created", "releases",
                    ["model_pk", "created_at", "version"])
    op.drop_index("ix_releases_model_seq", table_name="releases")
    with op.batch_alter_table("releases") as batch:
        batch.drop_column("seq")
