"""The read-only weight sources of a LoongSage run (seed 003 section 2): the
reference model (``ref_dist_ckpt_path`` / ``ref_hf_model_path``, pick one) and
the OPD teachers (``opd.teachers[].dist_ckpt_path`` with a required ``hf_path``).

A ``dist_ckpt`` path names one concrete ``train_step_<N>/dist_ckpt`` directory:
no tracker file is read and no step is picked. Before use it is verified
against its step's MANIFEST.json: every file under it listed, each with the
listed size and sha256 (read in full). An HF path is a model folder holding
``config.json`` (it gives the model structure); one inside a checkpoint step
(``train_step_<N>/hf_model``) is verified against the step's manifest the
same way. Paths are folders or URLs (``s3://...``), or keys in ``store``.

::

    refs = check_weight_sources({"ref_dist_ckpt_path": "s3://b/exp/train_step_50/dist_ckpt",
                                 "opd": {"teachers": [{"hf_path": "/models/t1",
                                     "dist_ckpt_path": "/ckpt/t1/train_step_9/dist_ckpt"}]}})
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from registry.rules import schemas
from registry.checkpoint.layout import LOONGSAGE
from registry.checkpoint.loongsage_format import CONFIG, DIST
from registry.errors import (
    CheckpointError,
    DocumentError,
    NotCommittedError,
    ObjectNotFoundError,
    RegistryError,
    UsageError,
)
from registry.release.step_source import check_step_source
from registry.store import Store, open_store
from registry.protocol.verify import read_manifest


@dataclass(frozen=True, slots=True)
class WeightSource:
    """One verified weight source.

    Attributes:
        kind: ``"dist_ckpt"`` or ``"hf"``.
        path: its URL.
        step: the checkpoint step it lies in (None: an HF folder outside a tree).
        manifest_sha256: the digest of that step's MANIFEST.json (None likewise).
        hf_config: the ``config.json`` of an HF source (None for dist_ckpt).
    """

    kind: str
    path: str
    step: int | None
    manifest_sha256: str | None
    hf_config: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path, "step": self.step,
                "manifest_sha256": self.manifest_sha256}


@dataclass(frozen=True, slots=True)
class Teacher:
    """An OPD teacher: ``hf_path`` (structure, and weights when there is no
    ``dist_ckpt``) and the optional ``dist_ckpt`` it loads its weights from."""

    index: int
    hf: WeightSource
    dist_ckpt: WeightSource | None

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "hf_path": self.hf.to_dict(),
                "dist_ckpt_path": self.dist_ckpt.to_dict() if self.dist_ckpt else None}


@dataclass(frozen=True, slots=True)
class WeightSources:
    """A run's reference model (None: no ref-KL) and teachers, all verified."""

    ref: WeightSource | None
    teachers: tuple[Teacher, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"ref": self.ref.to_dict() if self.ref else None,
                "teachers": [t.to_dict() for t in self.teachers]}


def _url(path: str | os.PathLike[str], store: str | Store | None, what: str) -> str:
    p = os.fspath(path)
    if not isinstance(p, str) or not p.strip("/"):
        raise UsageError(f"{what}: must name a directory (got {p!r})")
    if "://" in p:
        return p
    if store is None or os.path.isabs(p) or p.startswith((".", "~")):  # a folder, not a key
        return os.path.abspath(os.path.expanduser(p))
    s = store if isinstance(store, Store) else open_store(store)
    return s.url_of(p.strip("/"))


def _split(url: str) -> tuple[str, str, str]:
    """``(root URL, step dir name, last name)`` of ``.../<step dir>/<name>``."""
    parent, _, name = url.rstrip("/").rpartition("/")
    root, _, step_dir = parent.rpartition("/")
    return root, step_dir, name


def check_dist_ckpt_path(path: str | os.PathLike[str], *, store: str | Store | None = None,
                         what: str = "ref_dist_ckpt_path") -> WeightSource:
    """Verify one concrete ``train_step_<N>/dist_ckpt`` directory before use.

    Args:
        path: folder or URL of the directory, or its key in ``store`` (a URL,
            an absolute path or one starting with ``.`` or ``~`` is never a key).
        what: the config field, for messages.

    Returns:
        The WeightSource (kind ``dist_ckpt``, its step and step manifest digest).

    Raises:
        UsageError: ``path`` is not a ``train_step_<N>/dist_ckpt`` directory (a
            ``checkpoint_path`` base directory, say: the message says so).
        NotCommittedError: its step has no MANIFEST.json (adopt a tree written
            without the registry first).
        CheckpointError: the step's manifest lists no ``dist_ckpt/`` file.
        IntegrityError: a file under it is unlisted, missing or differs.
    """
    url = _url(path, store, what)
    root, step_dir, name = _split(url)
    step = LOONGSAGE.parse_dir(step_dir) if name == DIST else None
    if step is None:
        base = open_store(url)
        hint = (" (it is a checkpoint_path: it holds the tracker file)"
                if _exists(base, LOONGSAGE.pointer) else "")
        raise UsageError(f"{what} {url}: must name one concrete train_step_<N>/{DIST} "
                         f"directory{hint}; no tracker file is read and no step is picked")
    digest = _verified(url, what)
    assert digest is not None  # url lies in a step directory
    tree = open_store(root or "/")
    if not any(e.path.startswith(DIST + "/") for e in read_manifest(tree, step_dir).files):
        raise CheckpointError(f"{what} {url}: the step's MANIFEST.json lists no {DIST}/ file "
                              "(saved with save_checkpoint off?)")
    return WeightSource("dist_ckpt", url, step, digest)


