"""Strong evidence: what a listing says is confirmed by direct reads (issue 31 item 3).

A listing is weak evidence. GCS, Swift and Ceph RGW document listings that
lag recent writes and deletes, any cache in front of S3 can serve an old
one, and a listing can be cut short. A GET or HEAD of one key is answered
from the object itself. So nothing is *forgotten* on a listing's word:

- an object is absent only when a HEAD of its key says so
  (:func:`confirmed_absent`);
- a committed directory the listing shows with files missing or resized is
  damaged only when a HEAD of each of those files agrees
  (:func:`verify_confirmed`).

``index rebuild`` follows both rules; so must anything else that deletes or
drops an index row because a listing did not show something.
"""

from __future__ import annotations

from registry.errors import ObjectNotFoundError, UnsafeEntryError
from registry.protocol.manifest import MANIFEST
from registry.store import Store, join
from registry.protocol.verify import VerifyReport, verify_directory, verify_entries


def confirmed_absent(store: Store, key: str) -> bool:
    """True only when a HEAD of ``key`` answers "not found".

    Raises:
        StorageError: the store failed (never taken for an absence).
    """
    try:
        store.info(key)
    except ObjectNotFoundError:
        return True
    return False


def manifest_absent(store: Store, prefix: str) -> bool:
    """The directory at ``prefix`` has no commit marker, by a HEAD of it."""
    return confirmed_absent(store, join(prefix, MANIFEST))


def verify_confirmed(store: Store, prefix: str) -> VerifyReport:
    """:func:`registry.protocol.verify.verify_directory` (sizes) whose listing-based
    problems are re-checked by a HEAD of each file concerned: a file the
    listing omits or shows with another size is a problem only when its HEAD
    agrees. Files the listing shows that the manifest does not list
    (``extras``) are reported as listed.

    Raises:
        StorageError: the store failed.
    """
    report = verify_directory(store, prefix)
    if report.manifest is None or not report.problems:
        return report
    sizes = store.walk_files(prefix)
    for entry in report.manifest.files:
        if sizes.get(entry.path) != entry.size:
            try:
                sizes[entry.path] = store.info(join(prefix, entry.path)).size
            except ObjectNotFoundError:
                sizes.pop(entry.path, None)
            except UnsafeEntryError as e:  # a link or special file: a problem, named
                store.skip(str(e))
                sizes.pop(entry.path, None)
    problems = verify_entries(store, prefix, report.manifest.files, full=False, sizes=sizes)
    return VerifyReport(prefix, False, report.manifest, None, tuple(problems), report.extras)
