"""One trust path (issue 50): every door resolves and admits a release through
:func:`registry.trust.release.open_release`, and each kind of attack is refused
through every door as through the best-guarded one.

The matrix runs each attack through each door with real components: the Python
API, the CLI (real processes), ``pull --from`` a real ``registry serve`` mirror
that holds no keys (behind it, a store writer), the Hub routes of a real
``registry serve --trusted-key``, the weights reader (``registry load``) and a
release made from a release (``registry publish STORE/models/M/V``). The second
uid's attacks on a host's marks are tests/test_trust_second_uid.py. A door added later must be wired to the trust
function: :func:`test_no_door_decides_trust_alone` reads the package and
fails on a module outside ``registry/trust/`` that calls the primitives itself.
"""

from __future__ import annotations

import ast
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("model_signing")

from registry.refs.alias_history import read_head  # noqa: E402
from registry.refs.aliases import set_alias  # noqa: E402
from registry.errors import RegistryError, SignatureError  # noqa: E402
from registry.lifecycle.yank import yank  # noqa: E402
from registry.pull import pull  # noqa: E402
from registry.release import ModelRelease  # noqa: E402
from registry.store import open_store  # noqa: E402
from registry.trust import load_trust  # noqa: E402
from tests.conftest import run_cli  # noqa: E402
from tests.release_util import ledger_row, summary  # noqa: E402
from tests.test_signing import SignedStore, model_dir  # noqa: E402
from tests.web_util import serve  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent / "registry"


# -- the world: one store, one honest keyless mirror, one trusting server ---------------


class World(SignedStore):
    """A local store with signed releases; ``mirror``: a ``registry serve`` of it
    with no keys; ``hub``: one with ``--trusted-key``."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.trust = load_trust([self.pub])
        self.srcs = {v: model_dir(root / "src", f"s{v}", seed=int(v)) for v in ("1", "2")}
        self.hub = ""

    def model(self, model_id: str) -> str:
        """``model_id`` with versions 1 and 2 (signed) and ``prod`` moved 1 -> 2, signed."""
        for v, src in self.srcs.items():
            ModelRelease(self.store).publish(src, model_id, v, ledger=[ledger_row()],
                                             eval_summary=summary(), sign_key=self.key)
        set_alias(self.store, model_id, "prod", "1", sign_key=self.key)
        set_alias(self.store, model_id, "prod", "2", sign_key=self.key)
        return model_id


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    w = World(tmp_path_factory.mktemp("trust-path"))
    db = tmp_path_factory.mktemp("trust-db")
    env = {"REGISTRY_CACHE": str(db / "cache")}  # the servers' marks
    with serve(w.url, f"sqlite:///{db / 'm.db'}", env=env) as mirror, \
            serve(w.url, f"sqlite:///{db / 'h.db'}", "--trusted-key", str(w.pub),
                  env=env) as hub:
        w.mirror, w.hub = mirror, hub
        yield w


# -- the doors: each returns the version it admits, or raises RegistryError ---------------


def door_api(w: World, model_id: str, tmp: Path, to: Path) -> str:
    return pull(w.store, model_id, "prod", to=to, trust=w.trust, cache=tmp / "c").version


def _cli(w: World, model_id: str, tmp: Path, to: Path, *extra: str) -> str:
    r = run_cli("pull", f"{model_id}@prod", "--to", str(to), "--cache", str(tmp / "c"),
                "--trusted-key", str(w.pub), "--json", *extra)
    assert "Traceback" not in r.stderr, r.stderr
    if r.returncode != 0:
        raise RegistryError(r.stderr.strip() or r.stdout.strip())
    return str(json.loads(r.stdout)["version"])


def door_cli(w: World, model_id: str, tmp: Path, to: Path) -> str:
    return _cli(w, model_id, tmp, to, "--store", w.url)


def door_mirror(w: World, model_id: str, tmp: Path, to: Path) -> str:
    return _cli(w, model_id, tmp, to, "--from", w.mirror)


def door_hub(w: World, model_id: str, tmp: Path, to: Path) -> str:
    url = f"{w.hub}/api/models/registry/{model_id}/revision/prod"
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return str(json.loads(r.read())["registry"]["version"])
    except urllib.error.HTTPError as e:
        e.close()
        raise RegistryError(f"HTTP {e.code} {e.headers.get('X-Error-Message')}") from None


def door_weights(w: World, model_id: str, tmp: Path, to: Path) -> str:
    """The weights reader (``registry load``, :func:`registry.load.open_weights`),
    a real process reading every tensor; ``to`` is made only when it admitted one."""
    r = run_cli("load", f"{model_id}@prod", "--check", "--json", "--cache", str(tmp / "c"),
                "--trusted-key", str(w.pub), "--store", w.url)
    assert "Traceback" not in r.stderr, r.stderr
    if r.returncode != 0:
        raise RegistryError(r.stderr.strip() or r.stdout.strip())
    to.mkdir(parents=True)
    return str(json.loads(r.stdout)["version"])


def door_release_from_release(w: World, model_id: str, tmp: Path, to: Path) -> str:
    """``registry publish STORE/models/M/2``: a release made from release 2 (the
    version prod points to); the new release is ``to``'s name."""
    ledger, evals = tmp / "ledger.json", tmp / "summary.json"
    ledger.write_text(json.dumps([ledger_row()]))
    evals.write_text(json.dumps(summary()))
    r = run_cli("publish", f"{w.url}/models/{model_id}/2", "--model-id", f"{model_id}-copy",
                "--version", to.name, "--ledger", str(ledger), "--evals", str(evals),
                "--trusted-key", str(w.pub), "--store", w.url, "--db",
                f"sqlite:///{tmp / 'publish.db'}", "--json",
                env={"REGISTRY_CACHE": str(tmp / "c")})
    assert "Traceback" not in r.stderr, r.stderr
    if r.returncode != 0:
        raise RegistryError(r.stderr.strip() or r.stdout.strip())
    to.mkdir(parents=True)
    return "2"


