"""models.release_count: how many releases of the model the index holds,
kept in the transaction that adds or replaces a release
(``registry.index.record.record_release``), so the models list (`registry ls`,
the index page of `registry serve`) reads 100 numbers instead of counting
100k index entries on every request (issue 20: that count was most of the
page's time on Postgres). Existing rows are counted once here.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Idempotent: a SQLite index migrated by a registry before issue 31 (DDL
    # committed statement by statement) may hold the column without the stamp.
    columns = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("models")}
    if "release_count" not in columns:
        op.add_column("models", sa.Column("release_count", sa.Integer, nullable=False,
                                          server_default="0"))
    op.execute("UPDATE models SET release_count = "
               "(SELECT count(*) FROM releases WHERE releases.model_pk = models.id)")


def downgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.drop_column("release_count")
