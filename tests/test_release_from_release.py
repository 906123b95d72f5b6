"""A release from a release (issue 50 item 1): ``registry publish STORE/models/M/V``
admits its source through the trust function, on a local store and on S3 (moto).

Each refusal is a real ``registry publish`` process that exits non-zero, writes
nothing, and fails if :func:`registry.release.release_source.check_release_source`
is not called (the folder's files are then released as they are).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("model_signing")

from registry.trust.keys import load_public_key  # noqa: E402
from registry.gating.ledger import revoke  # noqa: E402
from registry.lifecycle.yank import yank  # noqa: E402
from registry.release import ModelRelease  # noqa: E402
from registry.store import Store, open_store  # noqa: E402
from registry.trust import revoke as revoke_key  # noqa: E402
from tests.conftest import make_store_url, run_cli  # noqa: E402
from tests.release_util import ledger_row, summary  # noqa: E402
from tests.test_signing import keypair, model_dir  # noqa: E402


class Source:
    def __init__(self, url: str, root: Path) -> None:
        (root / "keys").mkdir(parents=True)
        self.url, self.root = url, root
        self.store: Store = open_store(url)
        self.key, self.pub = keypair(root, "release")
        ModelRelease(self.store).publish(model_dir(root), "base", "1",
                                         ledger=[ledger_row("wiki")], eval_summary=summary(),
                                         sign_key=self.key)
        # unsigned: without the trust function's check its folder would be released as is
        ModelRelease(self.store).publish(model_dir(root, "src-plain", seed=3), "plain", "1",
                                         ledger=[ledger_row("wiki")], eval_summary=summary())
        self.ledger, self.evals = root / "ledger.json", root / "summary.json"
        self.ledger.write_text(json.dumps([ledger_row("books")]))
        self.evals.write_text(json.dumps(summary()))

    def publish(self, version: str, *extra: str, src: str = "plain/1") -> tuple[int, str]:
        r = run_cli("publish", f"{self.url}/models/{src}", "--model-id", "derived",
                    "--version", version, "--ledger", str(self.ledger), "--evals",
                    str(self.evals), "--store", self.url, "--db",
                    f"sqlite:///{self.root / 'i.db'}", *extra,
                    env={"REGISTRY_CACHE": str(self.root / "cache")})
        assert "Traceback" not in r.stderr, r.stderr
        return r.returncode, r.stderr

    def released(self, version: str) -> bool:
        return self.store.exists(f"models/derived/{version}/MANIFEST.json")


@pytest.fixture(params=["local", "s3"])
def src(request: pytest.FixtureRequest, tmp_path: Path) -> Source:
    return Source(make_store_url(request.param, request, tmp_path), tmp_path)


def test_a_good_source_is_released_with_its_bytes(src: Source) -> None:
    code, err = src.publish("1", "--trusted-key", str(src.pub), src="base/1")
    assert code == 0, err
    assert src.store.read_bytes("models/derived/1/model.safetensors") == \
        src.store.read_bytes("models/base/1/model.safetensors")
    assert not src.store.exists("models/derived/1/model.sig")  # vouched for base@1 only


def test_a_yanked_source_is_refused(src: Source) -> None:
    yank(src.store, "plain", "1", "bad weights")
    code, err = src.publish("1")
    assert code != 0 and "yanked" in err and not src.released("1"), err


def test_a_source_failing_its_gates_is_refused(src: Source) -> None:
    revoke(src.store, "wiki", "licence withdrawn")  # plain@1 was trained on it
    code, err = src.publish("1")
    assert code != 0 and "revoked" in err and not src.released("1"), err


def test_an_unsigned_source_is_refused_with_trust(src: Source) -> None:
    assert src.publish("0")[0] == 0  # without trust it is a release
    code, err = src.publish("1", "--trusted-key", str(src.pub))
    assert code != 0 and "unsigned" in err and not src.released("1"), err


def test_a_source_signed_by_a_revoked_key_is_refused(src: Source) -> None:
    keys = src.root / "trusted"
    keys.mkdir()
    (keys / "release.pub").write_bytes(src.pub.read_bytes())
    revoke_key(keys, load_public_key(keys / "release.pub"), "leaked")
    code, err = src.publish("1", "--trusted-keys", str(keys), src="base/1")
    assert code != 0 and "revoked" in err and not src.released("1"), err


def test_a_removed_yank_of_the_source_is_refused(src: Source) -> None:
    yank(src.store, "plain", "1", "bad weights")
    assert src.publish("1")[0] != 0  # this host sees the yank
    src.store.delete("ledger/yanks/plain/1.json")
    code, err = src.publish("1")
    assert code != 0 and "never taken as lifted" in err and not src.released("1"), err


def test_a_planted_file_in_the_source_is_refused(src: Source) -> None:
    src.store.write_bytes("models/plain/1/extra.py", b"import os\n")
    code, err = src.publish("1")
    assert code != 0 and "extra.py" in err and "not listed" in err, err
    assert not src.released("1")


def test_a_deleted_source_with_leftover_files_is_refused(src: Source) -> None:
    """A delete interrupted after its tombstone and MANIFEST.json: the files stay."""
    from registry.lifecycle.delete import delete_release

    kept = {n: src.store.read_bytes(f"models/plain/1/{n}")
            for n in ("config.json", "model.safetensors")}
    delete_release(src.store, "plain", "1", "withdrawn")
    for n, data in kept.items():
        src.store.write_bytes(f"models/plain/1/{n}", data)
    code, err = src.publish("1")
    assert code != 0 and "deleted" in err and not src.released("1"), err
