"""Store layout: one function per shape of key the registry writes (DESIGN section 1).

Every module that names a key in the store asks this module, so pull, release,
index, gc, checkpoint and the web pages share one spelling without importing
each other. It imports nothing but the naming rule and ``join``::

    runs/<run_id>/ckpt/                         run_root(run_id)
    runs/<run_id>/ckpt/step-<nnnnnn>/           step_prefix(run_id, step)
    runs/<run_id>/ckpt/LATEST                   latest_key(run_id)
    models/<model_id>/                          model_root(model_id)
    models/<org>@<name>/                        model_root("<org>/<name>") (names.model_key)
    models/<model_id>/<version>/                release_prefix(model_id, version)
    models/<model_id>/refs/<alias>              alias_key(model_id, alias)
    models/<model_id>/policy.json               policy_key(model_id)
    ledger/revocations/<source_id>.json         revocation_key(source_id)
    ledger/aliases/<model_id>/<alias>/          alias_history_prefix(model_id, alias)
    ledger/aliases/<m>/<a>/<seq>-<digest>.json  alias_entry_key(model_id, alias, seq, digest)
    events/<seq>.json                           event_key(seq) (issue 32: the event log)
    ledger/yanks/<model_id>/<version>.json      yank_key(model_id, version) (issue 32 item 1)
    ledger/tombstones/<model_id>/<version>.json tombstone_key(model_id, version) (item 2)
    ledger/tags/<model_id>/<version>.json       tags_key(model_id, version) (item 3)
    ledger/snapshots/<model_id>/<n>.snapshot.json  snapshot_key(model_id, n) (issue 50)
    ledger/snapshots/<model_id>/timestamp.json     timestamp_key(model_id)
    <prefix>.claim                              claim_key(prefix)
    <prefix>.tmp-<tag>                          staging_prefix(prefix, tag)

The LoongSage tree (seed 003, ``train_step_<N>/`` under a checkpoint path the
user names) and the step-name rules of both trees are in
:mod:`registry.checkpoint.layout`, which takes its tinyllm names from here.

Functions that take names check them (:func:`registry.rules.names.check_name`) and
raise :class:`registry.errors.InvalidNameError` for one that breaks the rule;
a namespaced id ``<org>/<name>`` is one key level, ``<org>@<name>``
(:func:`registry.rules.names.model_key`; ``@`` never occurs in a name), so every
shape above holds for it unchanged and a listing of ``models/`` or a ledger
folder reads it back with :func:`registry.rules.names.model_from_key`;
the ``*_ROOT`` constants and the claim/staging helpers take keys already built.
"""

from __future__ import annotations

import re

from registry.rules.names import check_name, model_key
from registry.store.base import join

RUNS = "runs"
MODELS = "models"
LEDGER = "ledger"
EVENTS = "events"
#: an event's temporary file while a local append writes it (``events/.tmp-<id>``).
EVENTS_TMP_PREFIX = ".tmp-"
REFS = "refs"
REVOCATIONS = "ledger/revocations"
ALIAS_HISTORY = "ledger/aliases"
YANKS = "ledger/yanks"
TOMBSTONES = "ledger/tombstones"
TAGS = "ledger/tags"
SNAPSHOTS = "ledger/snapshots"
#: digits of an event's sequence number in its key (``events/000000000042.json``).
EVENT_DIGITS = 12
#: digits of an alias move's sequence number in its history entry's key.
ALIAS_SEQ_DIGITS = 8
POLICY = "policy.json"
LATEST = "LATEST"
#: ``str.format`` pattern of a tinyllm step directory (seed 000: six digits at least).
STEP_DIR_FORMAT = "step-{step:06d}"
CLAIM_SUFFIX = ".claim"
TMP_MARK = ".tmp"


# -- runs/ ------------------------------------------------------------------

def run_root(run_id: str) -> str:
    """Key of a tinyllm run's checkpoint tree: ``runs/<run_id>/ckpt``.

    ``run_id`` is not checked here (callers that take it from a user check it;
    ``index rebuild`` lists what the store holds)."""
    return join(RUNS, run_id, "ckpt")


def step_prefix(run_id: str, step: int) -> str:
    """Key of a tinyllm step directory: ``runs/<run_id>/ckpt/step-<nnnnnn>``.

    Raises:
        ValueError: ``step`` is negative.
    """
    if step < 0:
        raise ValueError(f"step {step}: a step is a number >= 0")
    return join(run_root(run_id), STEP_DIR_FORMAT.format(step=step))


def latest_key(run_id: str) -> str:
    """Key of a tinyllm run's pointer: ``runs/<run_id>/ckpt/LATEST``."""
    return join(run_root(run_id), LATEST)


# -- models/ ----------------------------------------------------------------

def model_root(model_id: str) -> str:
    """Key of everything one model holds: ``models/<model_id>``."""
    return join(MODELS, model_key(model_id))


def release_prefix(model_id: str, version: str) -> str:
    """Key of a release directory: ``models/<model_id>/<version>``."""
    return join(model_root(model_id), check_name(version, "version"))