def check_hf_path(path: str | os.PathLike[str], *, store: str | Store | None = None,
                  what: str = "ref_hf_model_path") -> WeightSource:
    """Verify an HF model folder before use: its ``config.json`` parses (a JSON
    object), and a folder inside a checkpoint step matches the step's manifest.

    Raises:
        UsageError: an empty path.
        ObjectNotFoundError: a local folder that does not exist.
        DocumentError: no (valid) config.json.
        NotCommittedError, IntegrityError: as :func:`check_dist_ckpt_path`,
            for a folder inside a step.
    """
    url = _url(path, store, what)
    if "://" not in url and not os.path.isdir(url):
        raise ObjectNotFoundError(f"{what} {url}: no such folder", key=url)
    digest = _verified(url, what)
    hf = open_store(url)
    try:
        data = hf.read_bytes(CONFIG)
    except ObjectNotFoundError:
        raise DocumentError(hf.url_of(CONFIG), f"missing: {what} must be an HF model folder "
                                               "with config.json (the model structure)"
                            ) from None
    doc = schemas.load_json(data, path=hf.url_of(CONFIG))
    if not isinstance(doc, dict):
        raise DocumentError(hf.url_of(CONFIG), "must be a JSON object")
    step = LOONGSAGE.parse_dir(_split(url)[1]) if digest is not None else None
    return WeightSource("hf", url, step, digest, doc)


def check_reference(*, ref_dist_ckpt_path: str | os.PathLike[str] | None = None,
                    ref_hf_model_path: str | os.PathLike[str] | None = None,
                    store: str | Store | None = None) -> WeightSource:
    """The reference model (ref-KL): exactly one of the two paths, verified.

    Raises:
        UsageError: both or neither given; and as the check of the one given.
    """
    given = [k for k, v in (("ref_dist_ckpt_path", ref_dist_ckpt_path),
                            ("ref_hf_model_path", ref_hf_model_path)) if v not in (None, "")]
    if len(given) != 1:
        raise UsageError("ref_dist_ckpt_path / ref_hf_model_path: pick exactly one of the two "
                         f"(seed 003); given: {', '.join(given) or 'neither'}")
    if ref_dist_ckpt_path not in (None, ""):
        assert ref_dist_ckpt_path is not None
        return check_dist_ckpt_path(ref_dist_ckpt_path, store=store)
    assert ref_hf_model_path is not None
    return check_hf_path(ref_hf_model_path, store=store)


def check_teachers(teachers: Iterable[Mapping[str, Any]], *,
                   store: str | Store | None = None) -> tuple[Teacher, ...]:
    """``opd.teachers[]``: each needs ``hf_path``; ``dist_ckpt_path`` is optional.
    Other keys of a teacher are the trainer's and are ignored.

    Raises:
        UsageError: a teacher that is not a mapping, or lacks ``hf_path``;
            and as :func:`check_hf_path` / :func:`check_dist_ckpt_path`.
    """
    out = []
    for i, t in enumerate(teachers):
        what = f"opd.teachers[{i}]"
        if not isinstance(t, Mapping):
            raise UsageError(f"{what}: must be a mapping with hf_path (and dist_ckpt_path)")
        hf_path, dist = t.get("hf_path"), t.get("dist_ckpt_path")
        if not isinstance(hf_path, (str, os.PathLike)) or not os.fspath(hf_path):
            extra = " alongside dist_ckpt_path" if dist else ""
            raise UsageError(f"{what}.hf_path: required{extra} (seed 003: it gives the model "
                             "structure)")
        hf = check_hf_path(hf_path, store=store, what=f"{what}.hf_path")
        ckpt = None
        if dist not in (None, ""):
            if not isinstance(dist, (str, os.PathLike)):
                raise UsageError(f"{what}.dist_ckpt_path: must be a path, got {dist!r}")
            ckpt = check_dist_ckpt_path(dist, store=store, what=f"{what}.dist_ckpt_path")
        out.append(Teacher(i, hf, ckpt))
    return tuple(out)


def check_weight_sources(config: Mapping[str, Any], *,
                         store: str | Store | None = None) -> WeightSources:
    """Verify the weight sources a LoongSage config names: ``ref_dist_ckpt_path``
    / ``ref_hf_model_path`` (both null: no reference model) and
    ``opd.teachers`` (``{"opd": {"teachers": [...]}}``).

    Raises:
        UsageError: both reference paths given; ``opd.teachers`` not a list;
            and as :func:`check_reference` and :func:`check_teachers`.
    """
    dist, hf = config.get("ref_dist_ckpt_path"), config.get("ref_hf_model_path")
    ref = None
    if dist not in (None, "") or hf not in (None, ""):
        ref = check_reference(ref_dist_ckpt_path=dist, ref_hf_model_path=hf, store=store)
    opd = config.get("opd") or {}
    teachers = opd.get("teachers") if isinstance(opd, Mapping) else None
    if teachers is not None and (isinstance(teachers, (str, Mapping)) or
                                 not isinstance(teachers, Iterable)):
        raise UsageError("opd.teachers: must be a list of teachers")
    return WeightSources(ref, check_teachers(teachers or (), store=store))


def _exists(store: Store, key: str) -> bool:
    try:
        return store.exists(key)
    except RegistryError:  # only a hint in a message
        return False


def _verified(url: str, what: str) -> str | None:
    """:func:`check_step_source`, with a message about use, not publishing."""
    try:
        return check_step_source(url)
    except NotCommittedError as e:
        raise NotCommittedError(f"{what} {url}: its checkpoint step is not committed (no "
                                "MANIFEST.json), so it is not used (a tree this registry did "
                                "not write: `registry ckpt adopt` it first)",
                                path=e.path) from None
