"""The initial index schema (DESIGN section 6).

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("model_id", sa.String(128), nullable=False, unique=True),
    )
    op.create_table(
        "releases",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("model_pk", sa.Integer, sa.ForeignKey("models.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("version", sa.String(128), nullable=False),
        sa.Column("uri", sa.Text, nullable=False),
        sa.Column("manifest_sha256", sa.String(64), nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("dtype", sa.String(32), nullable=False),
        sa.Column("source_run_id", sa.String(128)),
        sa.Column("source_step", sa.BigInteger),
        sa.Column("source_uri", sa.Text),
        sa.Column("source_manifest_sha256", sa.String(64)),
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.Column("card_ok", sa.Boolean, nullable=False),
        sa.Column("ledger_ok", sa.Boolean, nullable=False),
        sa.Column("ledger_reason", sa.Text, nullable=False),
        sa.Column("evals_passed", sa.Boolean, nullable=False),
        sa.Column("evals_reason", sa.Text, nullable=False),
        sa.Column("suite", sa.String(128)),
        sa.Column("suite_version", sa.String(128)),
        sa.UniqueConstraint("model_pk", "version"),
    )
    op.create_table(
        "release_files",
        sa.Column("release_pk", sa.Integer, sa.ForeignKey("releases.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("path", sa.Text, primary_key=True),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
    )
    op.create_table(
        "ledger_sources",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("source_id", sa.String(128), nullable=False, unique=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("uri", sa.Text, nullable=False),
        sa.Column("license", sa.Text, nullable=False),
    )
    op.create_table(
        "release_sources",
        sa.Column("release_pk", sa.Integer, sa.ForeignKey("releases.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("source_pk", sa.Integer, sa.ForeignKey("ledger_sources.id"),
                  primary_key=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("uri", sa.Text, nullable=False),
        sa.Column("license", sa.Text, nullable=False),
        sa.Column("allowed_uses", sa.String(64), nullable=False),
        sa.Column("revoked_in_file", sa.Boolean, nullable=False),
    )
    op.create_index("ix_release_sources_source", "release_sources", ["source_pk"])
    op.create_table(
        "revocations",
        sa.Column("source_id", sa.String(128), primary_key=True),
        sa.Column("revoked_at", sa.String(32), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
    )
    op.create_table(
        "eval_results",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("release_pk", sa.Integer, sa.ForeignKey("releases.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("task", sa.String(128), nullable=False),
        sa.Column("metric", sa.String(128), nullable=False),
        sa.Column("task_metric", sa.String(257), nullable=False),
        sa.Column("value", sa.Float, nullable=False),
        sa.Column("n", sa.BigInteger, nullable=False),
        sa.Column("threshold", sa.Float, nullable=False),
        sa.Column("higher_is_better", sa.Boolean, nullable=False),
        sa.Column("passed", sa.Boolean, nullable=False),
    )
    op.create_index("ix_eval_results_release_metric", "eval_results", ["release_pk", "metric"])
    op.create_table(
        "aliases",
        sa.Column("model_pk", sa.Integer, sa.ForeignKey("models.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("alias", sa.String(128), primary_key=True),
        sa.Column("version", sa.String(128), nullable=False),
    )
    op.create_table(
        "policies",
        sa.Column("model_pk", sa.Integer, sa.ForeignKey("models.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("position", sa.Integer, primary_key=True),
        sa.Column("metric", sa.String(257), nullable=False),
        sa.Column("op", sa.String(2), nullable=False),
        sa.Column("value", sa.Float, nullable=False),
    )
    op.create_table(
        "checkpoints",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("step", sa.BigInteger, nullable=False),
        sa.Column("uri", sa.Text, nullable=False),
        sa.Column("manifest_sha256", sa.String(64), nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.UniqueConstraint("run_id", "step"),
    )


def downgrade() -> None:
    for table in ("checkpoints", "policies", "aliases", "eval_results", "revocations",
                  "release_sources", "ledger_sources", "release_files", "releases", "models"):
        op.drop_table(table)