DOORS: dict[str, Callable[[World, str, Path, Path], str]] = {
    "api": door_api, "cli": door_cli, "pull-from-mirror": door_mirror, "hub": door_hub,
    "weights-reader": door_weights, "release-from-release": door_release_from_release}


# -- the attacks: (prepare, attack) on a fresh model; the door must refuse after -------


def rollback_signed_alias(w: World, m: str) -> None:
    """A store writer puts back the pointer of an older *signed* move (prod -> 1)."""
    from registry.refs.alias_history import walk

    old = [mv for mv in walk(w.store, m, "prod") if mv.seq == 1][0]
    w.store.write_bytes(f"models/{m}/refs/prod", old.raw)


def unsigned_alias(w: World, m: str) -> None:
    """A store writer repoints prod to release 1 (signed) with a bare pointer: the
    keyless mirror answers 1, which a host with keys must not take on its word."""
    w.store.write_bytes(f"models/{m}/refs/prod", b"1\n")


def removed_yank(w: World, m: str) -> None:
    """Release 2 is yanked (each door sees it refused), then a store writer deletes
    the yank record: the release must not come back unseen."""
    w.store.delete(f"ledger/yanks/{m}/2.json")


def unsigned_release(w: World, m: str) -> None:
    """A store writer removes release 2's model.sig (its files unchanged)."""
    w.store.delete(f"models/{m}/2/model.sig")


def removed_yank_signed(w: World, m: str) -> None:
    """Release 2 is yanked with --sign-key (the model's signed snapshot lists the
    yank record), then a store writer deletes the record: a door that never saw
    the yank (a fresh host) must refuse it from the snapshot alone."""
    from registry.api import Registry
    from registry.trust.snapshot import sign_snapshot

    sign_snapshot(w.store, m, w.key)
    Registry(w.store, f"sqlite:///{w.root / 'yank.db'}").yank(m, "2", "bad", sign_key=w.key)
    w.store.delete(f"ledger/yanks/{m}/2.json")


