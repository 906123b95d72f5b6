"""Signed-snapshot records of a namespaced model (``acme/tiny``, stored under
``models/acme@tiny``): the listed policy.json is checked at its real key, and
a mirror relays the records of such a model (issues 44 item 4 and 50)."""

from __future__ import annotations

import pytest

from registry.protocol.layout import policy_key, snapshot_key, timestamp_key, yank_key
from registry.store import open_store
from registry.trust.freshness import Fresh, FreshnessError
from registry.trust.relay import relayed


@pytest.mark.parametrize("model_id", ["tiny", "acme/tiny"])
def test_a_listed_policy_that_is_gone_is_refused(model_id: str) -> None:
    store = open_store(f"memory://ns-policy-{model_id.replace('/', '-')}")
    fresh = Fresh(model_id, 1, 1, "2999-01-01T00:00:00Z", "0" * 64,
                  records={policy_key(model_id): {"version": 1, "sha256": "0" * 64}})
    with pytest.raises(FreshnessError, match="policy"):
        fresh.check_store(store)


@pytest.mark.parametrize("key", [
    policy_key("acme/tiny"), timestamp_key("acme/tiny"), snapshot_key("acme/tiny", 3),
    yank_key("acme/tiny", "1"), policy_key("tiny"), yank_key("tiny", "2"),
])
def test_a_mirror_relays_the_records_of_every_model(key: str) -> None:
    assert relayed(key) == key


@pytest.mark.parametrize("key", [
    "models/acme@tiny/config.json", "models/a@b@c/policy.json", "models/../policy.json",
    "ledger/yanks/acme@tiny/../x.json", "models/acme/tiny/policy.json",
])
def test_a_mirror_relays_nothing_else(key: str) -> None:
    assert relayed(key) is None