def refs_prefix(model_id: str) -> str:
    """Key of a model's alias folder: ``models/<model_id>/refs``."""
    return join(model_root(model_id), REFS)


def alias_key(model_id: str, alias: str) -> str:
    """Key of an alias pointer: ``models/<model_id>/refs/<alias>`` (holds ``"<version>\\n"``)."""
    return join(refs_prefix(model_id), check_name(alias, "alias"))


def policy_key(model_id: str) -> str:
    """Key of a model's stored gate policy: ``models/<model_id>/policy.json``."""
    return join(model_root(model_id), POLICY)


# -- ledger/ ----------------------------------------------------------------

def revocation_key(source_id: str) -> str:
    """Key of one revocation: ``ledger/revocations/<source_id>.json``."""
    return join(REVOCATIONS, f"{check_name(source_id, 'source_id')}.json")


def alias_history_prefix(model_id: str, alias: str) -> str:
    """Key of one alias's move history: ``ledger/aliases/<model_id>/<alias>``."""
    return join(ALIAS_HISTORY, model_key(model_id), check_name(alias, "alias"))


def alias_entry_key(model_id: str, alias: str, seq: int, digest: str) -> str:
    """Key of one alias move's history entry:
    ``ledger/aliases/<model_id>/<alias>/<seq:08d>-<digest>.json`` (``digest``: the
    first 16 hex digits of the entry's sha256).

    Raises:
        ValueError: ``seq`` is negative or ``digest`` is not lowercase hex.
    """
    if seq < 0 or not re.fullmatch(r"[0-9a-f]{16}", digest):
        raise ValueError(f"alias entry {seq}-{digest}: a sequence >= 0 and 16 hex digits")
    return join(alias_history_prefix(model_id, alias),
                f"{seq:0{ALIAS_SEQ_DIGITS}d}-{digest}.json")


def yank_key(model_id: str, version: str) -> str:
    """Key of a release's yank record: ``ledger/yanks/<model_id>/<version>.json``."""
    return join(YANKS, model_key(model_id), f"{check_name(version, 'version')}.json")


def tombstone_key(model_id: str, version: str) -> str:
    """Key of a deleted release's tombstone:
    ``ledger/tombstones/<model_id>/<version>.json``."""
    return join(TOMBSTONES, model_key(model_id),
                f"{check_name(version, 'version')}.json")


def snapshot_key(model_id: str, version: int) -> str:
    """Key of version ``version`` of a model's signed trust snapshot:
    ``ledger/snapshots/<model_id>/<version>.snapshot.json`` (each version its own
    object, as TUF's consistent snapshots: a timestamp names one exactly)."""
    return join(SNAPSHOTS, model_key(model_id), f"{int(version)}.snapshot.json")


def timestamp_key(model_id: str) -> str:
    """Key of the signed timestamp naming a model's current snapshot:
    ``ledger/snapshots/<model_id>/timestamp.json``."""
    return join(SNAPSHOTS, model_key(model_id), "timestamp.json")


def tags_key(model_id: str, version: str) -> str:
    """Key of a release's mutable tags: ``ledger/tags/<model_id>/<version>.json``."""
    return join(TAGS, model_key(model_id), f"{check_name(version, 'version')}.json")


# -- events/ ----------------------------------------------------------------

def event_key(seq: int) -> str:
    """Key of the event numbered ``seq``: ``events/<seq:012d>.json``.

    Raises:
        ValueError: ``seq`` is below 1.
    """
    if seq < 1:
        raise ValueError(f"event {seq}: events are numbered from 1")
    return join(EVENTS, f"{seq:0{EVENT_DIGITS}d}.json")


# -- claims and staging -----------------------------------------------------

def claim_key(prefix: str) -> str:
    """Key of the claim that says who owns ``prefix``: ``<prefix>.claim``."""
    return prefix if prefix.endswith(CLAIM_SUFFIX) else prefix + CLAIM_SUFFIX


def staging_prefix(prefix: str, tag: str) -> str:
    """Key of a writer's staging directory for ``prefix``: ``<prefix>.tmp-<tag>``."""
    return f"{prefix}{TMP_MARK}-{tag}"


def leftover_base(name: str) -> str | None:
    """The directory name a staging directory (``step-000500.tmp``,
    ``step-000500.tmp-<tag>``) or claim (``<name>.claim``) belongs to; None for
    any other name."""
    if TMP_MARK in name:
        return name.split(TMP_MARK, 1)[0]
    if name.endswith(CLAIM_SUFFIX):
        return name.removesuffix(CLAIM_SUFFIX)
    return None


# -- listings ----------------------------------------------------------------

def model_ids(names: list[str]) -> list[str]:
    """The model ids of the folders ``names`` that a listing of ``models/`` (or
    of a ledger folder keyed by model: ``ledger/yanks/``...) returned, in their
    order; a folder that is no model's key (a staging directory, a stray
    ``a@b@c``) is left out. ``acme@tiny`` reads back as ``acme/tiny``."""
    from registry.errors import InvalidNameError
    from registry.rules.names import model_from_key

    out = []
    for name in names:
        try:
            out.append(model_from_key(name))
        except InvalidNameError:
            continue
    return out
