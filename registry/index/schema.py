"""SQLAlchemy 2 ORM of the index (DESIGN section 6). Derived from the store; rebuildable.

The migrations in ``migrations/versions`` define the same tables on their own
(they never import this module), and a test checks both agree.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


class Base(DeclarativeBase):
    pass


class Model(Base):
    __tablename__ = "models"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[str] = mapped_column(String(128), unique=True)
    #: rows in ``releases`` of this model, kept by ``record_release`` in the
    #: same transaction (the models list reads it instead of counting)
    release_count: Mapped[int] = mapped_column(Integer, server_default="0", default=0)
    releases: Mapped[list[Release]] = relationship(back_populates="model")


class Release(Base):
    """One committed release; the gate facts that do not change are stored
    precomputed (``card_ok``, ``evals_passed``, ``ledger_ok``); revocations are
    joined at query time so a later revocation takes effect at once."""

    __tablename__ = "releases"
    __table_args__ = (UniqueConstraint("model_pk", "version"),
                      Index("ix_releases_model_seq", "model_pk", "seq", "version"))
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_pk: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    version: Mapped[str] = mapped_column(String(128))
    uri: Mapped[str] = mapped_column(Text)
    manifest_sha256: Mapped[str] = mapped_column(String(64))
    bytes: Mapped[int] = mapped_column(BigInteger)
    dtype: Mapped[str] = mapped_column(String(32))
    source_run_id: Mapped[str | None] = mapped_column(String(128))
    source_step: Mapped[int | None] = mapped_column(BigInteger)
    source_uri: Mapped[str | None] = mapped_column(Text)
    source_manifest_sha256: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[str] = mapped_column(String(32))
    #: the model's release order, assigned by the commit (registry.protocol.sequence):
    #: "latest" is the highest, whatever the publishers' clocks said
    seq: Mapped[int] = mapped_column(BigInteger, server_default="0", default=0)
    card_ok: Mapped[bool] = mapped_column(Boolean)
    ledger_ok: Mapped[bool] = mapped_column(Boolean)
    ledger_reason: Mapped[str] = mapped_column(Text)
    evals_passed: Mapped[bool] = mapped_column(Boolean)
    evals_reason: Mapped[str] = mapped_column(Text)
    suite: Mapped[str | None] = mapped_column(String(128))
    suite_version: Mapped[str | None] = mapped_column(String(128))
    model: Mapped[Model] = relationship(back_populates="releases")


class ReleaseFile(Base):
    __tablename__ = "release_files"
    release_pk: Mapped[int] = mapped_column(ForeignKey("releases.id", ondelete="CASCADE"),
                                            primary_key=True)
    path: Mapped[str] = mapped_column(Text, primary_key=True)
    bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))


class LedgerSource(Base):
    __tablename__ = "ledger_sources"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    source_id: Mapped[str] = mapped_column(String(128), unique=True)
    name: Mapped[str] = mapped_column(Text)
    uri: Mapped[str] = mapped_column(Text)
    license: Mapped[str] = mapped_column(Text)


class ReleaseSource(Base):
    __tablename__ = "release_sources"
    __table_args__ = (Index("ix_release_sources_source_release", "source_pk", "release_pk"),)
    release_pk: Mapped[int] = mapped_column(ForeignKey("releases.id", ondelete="CASCADE"),
                                            primary_key=True)
    source_pk: Mapped[int] = mapped_column(ForeignKey("ledger_sources.id"), primary_key=True)
    #: as this release's ledger.json states them (a later release may relicense)
    name: Mapped[str] = mapped_column(Text)
    uri: Mapped[str] = mapped_column(Text)
    license: Mapped[str] = mapped_column(Text)
    allowed_uses: Mapped[str] = mapped_column(String(64))
    revoked_in_file: Mapped[bool] = mapped_column(Boolean)


class Revocation(Base):
    __tablename__ = "revocations"
    source_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    revoked_at: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(Text)


class EvalResult(Base):
    __tablename__ = "eval_results"
    __table_args__ = (Index("ix_eval_results_release_metric", "release_pk", "metric"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    release_pk: Mapped[int] = mapped_column(ForeignKey("releases.id", ondelete="CASCADE"))
    task: Mapped[str] = mapped_column(String(128))
    metric: Mapped[str] = mapped_column(String(128))
    task_metric: Mapped[str] = mapped_column(String(257))
    value: Mapped[float] = mapped_column(Float)
    n: Mapped[int] = mapped_column(BigInteger)
    threshold: Mapped[float] = mapped_column(Float)
    higher_is_better: Mapped[bool] = mapped_column(Boolean)
    passed: Mapped[bool] = mapped_column(Boolean)


class Alias(Base):
    __tablename__ = "aliases"
    model_pk: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"),
                                          primary_key=True)
    alias: Mapped[str] = mapped_column(String(128), primary_key=True)
    version: Mapped[str] = mapped_column(String(128))


class Policy(Base):
    __tablename__ = "policies"
    model_pk: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"),
                                          primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    metric: Mapped[str] = mapped_column(String(257))
    op: Mapped[str] = mapped_column(String(2))
    value: Mapped[float] = mapped_column(Float)


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("run_id", "step"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(String(128))
    step: Mapped[int] = mapped_column(BigInteger)
    uri: Mapped[str] = mapped_column(Text)
    manifest_sha256: Mapped[str] = mapped_column(String(64))
    bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[str] = mapped_column(String(32))


class Yank(Base):
    """A yanked release (``models/<m>/.yanks/<version>.json``, issue 32 item 1):
    it fails the ``yanked`` gate. ``actor`` is the JSON of who yanked it."""

    __tablename__ = "yanks"
    release_pk: Mapped[int] = mapped_column(ForeignKey("releases.id", ondelete="CASCADE"),
                                            primary_key=True)
    reason: Mapped[str] = mapped_column(Text)
    yanked_at: Mapped[str] = mapped_column(String(32))
    actor: Mapped[str] = mapped_column(Text)


class Tombstone(Base):
    """A deleted release (``models/<m>/.tombstones/<version>.json``, issue 32
    item 2): its version name is never reused. Outlives the release's row."""

    __tablename__ = "tombstones"
    model_pk: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"),
                                          primary_key=True)
    version: Mapped[str] = mapped_column(String(128), primary_key=True)
    manifest_sha256: Mapped[str] = mapped_column(String(64))
    seq: Mapped[int | None] = mapped_column(BigInteger)
    deleted_at: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(Text)
    actor: Mapped[str] = mapped_column(Text)


