"""``registry gc``: remove abandoned claims and uncommitted leftovers, never a commit.

Looks at every model folder (``models/<model_id>/``) and every run's checkpoint
tree (``runs/<run_id>/ckpt/``): staging directories (``*.tmp*``), claims
(``*.claim``) and version or step directories without a valid MANIFEST.json,
older than ``older_than`` seconds (by their newest file). LoongSage trees live
wherever their ``checkpoint_path`` says, so they are scanned only when named
(``trees``), and there only step-shaped names are candidates
(``train_step_<N>``, ``train_step_<N>.tmp*``, ``*.claim``): anything else a
user keeps beside them is left alone. A committed directory is never
touched: it is re-checked right before deletion.
"""

from __future__ import annotations

import time

from registry.checkpoint.layout import LOONGSAGE, TINYLLM
from registry.commit import CLAIM_SUFFIX, TMP_MARK, delete_directory
from registry.errors import UsageError
from registry.store import Store, join
from registry.verify import verify_directory


def _age(store: Store, key: str, now: float) -> float:
    files = store.walk_files(key)
    keys = [join(key, f) for f in files] if files else [key]
    newest = 0.0
    for k in keys:
        try:
            mtime = store.info(k).mtime
        except FileNotFoundError:
            continue
        newest = max(newest, mtime or 0.0)
    return now - newest


def _folders(store: Store) -> list[str]:
    out = [join("models", m) for m in store.subdirs("models")]
    out += [join("runs", r, "ckpt") for r in store.subdirs("runs")]
    return out


def committed_here(store: Store, key: str) -> bool:
    """A committed directory whose manifest belongs at ``key``: a release's
    version (or a checkpoint's step directory) is the directory's own name.
    A staging directory holding a copied manifest is not committed here."""
    report = verify_directory(store, key)
    if report.manifest is None:
        return False
    name = key.rsplit("/", 1)[-1]
    meta = report.manifest.meta
    if report.manifest.kind == "release":
        return bool(meta.get("version") == name)
    layout = LOONGSAGE if meta.get("layout") == "loongsage" else TINYLLM
    return layout.parse_dir(name) == meta.get("step")


def _loongsage_candidate(name: str) -> bool:
    step = name.split(TMP_MARK, 1)[0].removesuffix(CLAIM_SUFFIX)
    return LOONGSAGE.parse_dir(step) is not None


def collect(store: Store, *, older_than: float, dry_run: bool = False,
            trees: tuple[str, ...] | list[str] = ()) -> list[str]:
    """Delete (or with ``dry_run`` only list) abandoned leftovers; returns the keys
    deleted (or that would be).

    Args:
        older_than: seconds; younger leftovers may belong to a live writer.
        trees: LoongSage ``checkpoint_path`` keys to scan as well.
    """
    now = time.time()
    doomed = []
    folders = [(f, False) for f in _folders(store)]
    folders += [(t.strip("/"), True) for t in trees]
    for folder, loong in folders:
        for name, is_dir in store.list_dir(folder):
            key = join(folder, name)
            if name == "refs" or name.endswith(".lock") or name in ("LATEST", "policy.json"):
                continue
            if loong and not _loongsage_candidate(name):
                continue
            if is_dir and committed_here(store, key):
                continue
            if not is_dir and not name.endswith(CLAIM_SUFFIX):
                continue
            if _age(store, key, now) >= older_than:
                doomed.append((key, is_dir))
    removed = []
    for key, is_dir in doomed:
        if is_dir and committed_here(store, key):  # committed meanwhile: keep it
            continue
        if not dry_run:
            if is_dir:
                delete_directory(store, key)
            else:
                store.delete(key)
        removed.append(key)
    return removed


def parse_duration(text: str) -> float:
    """``"90s"``, ``"15m"``, ``"2h"``, ``"7d"`` or plain seconds -> seconds.

    Raises:
        UsageError: not a duration.
    """
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    t = text.strip().lower()
    try:
        if t and t[-1] in units:
            value = float(t[:-1]) * units[t[-1]]
        else:
            value = float(t)
    except ValueError:
        raise UsageError(f"duration {text!r}: expected e.g. 90s, 15m, 2h, 7d") from None
    if value < 0:
        raise UsageError(f"duration {text!r}: negative")
    return value
