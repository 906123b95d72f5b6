"""Another local user of a serving host against its trust (issue 30, item 8).

The attacker is a real other uid (``nobody``, through ``setpriv``): it may
write wherever the operator's modes let it, nothing more. Where the trusted
keys folder, a key in it or its ``revoked.json`` can be changed by that user,
the registry refuses to use the trust at all, as ssh refuses an
``authorized_keys`` another user could rewrite; without that check each
attack below places bytes the operator never trusted (exit 0).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from registry.errors import UnsafeFileModeError
from registry.host.filemodes import check_trusted_path
from registry.store import Store, open_store
from registry.trust import load_trust
from tests.test_signing import MODEL, model_dir, publish

REPO = Path(__file__).resolve().parents[1]
NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv to run the attacker as another uid")


@pytest.fixture
def world(any_uid_dir: Path) -> Path:
    return any_uid_dir


def _keypair(path: Path) -> tuple[Path, Path]:
    from registry.trust.keys import generate

    priv, pub, _ = generate(path.with_suffix(".key"), public_path=path.with_suffix(".pem"))
    return priv, pub


def _published(world: Path, who: str) -> tuple[Path, Store, Path]:
    """A local store holding MODEL@1 signed by a new key ``who`` and a keys
    folder trusting that key: (store_dir, store, keys)."""
    store_dir = world / "store"
    store = open_store(str(store_dir))
    priv, pub = _keypair(world / who)
    publish(store, model_dir(world), "1", priv)
    keys = world / "keys"
    keys.mkdir()
    shutil.copy(pub, keys / f"{who}.pem")
    return store_dir, store, keys


def as_nobody(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*NOBODY, *argv], capture_output=True, text=True, timeout=120)


def pull(world: Path, store_url: str, ref: str, keys: Path,
         to: str = "out") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("REGISTRY_TRUSTED_KEYS", None)
    return subprocess.run([sys.executable, "-m", "registry", "pull", ref, "--store", store_url,
                           "--to", str(world / to), "--cache", str(world / "cache"),
                           "--trusted-keys", str(keys), "--quiet"],
                          capture_output=True, text=True, timeout=300, env=env)


def test_a_key_planted_in_a_world_writable_keys_folder_is_never_trusted(world: Path) -> None:
    store_dir, store, keys = _published(world, "operator")
    keys.chmod(0o777)  # the operator's mistake
    # the attacker: its own key, planted; then (as a store writer too) a release it signed
    evil_priv, evil_pub = _keypair(world / "evil")
    evil_pub.chmod(0o644)
    p = as_nobody("cp", str(evil_pub), str(keys / "evil.pem"))
    assert p.returncode == 0, p.stderr
    assert (keys / "evil.pem").stat().st_uid != 0
    publish(store, model_dir(world, "evil-src", seed=7), "2", evil_priv)

    got = pull(world, str(store_dir), f"{MODEL}@2", keys)
    assert got.returncode == 2, (got.returncode, got.stdout, got.stderr)
    assert "writable by" in got.stderr and str(keys) in got.stderr
    assert len(got.stderr.strip().splitlines()) == 1, got.stderr
    assert not (world / "out").exists()  # nothing placed
    # the folder fixed, the planted file (owned by nobody) is still refused by name
    keys.chmod(0o755)
    got = pull(world, str(store_dir), f"{MODEL}@2", keys)
    assert got.returncode == 2 and "evil.pem" in got.stderr and "uid 65534" in got.stderr
    (keys / "evil.pem").unlink()
    ok = pull(world, str(store_dir), f"{MODEL}@1", keys)
    assert ok.returncode == 0, ok.stderr
    assert (world / "out" / "model.safetensors").read_bytes() == \
        (world / "src" / "model.safetensors").read_bytes()
    refused = pull(world, str(store_dir), f"{MODEL}@2", keys, to="out2")
    assert refused.returncode != 0 and "signed" in refused.stderr, refused.stderr
    assert not (world / "out2").exists()


def test_a_revocation_another_user_can_rewrite_is_refused(world: Path) -> None:
    from registry.trust.keys import load_public_key
    from registry.trust import revoke

    store_dir, _, keys = _published(world, "leaked")
    revoke(keys, load_public_key(keys / "leaked.pem"), "key leaked")
    assert pull(world, str(store_dir), f"{MODEL}@1", keys).returncode != 0  # revoked holds
    (keys / "revoked.json").chmod(0o666)  # a careless chmod
    p = as_nobody("sh", "-c", f"echo '{{}}' > {keys / 'revoked.json'}")  # un-revoke
    assert p.returncode == 0, p.stderr
    got = pull(world, str(store_dir), f"{MODEL}@1", keys)
    assert got.returncode == 2, (got.stdout, got.stderr)
    assert "revoked.json" in got.stderr and "mode 0666" in got.stderr
    assert not (world / "out").exists()


def test_the_rules_of_a_trusted_path(world: Path) -> None:
    f = world / "k.pem"
    f.write_text("x")
    f.chmod(0o644)
    check_trusted_path(f, "trusted key")  # root's, 0644, in a 0755 root folder
    for mode, word in ((0o664, "its group"), (0o646, "other users"),
                       (0o666, "group and other users")):
        f.chmod(mode)
        with pytest.raises(UnsafeFileModeError, match=word):
            check_trusted_path(f, "trusted key")
    f.chmod(0o644)
    os.chown(f, 65534, 65534)
    with pytest.raises(UnsafeFileModeError, match="owned by uid 65534"):
        check_trusted_path(f, "trusted key")
    os.chown(f, 0, 0)
    world.chmod(0o777)
    with pytest.raises(UnsafeFileModeError, match="another user can write"):
        check_trusted_path(f, "trusted key")
    world.chmod(0o1777)  # sticky, as /tmp: others cannot replace root's file
    check_trusted_path(f, "trusted key")
    world.chmod(0o755)
    link = world / "link.pem"
    link.symlink_to(f)  # a secret volume's links: the target is what counts
    check_trusted_path(link, "trusted key")
    with pytest.raises(UnsafeFileModeError):
        f.chmod(0o666)
        load_trust([link])


def test_a_link_another_user_can_replace_is_refused(world: Path) -> None:
    """The folder holding a symbolic link is checked too, not only the target's:
    in a folder others can write (no sticky bit), or as a link another user
    owns, the link can be swapped to name any file of this user or root."""
    safe = world / "safe"
    safe.mkdir()
    f = safe / "k.pem"
    f.write_text("x")
    f.chmod(0o644)
    drop = world / "drop"
    drop.mkdir()
    drop.chmod(0o777)
    p = as_nobody("ln", "-s", str(f), str(drop / "k.pem"))  # the other user's link
    assert p.returncode == 0, p.stderr
    with pytest.raises(UnsafeFileModeError, match=str(drop)):
        check_trusted_path(drop / "k.pem", "trusted key")
    drop.chmod(0o1777)  # sticky: the link is still nobody's to swap
    with pytest.raises(UnsafeFileModeError, match="owned by uid 65534"):
        check_trusted_path(drop / "k.pem", "trusted key")
    keys = world / "keys"
    keys.symlink_to(safe)  # root's own link in a root folder: fine
    check_trusted_path(keys / "k.pem", "trusted key")
    check_trusted_path(keys, "trusted keys folder")
