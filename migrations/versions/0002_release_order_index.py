"""An index on releases (model_pk, created_at, version): the order every
listing of a model's releases uses (newest first), so the newest (passing)
version and one page of a model's versions are read from the index instead of
sorting all of the model's releases (`registry serve`, `registry ls`; issue 20);
and one on release_sources (source_pk, release_pk), from which one page of the
releases trained on a source is read without touching the table (it replaces
the index on source_pk alone, its prefix).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Idempotent: a SQLite index migrated by a registry before issue 31 (DDL
    # committed statement by statement) may hold some of these without the stamp.
    inspector = sa.inspect(op.get_bind())
    releases = {i["name"] for i in inspector.get_indexes("releases")}
    sources = {i["name"] for i in inspector.get_indexes("release_sources")}
    if "ix_releases_model_created" not in releases:
        op.create_index("ix_releases_model_created", "releases",
                        ["model_pk", "created_at", "version"])
    if "ix_release_sources_source_release" not in sources:
        op.create_index("ix_release_sources_source_release", "release_sources",
                        ["source_pk", "release_pk"])
    if "ix_release_sources_source" in sources:
        op.drop_index("ix_release_sources_source", table_name="release_sources")


def downgrade() -> None:
    op.create_index("ix_release_sources_source", "release_sources", ["source_pk"])
    op.drop_index("ix_release_sources_source_release", table_name="release_sources")
    op.drop_index("ix_releases_model_created", table_name="releases")