ATTACKS: dict[str, Callable[[World, str], None]] = {
    "rollback-signed-alias": rollback_signed_alias, "unsigned-alias": unsigned_alias,
    "removed-yank": removed_yank, "unsigned-release": unsigned_release,
    "removed-yank-signed-snapshot": removed_yank_signed}

#: the attacks that do not apply to a door, and why
NOT_APPLICABLE = {
    # a release's folder is named by its version: no alias is resolved
    ("release-from-release", "rollback-signed-alias"), ("release-from-release", "unsigned-alias"),
}
#: attacks whose door meets the record first (trust on first use); the others meet a
#: fresh host, which only signed evidence protects (an unsigned release too: a server
#: that verified release 2 reuses that verdict of its unchanged manifest for 60 s)
SEEN_FIRST = {"rollback-signed-alias", "unsigned-alias", "removed-yank"}
CASES = [(d, a) for d in sorted(DOORS) for a in sorted(ATTACKS) if (d, a) not in NOT_APPLICABLE]


@pytest.mark.parametrize(("door", "attack"), CASES)
def test_matrix(world: World, door: str, attack: str, tmp_path: Path) -> None:
    m = world.model(f"{attack}-{door}")
    enter = DOORS[door]
    if attack == "removed-yank":
        yank(world.store, m, "2", "bad weights")
        with pytest.raises(RegistryError):  # seen yanked through this door
            enter(world, m, tmp_path, tmp_path / "before")
    elif attack in SEEN_FIRST:  # the door sees move 2 first
        assert enter(world, m, tmp_path, tmp_path / "before") == "2"
    ATTACKS[attack](world, m)
    with pytest.raises(RegistryError) as err:
        enter(world, m, tmp_path, tmp_path / "after")
    assert "Traceback" not in str(err.value)
    assert not (tmp_path / "after").exists()


# -- the one function ----------------------------------------------------------------------


def test_kept_import_paths() -> None:
    from registry.pull.opened import open_release as delegate
    from registry.trust import REVOKED, Trust, read_revoked, revoke  # noqa: F401
    from registry.trust.release import open_release

    assert delegate is open_release


#: primitives only the trust function (registry/trust/) calls; a door calling one of them
#: decides trust on its own (the trust package's own functions, open_release and
#: resolve_for_pull, are what doors call). The publish-time signature gate checks a
#: release being made, not one being read.
PRIMITIVES = {"refuse_retired", "trusted_alias_version", "verify_release",
              "verify_move", "precheck", "verify_bytes"}
ALLOWED = {"registry/release/signature_gate.py", "registry/lifecycle/guard.py",
           "registry/trust/alias_sign.py", "registry/trust/model_sig.py"}


def test_no_door_decides_trust_alone() -> None:
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).as_posix()
        if rel.startswith("registry/trust/") or rel in ALLOWED:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)
                if name in PRIMITIVES:
                    offenders.append(f"{rel}:{node.lineno}: {name}")
    assert offenders == [], offenders


# -- fresh trust: a revocation on a serving host counts from the next request ---------------


def test_serve_sees_a_revocation_at_the_next_request(tmp_path: Path) -> None:
    from registry.trust.keys import load_public_key
    from registry.trust import revoke
    from registry.trust.source import CHECK_INTERVAL

    w = World(tmp_path / "w")
    keys = tmp_path / "w" / "keys"
    w.key = (keys / "release.pem").rename(tmp_path / "release.pem")  # the folder: public keys
    w.model("tiny")
    url = "/api/models/registry/tiny/revision/2"
    with serve(w.url, f"sqlite:///{tmp_path / 'i.db'}", "--trusted-keys", str(keys)) as base:
        with urllib.request.urlopen(base + url, timeout=60) as r:
            assert r.status == 200
        revoke(keys, load_public_key(w.pub), "leaked")
        time.sleep(2 * CHECK_INTERVAL)  # the next request after one stat interval
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(base + url, timeout=60)
        assert err.value.code == 403 and "revoked" in (err.value.headers["X-Error-Message"]
                                                        or ""), err.value.headers
        err.value.close()


