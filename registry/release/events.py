"""The event of a committed release (issue 32 item 7): ``model_version.created``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from registry.host.actor import actor_of_metadata
from registry.events import MODEL_VERSION_CREATED, append_event
from registry.store import Store

if TYPE_CHECKING:  # model_release loads numpy (its conversions)
    from registry.release.model_release import ReleaseResult


def release_event(store: Store, result: ReleaseResult) -> str:
    """Append ``model_version.created`` for ``result``, with the manifest's digest
    and sequence and the actor its manifest records; returns the event id.

    Raises:
        EventNotRecordedError: the release stands; its event was not appended.
    """
    metadata = result.manifest.meta.get("metadata", {})
    return append_event(store, MODEL_VERSION_CREATED, model_id=result.model_id,
                        version=result.version,
                        data={"manifest_sha256": result.manifest.digest,
                              "sequence": metadata.get("sequence"), "url": result.url},
                        actor=actor_of_metadata(metadata))