class ReleaseTag(Base):
    """One mutable tag of a release (``models/<m>/.tags/<version>.json``, issue
    32 item 3), indexed by ``(key, value)`` for ``registry query --tag``."""

    __tablename__ = "release_tags"
    __table_args__ = (Index("ix_release_tags_key_value", "key", "value"),)
    release_pk: Mapped[int] = mapped_column(ForeignKey("releases.id", ondelete="CASCADE"),
                                            primary_key=True)
    key: Mapped[str] = mapped_column(String(128), primary_key=True)
    value: Mapped[str] = mapped_column(String(256))


class AliasMove(Base):
    """One recorded move of an alias (``ledger/aliases/<m>/<alias>/``, issue 32
    item 4); ``new`` is None for a removal, ``signed_by`` the signing key's
    fingerprint, ``actor`` the JSON of who moved it."""

    __tablename__ = "alias_moves"
    model_pk: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"),
                                          primary_key=True)
    alias: Mapped[str] = mapped_column(String(128), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    old: Mapped[str | None] = mapped_column(String(128))
    new: Mapped[str | None] = mapped_column(String(128))
    moved_at: Mapped[str] = mapped_column(String(32))
    actor: Mapped[str] = mapped_column(Text)
    signed_by: Mapped[str | None] = mapped_column(String(64))
    entry: Mapped[str] = mapped_column(String(64))