# -- marks: trust on first use, said plainly --------------------------------------------


def test_removed_yank_refused_loudly_and_marks_file_private(tmp_path: Path) -> None:
    from registry.trust.marks import RollbackError, marks_path

    store = open_store(str(tmp_path / "s"))
    ModelRelease(store).publish(model_dir(tmp_path, "a"), "m", "1", ledger=[ledger_row()],
                                eval_summary=summary())
    assert pull(store, "m", "1", to=tmp_path / "p0").version == "1"
    yank(store, "m", "1", "broken")
    with pytest.raises(RegistryError, match="yanked"):
        pull(store, "m", "1", to=tmp_path / "p1")
    store.delete("ledger/yanks/m/1.json")
    with pytest.raises(RollbackError, match="trust on first use") as err:
        pull(store, "m", "1", to=tmp_path / "p2")
    assert "never taken as lifted" in str(err.value)
    r = run_cli("pull", "m@1", "--to", str(tmp_path / "p3"), "--store", store.url)
    assert r.returncode != 0 and "trust on first use" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "p2").exists() and not (tmp_path / "p3").exists()
    p = marks_path(None, store.url)
    assert p.stat().st_mode & 0o077 == 0 and p.parent.stat().st_mode & 0o077 == 0
    assert read_head(store, "m", "prod").version is None


def test_signature_claims_are_not_shown_as_facts(world: World, tmp_path: Path) -> None:
    m = world.model("shown")
    with urllib.request.urlopen(f"{world.mirror}/api/v1/models/{m}/aliases/prod/log") as r:
        doc = json.loads(r.read())
    assert all("not verified" in mv["signature_state"] for mv in doc["moves"]), doc
    with urllib.request.urlopen(f"{world.hub}/api/v1/models/{m}/aliases/prod/log") as r:
        doc = json.loads(r.read())
    assert all(mv["signature_state"].startswith("verified") for mv in doc["moves"]), doc
    with urllib.request.urlopen(f"{world.mirror}/models/{m}/aliases/prod") as r:
        page = r.read().decode()
    assert "signed by" not in page and "not verified" in page


def test_hub_refuses_fallback_when_main_pointer_erased(world: World) -> None:
    m = world.model("fallback")
    set_alias(world.store, m, "main", "1", sign_key=world.key)
    base = f"{world.hub}/api/models/registry/{m}/revision/main"
    with urllib.request.urlopen(base) as r:
        assert json.loads(r.read())["registry"]["version"] == "1"
    world.store.delete(f"models/{m}/refs/main")  # the newest release would be served instead
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(base)
    assert err.value.code == 403, err.value.headers
    err.value.close()


def test_a_signed_alias_passes_through_a_keyless_mirror(world: World, tmp_path: Path) -> None:
    m = world.model("through")
    # the mirror hands over the signed move, which this host checks
    assert door_mirror(world, m, tmp_path, tmp_path / "p") == "2"


def test_a_deleted_revocation_is_not_lifted(tmp_path: Path) -> None:
    from registry.gating.ledger import revoke

    store = open_store(str(tmp_path / "s"))
    ModelRelease(store).publish(model_dir(tmp_path, "a"), "m", "1", ledger=[ledger_row()],
                                eval_summary=summary())
    revoke(store, "some-other-source", "withdrawn")
    argv = ["pull", "m@1", "--require-passing", "--store", store.url, "--json"]
    assert run_cli(*argv, "--to", str(tmp_path / "p1")).returncode == 0  # seen revoked
    store.delete("ledger/revocations/some-other-source.json")
    r = run_cli(*argv, "--to", str(tmp_path / "p2"))
    assert r.returncode != 0 and "never taken as lifted" in r.stderr, r.stderr
    assert not (tmp_path / "p2").exists()
