"""The weights reader (issue 43): store -> memory, every byte verified first.

Releases are published with 4 KiB pieces (REGISTRY_PIECE_SIZE) so that tensors
span pieces; every equality is bit for bit against safetensors' ``load_file``
of the stored bytes; every refusal test damages the store for real (local
disk, moto, SeaweedFS) and fails if the check it covers is removed.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors.torch import load as st_load

from registry.errors import (
    DocumentError,
    GateFailedError,
    IntegrityError,
    PieceMismatchError,
    RegistryError,
    ReleaseYankedError,
    SignatureError,
)
from registry.trust.keys import generate, load_public_key
from registry.protocol.layout import release_prefix
from registry.lifecycle.yank import yank
from registry.load import open_weights
from registry.load.pieces import covering
from registry.protocol.manifest import MANIFEST, parse_manifest
from registry.release import ModelRelease
from registry.formats.safetensors_io import write_safetensors
from registry.store import Store, join, open_store
from registry.trust import load_trust, revoke
from tests.conftest import make_store_url, run_cli
from tests.release_util import ledger_row, summary

MODEL = "tiny"
PIECE = 4096


@pytest.fixture(autouse=True)
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGISTRY_PIECE_SIZE", str(PIECE))


def weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "a": rng.standard_normal((40, 50), dtype=np.float32),        # spans 2-3 pieces
        "empty": np.zeros((0, 4), dtype=np.float32),                  # 0 bytes
        "b": rng.standard_normal((64, 33)).astype(ml_dtypes.bfloat16),
        "c": np.arange(7, dtype=np.int64),
        "d": rng.standard_normal((100, 20), dtype=np.float32),
        "scalar": np.array(3.5, dtype=np.float32),                    # shape ()
        "mask": np.array([True, False, True]),
        "h": rng.standard_normal((3, 3)).astype(np.float16),
        "u": np.arange(10, dtype=np.uint8),
    }


def safetensors_bytes(tensors: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    write_safetensors(buf, tensors, metadata={"format": "pt"}, path="model.safetensors")
    return buf.getvalue()


def publish(store: Store, root: Path, version: str, *, seed: int = 0,
            key: Path | None = None) -> None:
    src = root / f"src-{version}"
    src.mkdir(parents=True)
    (src / "model.safetensors").write_bytes(safetensors_bytes(weights(seed)))
    (src / "config.json").write_text('{"hidden_size": 8}\n')
    ModelRelease(store).publish(src, MODEL, version, ledger=[ledger_row()],
                                eval_summary=summary(), sign_key=key)


def stored(store: Store, version: str, path: str = "model.safetensors") -> bytes:
    return store.read_bytes(join(release_prefix(MODEL, version), path))


def entry(store: Store, version: str, path: str = "model.safetensors") -> Any:
    prefix = release_prefix(MODEL, version)
    m = parse_manifest(store.read_bytes(join(prefix, MANIFEST)), source=prefix)
    return next(e for e in m.files if e.path == path)


def reference(store: Store, version: str) -> dict[str, torch.Tensor]:
    return st_load(stored(store, version))


@pytest.fixture(params=["local", "s3", "seaweed"])
def durable(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return open_store(make_store_url(request.param, request, tmp_path))


@pytest.fixture(params=["local", "s3"])
def store2(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return open_store(make_store_url(request.param, request, tmp_path))


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool(
        torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
        if a.numel() else True)


# -- equality -----------------------------------------------------------------------


def test_every_tensor_equals_load_file_bit_for_bit(durable: Store, tmp_path: Path) -> None:
    publish(durable, tmp_path, "1")
    ref = reference(durable, "1")
    assert entry(durable, "1").pieces is not None  # the file has several pieces
    with open_weights(f"{MODEL}@1", store=durable) as w:
        header = w.files["model.safetensors"].header
        assert w.keys() == list(header.tensors) and sorted(w.keys()) == sorted(weights())
        got = dict(w.tensors())
        assert w.metadata()["format"] == "pt"
        assert w.stats.bytes == entry(durable, "1").size  # every byte read once
    assert set(got) == set(ref)
    for name in ref:
        assert same(got[name], ref[name]), name
    with open_weights(f"{MODEL}@1", store=durable, framework="np") as w:
        sd = w.state_dict()
    for name, t in ref.items():  # numpy arrays: the stored bytes, the stored shape
        assert tuple(sd[name].shape) == tuple(t.shape), name
        assert sd[name].reshape(-1).view(np.uint8).tobytes() == \
            t.reshape(-1).view(torch.uint8).numpy().tobytes(), name


def test_get_tensor_and_slices_read_only_their_pieces(store2: Store, tmp_path: Path) -> None:
    publish(store2, tmp_path, "1")
    ref = reference(store2, "1")
    e = entry(store2, "1")
    with open_weights(f"{MODEL}@1", store=store2) as w:
        assert same(w.get_tensor("d"), ref["d"])
        header_and_d = w.stats.bytes
        assert header_and_d < e.size  # not the whole file
        s = w.get_slice("a")
        assert s.get_shape() == [40, 50] and s.get_dtype() == "F32"
        before = w.stats.bytes
        rows = s[0:4]  # 800 bytes inside one or two pieces
        assert w.stats.bytes - before <= 2 * PIECE
        assert same(rows, ref["a"][0:4])
        for index in [(slice(10, 30),), (5,), (-1,), (slice(None, None, 7),),
                      (slice(3, 9), slice(2, 5)), (slice(None), slice(40, 50)), (Ellipsis,)]:
            assert same(s[index], ref["a"][index].contiguous()), index
        assert same(w.get_tensor("empty"), ref["empty"])
        assert same(w.get_slice("c")[2:5], ref["c"][2:5])
        assert same(w.get_slice("scalar")[...], ref["scalar"]) and w["scalar"].shape == ()
        assert same(w.get_tensor("mask"), ref["mask"]) and same(w.get_tensor("h"), ref["h"])


def test_a_slice_spanning_two_pieces(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    publish(store, tmp_path, "1")
    ref = reference(store, "1")
    with open_weights(f"{MODEL}@1", store=store) as w:
        info = w._tensors["a"][1]
        start = w.files["model.safetensors"].header.data_start + info.begin
        # the rows around the first piece boundary inside "a"
        boundary = (start // PIECE + 1) * PIECE
        row = (boundary - start) // 200
        assert len(covering(entry(store, "1"), start + (row - 1) * 200,
                            start + (row + 1) * 200)) == 2
        assert same(w.get_slice("a")[row - 1:row + 1], ref["a"][row - 1:row + 1])


def test_int4_and_bf16_releases(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(5)
    (src / "model.safetensors").write_bytes(safetensors_bytes(
        {"w": rng.standard_normal((16, 64), dtype=np.float32),
         "v": rng.standard_normal((8,), dtype=np.float32)}))
    (src / "config.json").write_text('{"hidden_size": 8}\n')
    for version, dtype in (("int4", "int4"), ("bf16", "bf16")):
        ModelRelease(store).publish(src, MODEL, version, ledger=[ledger_row()],
                                    eval_summary=summary(), dtype=dtype, group_size=32)
        ref = reference(store, version)
        with open_weights(f"{MODEL}@{version}", store=store) as w:
            got = w.state_dict()
            for name in ref:
                assert same(got[name], ref[name]), (version, name)
            if version == "int4":
                assert w.metadata()["quant"] == "int4"
                dense = w.state_dict(dequantize=True)
                from registry.release.convert import dequantize_int4

                want = dequantize_int4(ref["w.qweight"].numpy(), ref["w.scales"].float().numpy(),
                                       32)
                assert set(dense) == {"w", "v"} and np.array_equal(dense["w"].numpy(), want)


def test_checkpoint_step(tmp_path: Path) -> None:
    from registry.protocol.commit import commit_local_directory
    from registry.protocol.layout import step_prefix

    store = open_store(str(tmp_path / "store"))
    src = tmp_path / "step"
    src.mkdir()
    (src / "model.safetensors").write_bytes(safetensors_bytes(weights(3)))
    (src / "config.json").write_text('{"hidden_size": 8}\n')
    commit_local_directory(store, src, step_prefix("run-1", 40), kind="checkpoint",
                           run_id="run-1", step=40)
    ref = st_load((src / "model.safetensors").read_bytes())
    for ref_name in ("run-1@40", "run-1@step-000040"):
        with open_weights(ref_name, store=store, checkpoint=True) as w:
            got = w.state_dict()
        assert all(same(got[n], ref[n]) for n in ref)


# -- refusals -------------------------------------------------------------------------


def collect(w: Any) -> tuple[dict[str, torch.Tensor], BaseException | None]:
    got: dict[str, torch.Tensor] = {}
    try:
        for name, t in w.tensors():
            got[name] = t
    except RegistryError as e:
        return got, e
    return got, None


def test_tampered_piece_in_the_middle_of_a_tensor(durable: Store, tmp_path: Path) -> None:
    publish(durable, tmp_path, "1")
    ref = reference(durable, "1")
    data = bytearray(stored(durable, "1"))
    e = entry(durable, "1")
    with open_weights(f"{MODEL}@1", store=durable) as w:
        f = w.files["model.safetensors"]
        info = f.header.tensors["a"]
        middle = f.header.data_start + (info.begin + info.end) // 2
        data[middle] ^= 0x01
        durable.write_bytes(join(release_prefix(MODEL, "1"), "model.safetensors"), bytes(data))
        got, err = collect(w)
    assert isinstance(err, PieceMismatchError)
    k = middle // PIECE
    assert err.piece == k and err.path == "model.safetensors"
    assert err.expected_state == (e.pieces.states[k] if k < len(e.pieces.states) else e.sha256)
    assert err.expected_state in str(err) and "piece" in str(err)
    assert "a" not in got
    for name, t in got.items():  # what was handed out touches no bad byte
        i = f.header.tensors[name]
        assert k not in covering(e, f.header.data_start + i.begin, f.header.data_start + i.end)
        assert same(t, ref[name])
    with open_weights(f"{MODEL}@1", store=durable) as w, pytest.raises(PieceMismatchError):
        w.get_tensor("a")
    with open_weights(f"{MODEL}@1", store=durable) as w, pytest.raises(PieceMismatchError):
        w.get_slice("a")[:]


def test_truncated_object(store2: Store, tmp_path: Path) -> None:
    publish(store2, tmp_path, "1")
    key = join(release_prefix(MODEL, "1"), "model.safetensors")
    store2.write_bytes(key, stored(store2, "1")[:-100])
    with open_weights(f"{MODEL}@1", store=store2) as w:
        last = list(w.files["model.safetensors"].header.tensors)[-1]
        got, err = collect(w)
    assert isinstance(err, IntegrityError) and "truncated" in str(err)
    assert last not in got  # the last tensor sits in the short piece


def test_object_replaced_between_plan_and_read(store2: Store, tmp_path: Path) -> None:
    """The header the plan was made from and the bytes read later differ: a
    store writer replaced the object (same size, other values; and a renamed
    tensor, same length)."""
    publish(store2, tmp_path, "1")
    key = join(release_prefix(MODEL, "1"), "model.safetensors")
    original = stored(store2, "1")
    n = int.from_bytes(original[:8], "little")
    values = bytearray(original)
    values[8 + n:] = bytes(b ^ 0x55 for b in original[8 + n:])  # same header, other values
    renamed = original[:8] + original[8:8 + n].replace(b'"a":{', b'"z":{') + original[8 + n:]
    for other in (bytes(values), renamed):
        assert len(other) == len(original) and other != original
        store2.write_bytes(key, original)
        with open_weights(f"{MODEL}@1", store=store2) as w:
            store2.write_bytes(key, other)
            got, err = collect(w)
        assert isinstance(err, IntegrityError), err
        assert got == {}  # every tensor waits for the header's piece, which failed
        with pytest.raises(IntegrityError):
            with open_weights(f"{MODEL}@1", store=store2) as w2:
                w2.state_dict()


def test_swapped_shard_is_refused(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    src = tmp_path / "sharded"
    src.mkdir()
    parts = [{f"l{i}.w": t for i, t in enumerate(weights(s).values())
              if t.ndim == 2 and t.dtype == np.float32} for s in (1, 2)]  # copied as is
    parts[1] = {n.replace("l", "m"): t for n, t in parts[1].items()}
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    wmap = {}
    for name, part in zip(names, parts):
        (src / name).write_bytes(safetensors_bytes(part))
        wmap |= {t: name for t in part}
    (src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wmap}))
    (src / "config.json").write_text('{"hidden_size": 8}\n')
    ModelRelease(store).publish(src, MODEL, "1", ledger=[ledger_row()], eval_summary=summary())
    prefix = release_prefix(MODEL, "1")
    ref = {}
    for s in names:
        ref.update(st_load(store.read_bytes(join(prefix, s))))
    with open_weights(f"{MODEL}@1", store=store) as w:
        got = w.state_dict()
    assert set(got) == set(ref) and all(same(got[n], ref[n]) for n in ref)
    store.write_bytes(join(prefix, names[0]), store.read_bytes(join(prefix, names[1])))
    with pytest.raises((DocumentError, IntegrityError)):
        with open_weights(f"{MODEL}@1", store=store) as w:
            w.state_dict()


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, tuple[Path, Path]]:
    out = {}
    (tmp_path / "keys").mkdir()
    for n in ("release", "attacker"):
        priv, pub, _ = generate(tmp_path / "keys" / f"{n}.pem",
                                public_path=tmp_path / "keys" / f"{n}.pub")
        out[n] = (priv, pub)
    return out


def test_trust_rules_as_pull(store2: Store, tmp_path: Path,
                             keys: dict[str, tuple[Path, Path]]) -> None:
    publish(store2, tmp_path, "signed", key=keys["release"][0])
    publish(store2, tmp_path, "unsigned")
    publish(store2, tmp_path, "other", key=keys["attacker"][0])
    trust = load_trust([keys["release"][1]])
    with open_weights(f"{MODEL}@signed", store=store2, trust=trust) as w:
        assert set(w.state_dict()) == set(weights())
    # damage the weights too: the refusal must come before any weights byte is read
    for version in ("unsigned", "other"):
        key = join(release_prefix(MODEL, version), "model.safetensors")
        store2.write_bytes(key, b"\0" * 16)
        with pytest.raises(SignatureError):
            open_weights(f"{MODEL}@{version}", store=store2, trust=trust)
    # a revoked key: keys folder with revoked.json
    folder = tmp_path / "trusted"
    folder.mkdir()
    (folder / "release.pub").write_bytes(keys["release"][1].read_bytes())
    revoke(folder, load_public_key(keys["release"][1]), "leaked")
    with pytest.raises(SignatureError):
        open_weights(f"{MODEL}@signed", store=store2, trust=load_trust(folder=folder))
    # yanked
    yank(store2, MODEL, "signed", "bad evals")
    with pytest.raises(ReleaseYankedError):
        open_weights(f"{MODEL}@signed", store=store2, trust=trust)
    with open_weights(f"{MODEL}@signed", store=store2, trust=trust, allow_yanked=True) as w:
        assert "a" in w.keys()


def test_failing_gates_refused_with_require_passing(tmp_path: Path) -> None:
    from registry.gating.ledger import revoke as revoke_source

    store = open_store(str(tmp_path / "store"))
    publish(store, tmp_path, "1")
    revoke_source(store, "wiki", "license withdrawn")
    with pytest.raises(GateFailedError):
        open_weights(f"{MODEL}@1", store=store, require_passing=True)
    with open_weights(f"{MODEL}@1", store=store) as w:
        assert w.get_tensor("c").tolist() == list(range(7))


# -- the pull cache --------------------------------------------------------------------


def test_place_then_offline_without_the_store(store2: Store, tmp_path: Path) -> None:
    publish(store2, tmp_path, "1")
    ref = reference(store2, "1")
    cache = tmp_path / "cache"
    with open_weights(f"{MODEL}@1", store=store2, cache=cache, place=True) as w:
        w.state_dict()
    blob = cache / "blobs" / "sha256" / entry(store2, "1").sha256
    assert blob.read_bytes() == stored(store2, "1")
    store2.delete_prefix(release_prefix(MODEL, "1"))  # the store no longer helps
    with open_weights(f"{MODEL}@1", cache=cache, offline=True) as w:
        got = w.state_dict()
    assert all(same(got[n], ref[n]) for n in ref)
    # a blob changed under the cache (same size) is caught by the pieces
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.chmod(0o644)
    blob.write_bytes(bytes(data))
    with open_weights(f"{MODEL}@1", cache=cache, offline=True) as w:
        _, err = collect(w)
    assert isinstance(err, PieceMismatchError)


# -- the command line -------------------------------------------------------------------


def test_cli_load(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    store = open_store(url)
    publish(store, tmp_path, "1")
    p = run_cli("load", f"{MODEL}@1", "--store", url, "--json", "--check", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["tensors"] == len(weights()) and doc["bytes"] == entry(store, "1").size
    assert doc["version"] == "1"
    # the phases: resolve (admission and plan), then first and last tensor
    assert doc["resolve_seconds"] > 0 and 0 < doc["first_tensor_seconds"] <= doc["seconds"]
    p = run_cli("load", f"{MODEL}@1", "--store", url, "--check", "--list", cwd=tmp_path)
    assert p.returncode == 0 and f"loaded tiny@1: {len(weights())} tensors" in p.stdout
    assert "a\tF32\t[40, 50]" in p.stdout
    data = bytearray(stored(store, "1"))
    data[-50] ^= 1
    store.write_bytes(join(release_prefix(MODEL, "1"), "model.safetensors"), bytes(data))
    p = run_cli("load", f"{MODEL}@1", "--store", url, "--check", cwd=tmp_path)
    assert p.returncode == 1 and "model.safetensors" in p.stderr and "piece" in p.stderr
    assert "Traceback" not in p.stderr
    # a header broken by a store writer (not valid UTF-8) is a digest failure,
    # as pull reports it, not a format error of a released file
    data = bytearray(stored(store, "1"))
    data[data.index(b'"a"') + 1] = 0xFF
    store.write_bytes(join(release_prefix(MODEL, "1"), "model.safetensors"), bytes(data))
    p = run_cli("load", f"{MODEL}@1", "--store", url, "--check", cwd=tmp_path)
    assert p.returncode == 1 and "model.safetensors" in p.stderr and "piece" in p.stderr, \
        p.stderr
    p = run_cli("load", f"{MODEL}@9", "--store", url, "--check", cwd=tmp_path)
    assert p.returncode == 3 and "Traceback" not in p.stderr
    p = run_cli("load", f"{MODEL}@", "--store", url, "--check", cwd=tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr


# -- a server that answers other bytes (the fault proxy in front of moto) ---------------


def test_server_faults_through_the_proxy(proxy: Any, s3_bucket: str, tmp_path: Path) -> None:
    from tests.conftest import proxied
    from tests.support.faultproxy import Action, ignore_range

    url = f"s3://{s3_bucket}/reg"
    publish(open_store(url), tmp_path, "1")
    store = proxied(url, proxy)
    ref = reference(store, "1")
    weights_gets = [0]

    def fake_header_once(req: Any) -> Action | None:
        """The planning read of the header gets a renamed tensor; later reads
        the stored bytes: a server (or cache) answering two views."""
        if req.op == "GetObject" and req.key.endswith("model.safetensors") and \
                req.headers.get("Range", req.headers.get("range", "")).startswith("bytes=0-"):
            weights_gets[0] += 1
            if weights_gets[0] == 1:
                return Action("edit", edit_response=lambda r, st, h, body: (
                    st, [(k, v) for k, v in h if not k.lower().startswith("x-amz-checksum")],
                    body.replace(b'"a":{', b'"z":{')))
        return None

    proxy.rules.append(fake_header_once)
    with open_weights(f"{MODEL}@1", store=store) as w:
        assert "z" in w.keys()  # planned from the fake header
        got, err = collect(w)
    assert isinstance(err, IntegrityError) and "header changed" in str(err), err
    assert got == {}
    proxy.reset()

    def corrupt_middle(req: Any) -> Action | None:
        rng = req.headers.get("Range", req.headers.get("range", ""))
        if req.op == "GetObject" and req.key.endswith("model.safetensors") and \
                rng.startswith(f"bytes={2 * PIECE}-"):
            return Action("corrupt")
        return None

    proxy.rules.append(corrupt_middle)
    with open_weights(f"{MODEL}@1", store=store) as w:
        got, err = collect(w)
    assert isinstance(err, PieceMismatchError) and err.piece == 2
    assert all(same(t, ref[n]) for n, t in got.items())
    proxy.reset()
    proxy.rules.append(ignore_range)
    with pytest.raises(RegistryError), open_weights(f"{MODEL}@1", store=store) as w:
        w.state_dict()


# -- vLLM and the folder of small files ----------------------------------------------------


def test_config_to_writes_every_file_but_the_weights(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    store = open_store(url)
    publish(store, tmp_path, "1")
    p = run_cli("load", f"{MODEL}@1", "--store", url, "--check", "--config-to",
                str(tmp_path / "cfg"), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    names = sorted(str(q.relative_to(tmp_path / "cfg")) for q in (tmp_path / "cfg").rglob("*")
                   if q.is_file())
    assert "config.json" in names and "model.safetensors" not in names
    assert (tmp_path / "cfg" / "config.json").read_bytes() == stored(store, "1", "config.json")


def test_vllm_plugin_options_and_registration() -> None:
    from registry.errors import UsageError
    from registry.load.vllm_plugin import options

    assert options('{"ref": "tiny@prod", "store": "s3://b/r"}') == {"ref": "tiny@prod",
                                                                     "store": "s3://b/r"}
    with pytest.raises(UsageError):
        options({"store": "x"})
    with pytest.raises(UsageError):
        options({"ref": "tiny@1", "evil": 1})
    from importlib.metadata import entry_points

    eps = [e for e in entry_points(group="vllm.general_plugins") if e.name == "registry"]
    assert eps and eps[0].value == "registry.load.vllm_plugin:register"


def test_vllm_registers_the_loader() -> None:
    pytest.importorskip("vllm", reason="vLLM is not installed here (it is not a dependency); "
                                       "the loader is registered where it is")
    from registry.load.vllm_plugin import register

    register()
    from vllm.model_executor.model_loader import get_model_loader  # noqa: F401


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU on this host")
def test_cuda_device(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    publish(store, tmp_path, "1")
    ref = reference(store, "1")
    with open_weights(f"{MODEL}@1", store=store, device="cuda:0") as w:
        got = w.state_dict()
    assert all(got[n].device.type == "cuda" and same(got[n].cpu(), ref[n]) for n in ref)


def test_a_connection_lost_mid_piece_is_read_again(proxy: Any, s3_bucket: str,
                                                   tmp_path: Path) -> None:
    from tests.conftest import proxied
    from tests.support.faultproxy import Action

    url = f"s3://{s3_bucket}/reg"
    publish(open_store(url), tmp_path, "1")
    store = proxied(url, proxy, retry_attempts=1)
    ref = reference(store, "1")
    resets = []

    def reset_twice(req: Any) -> Action | None:
        rng = req.headers.get("Range", req.headers.get("range", ""))
        if req.op == "GetObject" and rng.startswith(f"bytes={PIECE}-") and len(resets) < 2:
            resets.append(rng)
            return Action("reset_after")
        return None

    proxy.rules.append(reset_twice)
    with open_weights(f"{MODEL}@1", store=store) as w:
        got = w.state_dict()
    assert len(resets) == 2 and all(same(got[n], ref[n]) for n in ref)


def test_a_bare_model_id_means_main_else_the_newest_passing(tmp_path: Path,
                                                           keys: dict[str, tuple[Path, Path]]
                                                           ) -> None:
    """Issue 44 item 3: ``pull model`` / ``load model`` without ``@``."""
    from registry.refs.aliases import move_alias
    from registry.gating.ledger import revoke as revoke_source

    url = str(tmp_path / "store")
    store = open_store(url)
    publish(store, tmp_path, "1", seed=1)
    publish(store, tmp_path, "2", seed=2, key=keys["release"][0])
    with open_weights(MODEL, store=store) as w:
        assert w.version == "2"  # the newest passing
    yank(store, MODEL, "2", "bad")
    with open_weights(MODEL, store=store) as w:
        assert w.version == "1"  # a yanked release is never the default
    trust = load_trust([keys["release"][1]])
    with pytest.raises(RegistryError, match="main"):
        open_weights(MODEL, store=store, trust=trust)  # with keys: only a signed main
    move_alias(store, MODEL, "main", "1")
    p = run_cli("pull", MODEL, "--store", url, "--to", str(tmp_path / "t"), "--cache",
                str(tmp_path / "c"), "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["version"] == "1"
    assert (tmp_path / "t" / "model.safetensors").read_bytes() == stored(store, "1")
    revoke_source(store, "wiki", "withdrawn")
    store.delete(join("models", MODEL, "refs", "main"))
    p = run_cli("pull", MODEL, "--store", url, "--to", str(tmp_path / "t2"), "--cache",
                str(tmp_path / "c"), cwd=tmp_path)
    assert p.returncode == 3 and "no release passing" in p.stderr, p.stderr
