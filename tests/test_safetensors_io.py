"""Tests of registry.formats.safetensors_io against the reference safetensors library."""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tracemalloc
import types
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import safetensors
import safetensors.numpy

from registry.errors import SafetensorsError
from registry.formats.safetensors_io import (
    DTYPE_NAMES,
    DTYPES,
    LazyTensor,
    check_optimizer_state,
    iter_tensors,
    read_header,
    read_safetensors,
    read_tensor,
    write_safetensors,
)
from tests.conftest import require_engines

MiB = 1 << 20


def sample() -> dict[str, np.ndarray]:
    return {
        "w": np.arange(6, dtype=np.float32).reshape(2, 3),
        "bytes": np.array([0, 1, 255], dtype=np.uint8),
        "ids": np.array([-(2**40), 7], dtype=np.int64),
        "scalar": np.array(2.5, dtype=np.float32),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }


def dump(tensors: Any, metadata: dict[str, str] | None = None) -> bytes:
    sink = io.BytesIO()
    written = write_safetensors(sink, tensors, metadata=metadata)
    assert written == len(sink.getvalue())
    return sink.getvalue()


def load(data: bytes) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    return read_safetensors(io.BytesIO(data), path="t.safetensors", file_size=len(data))


def assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert got.keys() == want.keys()
    for name, array in want.items():
        assert got[name].dtype == array.dtype and got[name].shape == array.shape, name
        assert got[name].tobytes() == array.tobytes(), name


def reference_serialize(tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None
                        ) -> bytes:
    """The reference writer via TensorSpec, which (unlike safetensors.numpy) takes bfloat16."""
    specs = {name: safetensors.TensorSpec(dtype=a.dtype.name, shape=list(a.shape),
                                          data_ptr=a.ctypes.data, data_len=a.nbytes)
             for name, a in tensors.items()}
    return bytes(safetensors.serialize(specs, metadata=metadata))


def reference_deserialize(data: bytes) -> dict[str, np.ndarray]:
    return {name: np.frombuffer(view["data"], dtype=DTYPES[view["dtype"]]).reshape(view["shape"])
            for name, view in safetensors.deserialize(data)}


# -- compatibility with the reference -------------------------------------------------


@pytest.mark.parametrize("metadata", [None, {"format": "tinyllm"}])
def test_bytes_equal_reference_numpy_and_both_read_each_other(metadata):
    ours = dump(sample(), metadata)
    theirs = safetensors.numpy.save(sample(), metadata=metadata)
    assert ours == theirs
    assert_same(safetensors.numpy.load(ours), sample())
    tensors, got_metadata = load(theirs)
    assert_same(tensors, sample())
    assert got_metadata == (metadata or {})


def test_bf16_round_trip_against_reference():
    tensors = {"w": np.array([[1.5, -2.0], [0.0, 3.25]], dtype=ml_dtypes.bfloat16),
               "b": np.array(1.0, dtype=ml_dtypes.bfloat16)}
    ours = dump(tensors, {"format": "tinyllm"})
    assert ours == reference_serialize(tensors, {"format": "tinyllm"})
    assert_same(reference_deserialize(ours), tensors)
    assert_same(load(reference_serialize(tensors))[0], tensors)


def test_every_dtype_in_the_reference_order():
    # The reference sorts by dtype first; one tensor of each pins the whole order.
    tensors = {f"t{name}": np.zeros((2,), dtype=dtype) for name, dtype in DTYPES.items()}
    assert dump(tensors) == reference_serialize(tensors)
    assert_same(load(dump(tensors))[0], tensors)
    assert DTYPE_NAMES[np.dtype(ml_dtypes.bfloat16)] == "BF16"


def test_metadata_with_many_keys_is_sorted_and_reference_compatible(tmp_path):
    # The reference emits metadata in hash order, so only the content can match.
    metadata = {"step": "5", "format": "tinyllm", "optimizer": "adamw"}
    ours = dump(sample(), metadata)
    length = int.from_bytes(ours[:8], "little")
    assert list(json.loads(ours[8:8 + length])["__metadata__"]) == sorted(metadata)
    (tmp_path / "m.safetensors").write_bytes(ours)
    with safetensors.safe_open(tmp_path / "m.safetensors", "np") as f:
        assert f.metadata() == metadata
    theirs = safetensors.numpy.save(sample(), metadata=metadata)
    assert len(theirs) == len(ours) and theirs[8 + length:] == ours[8 + length:]
    assert load(theirs)[1] == metadata


def test_big_endian_non_contiguous_and_array_like_inputs():
    class ArrayLike:
        def __array__(self, dtype=None, copy=None):
            return np.array([1, 2], dtype=np.int32)

    base = np.arange(6, dtype=np.float32).reshape(2, 3)
    data = dump({"be": base.astype(">f4"), "t": base.T, "list": [[1.0, 2.0]],
                 "like": ArrayLike()})
    loaded = safetensors.numpy.load(data)
    np.testing.assert_array_equal(loaded["be"], base)
    np.testing.assert_array_equal(loaded["t"], base.T)
    np.testing.assert_array_equal(loaded["list"], np.array([[1.0, 2.0]]))
    np.testing.assert_array_equal(loaded["like"], np.array([1, 2], dtype=np.int32))


# -- streaming writer --------------------------------------------------------------------


class WriteOnly:
    """A sink with nothing but ``write``, like an upload stream; accepts 3 bytes at a time."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.largest = 0

    def write(self, chunk: memoryview | bytes) -> int:
        self.largest = max(self.largest, len(chunk))
        self.data += bytes(chunk)[:3]
        return min(3, len(chunk))


def test_writer_streams_to_a_write_only_object():
    tensors = {f"layer{i}": np.full((64, 64), i, dtype=np.float32) for i in range(4)}
    sink = WriteOnly()
    written = write_safetensors(sink, tensors, metadata={"format": "tinyllm"})
    assert bytes(sink.data) == safetensors.numpy.save(tensors, metadata={"format": "tinyllm"})
    assert written == len(sink.data)
    assert sink.largest <= 64 * 64 * 4  # one tensor per write, never the whole file


def test_lazy_conversion_keeps_about_one_tensor_in_memory():
    count, shape = 16, (256, 256)  # 16 x 256 KiB of F32
    source = dump({f"p{i:02d}": np.full(shape, i, dtype=np.float32) for i in range(count)})
    src = io.BytesIO(source)
    header = read_header(src, path="model.safetensors", file_size=len(source))

    class HashSink:
        def __init__(self) -> None:
            self.digest = hashlib.sha256()

        def write(self, chunk: memoryview) -> int:
            self.digest.update(chunk)
            return len(chunk)

    def convert(name: str) -> np.ndarray:
        return read_tensor(src, header, name, path="model.safetensors").astype(ml_dtypes.bfloat16)

    tracemalloc.start()
    try:
        write_safetensors(HashSink(), {
            name: LazyTensor("BF16", info.shape, lambda name=name: convert(name))
            for name, info in header.tensors.items()})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 * MiB  # 4 MiB in, 2 MiB out; one F32 + one BF16 tensor is 384 KiB


def test_iter_tensors_yields_in_file_order():
    data = dump(sample())
    names = [name for name, _ in iter_tensors(io.BytesIO(data), path="x", file_size=len(data))]
    assert names == list(read_header(io.BytesIO(data), path="x", file_size=len(data)).tensors)
    assert sorted(names) == sorted(sample())


@pytest.mark.parametrize(("tensors", "metadata", "rule"), [
    ({"": np.zeros(1)}, None, "non-empty string"),
    ({"__metadata__": np.zeros(1)}, None, "other than '__metadata__'"),
    ([("a", np.zeros(1)), ("a", np.ones(1))], None, "occurs twice"),
    ({"a": np.zeros(1)}, {"step": 5}, "must be strings"),
    ({"a": np.array(["text"])}, None, "no safetensors equivalent"),
    ({"a": LazyTensor("F32", (2,), lambda: np.zeros(3, np.float32))}, None,
     "data is F32 [3], declared F32 [2]"),
    ({"a": LazyTensor("Q4", (2,), lambda: np.zeros(2))}, None, "dtype Q4"),
])
def test_writer_refuses_bad_input(tensors, metadata, rule):
    with pytest.raises(SafetensorsError, match=rule.replace("[", r"\[")) as caught:
        write_safetensors(io.BytesIO(), tensors, metadata=metadata, path="out.safetensors")
    assert caught.value.path == "out.safetensors"


def test_torch_like_tensors_are_converted_without_torch(monkeypatch):
    # torch is not installed here: a stand-in exercises the detach/cpu/view path.
    fake_torch = types.ModuleType("torch")
    fake_torch.int16 = "torch.int16"
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    bits = np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16).view(np.int16)

    class Tensor:
        __module__ = "torch"
        dtype, shape = "torch.bfloat16", (2,)

        def detach(self):
            return self

        def cpu(self):
            return self

        def view(self, dtype):
            assert dtype == "torch.int16"
            return types.SimpleNamespace(numpy=lambda: bits)

    loaded = reference_deserialize(dump({"w": Tensor()}))
    np.testing.assert_array_equal(loaded["w"], np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16))


def test_real_torch_tensors():
    """Runs in CI (REGISTRY_REQUIRE_ENGINES=1: torch is required there)."""
    (torch,) = require_engines("torch")
    data = dump({"w": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
                 "f": torch.ones(2, 2, requires_grad=True)})
    loaded = reference_deserialize(data)
    np.testing.assert_array_equal(loaded["f"], np.ones((2, 2), np.float32))
    assert loaded["w"].dtype == ml_dtypes.bfloat16


# -- hostile headers -------------------------------------------------------------------------


class GuardedReader(io.BytesIO):
    """Fails the test if the parser asks for a large read before validating a length."""

    def read(self, size: int | None = -1) -> bytes:
        assert size is not None and 0 <= size <= MiB, f"read({size})"
        return super().read(size)


def raw(header: Any, data: bytes = b"", *, length: int | None = None) -> bytes:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    return (len(text) if length is None else length).to_bytes(8, "little") + text + data


def f32(shape: list[int], begin: int, end: int) -> dict[str, Any]:
    return {"dtype": "F32", "shape": shape, "data_offsets": [begin, end]}


LFS = (b"version https://git-lfs.github.com/spec/v1\n"
       b"oid sha256:" + b"a" * 64 + b"\nsize 123456789\n")

HOSTILE = {
    "shorter than 8 bytes": (b"\x01\x00", None, "shorter than the 8-byte header length"),
    "length beyond file": (raw(b"{}", length=1000), None,
                           "header length 1000 bytes exceeds the file (10 bytes)"),
    "length 2**40": (raw(b"{}", length=2**40), None, "header length 1099511627776 bytes "
                                                     "exceeds the file"),
    "length over 100 MB": (raw(b"{}", length=2**40), 2**41, "exceeds the 100000000-byte limit"),
    "header cut short": (raw(b"{}", length=64), 72, "truncated: expected 64 bytes, read 2"),
    "git lfs pointer": (LFS, None, "a Git LFS pointer, not safetensors weights"),
    "not utf-8": (raw(b'{"\xff": 1}'), None, "not valid UTF-8"),
    "not json": (raw(b"{not json}"), None, "not valid JSON"),
    "not an object": (raw(b"[1, 2]"), None, "not a JSON object"),
    "deeply nested": (raw(b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"), None,
                      "nested too deeply"),
    "duplicate key": (raw(b'{"a": {}, "a": {}}'), None, "key \"a\" twice"),
    "nan": (raw(b'{"__metadata__": {"x": NaN}}'), None, "contains NaN"),
    "unknown dtype": (raw({"a": {"dtype": "Q8", "shape": [1], "data_offsets": [0, 1]}},
                          b"\0"), None, "tensor 'a': unknown dtype \"Q8\""),
    "negative shape": (raw({"a": f32([-1], 0, 0)}), None, "non-negative integers, got [-1]"),
    "float shape": (raw({"a": f32([2.0], 0, 8)}, b"\0" * 8), None, "got [2.0]"),
    "bool shape": (raw({"a": f32([True], 0, 4)}, b"\0" * 4), None, "got [true]"),
    "shape not a list": (raw({"a": f32(3, 0, 12)}, b"\0" * 12), None, "got 3"),
    "shape overflow": (raw({"a": f32([2**40, 2**40], 0, 0)}), None, "overflows 64 bits"),
    "begin after end": (raw({"a": f32([0], 8, 0)}), None, "0 <= begin <= end"),
    "three offsets": (raw({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}},
                          b"\0" * 4), None, "data_offsets must be"),
    "missing key": (raw({"a": {"dtype": "F32", "shape": [1]}}), None, "lacks ['data_offsets']"),
    "extra key": (raw({"a": {**f32([1], 0, 4), "x": 1}}, b"\0" * 4), None, "unknown keys ['x']"),
    "entry not object": (raw({"a": [1]}), None, "entry is not a JSON object"),
    "overlap": (raw({"a": f32([2], 0, 8), "b": f32([2], 4, 12)}, b"\0" * 12), None,
                "tensor 'b': data_offsets [4, 12] overlap tensor 'a' ending at 8"),
    "gap": (raw({"a": f32([2], 0, 8), "b": f32([2], 12, 20)}, b"\0" * 20), None,
            "tensor 'b': data_offsets [12, 20] leave a gap of 4 bytes after tensor 'a'"),
    "gap at start": (raw({"a": f32([2], 4, 12)}, b"\0" * 12), None, "after the data start"),
    "span not shape x dtype": (raw({"a": f32([3], 0, 8)}, b"\0" * 8), None,
                               "span 8 bytes but F32 [3] needs 12"),
    "truncated data": (raw({"a": f32([4], 0, 16)}, b"\0" * 8), None,
                       "truncated: tensors need 16 bytes of data, the file has 8"),
    "trailing bytes": (raw({"a": f32([1], 0, 4)}, b"\0" * 8), None, "has trailing bytes"),
    "metadata value not string": (raw({"__metadata__": {"step": 5}}), None,
                                  "__metadata__ \"step\": value 5 is not a string"),
    "metadata not object": (raw({"__metadata__": ["x"]}), None, "must be an object"),
}


@pytest.mark.parametrize("case", HOSTILE, ids=list(HOSTILE))
def test_hostile_header_is_refused_without_big_allocation(case):
    data, file_size, rule = HOSTILE[case]
    tracemalloc.start()
    try:
        with pytest.raises(SafetensorsError) as caught:
            read_header(GuardedReader(data), path="m.safetensors",
                        file_size=len(data) if file_size is None else file_size)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert rule in caught.value.rule
    assert str(caught.value) == f"m.safetensors: {caught.value.rule}"
    assert "\n" not in caught.value.rule
    assert peak < 4 * MiB  # the deeply nested case parses a 200 KB header


def test_reference_refuses_what_we_refuse():
    # Our rules are the reference's (except the stricter extra-key rule).
    for case in ("overlap", "gap", "span not shape x dtype", "truncated data",
                 "unknown dtype", "length beyond file", "not json"):
        with pytest.raises(Exception):  # noqa: B017 - the reference raises several types
            safetensors.numpy.load(HOSTILE[case][0])


def test_read_tensor_detects_a_file_shorter_than_announced():
    data = dump({"a": np.ones(4, np.float32)})
    short = io.BytesIO(data[:-4])
    header = read_header(short, path="m", file_size=len(data))
    with pytest.raises(SafetensorsError, match="truncated: tensor needs 16 bytes, read 12"):
        read_tensor(short, header, "a", path="m")
    with pytest.raises(SafetensorsError, match="no tensor named 'b'"):
        read_tensor(short, header, "b", path="m")


def test_iter_tensors_checks_the_header_at_call_time():
    data = HOSTILE["gap"][0]
    with pytest.raises(SafetensorsError, match="gap"):
        iter_tensors(io.BytesIO(data), path="m", file_size=len(data))


def test_reader_without_readinto():
    class ReadSeek:
        def __init__(self, data: bytes) -> None:
            self.inner = io.BytesIO(data)
            self.read, self.seek = self.inner.read, self.inner.seek

    data = dump(sample())
    tensors, _ = read_safetensors(ReadSeek(data), path="m", file_size=len(data))
    assert_same(tensors, sample())


# -- optimizer state --------------------------------------------------------------------------

MODEL = {"w": (2, 3), "b": (3,)}


def adamw_state(**changes: np.ndarray) -> dict[str, np.ndarray]:
    state = {"w.exp_avg": np.zeros((2, 3), np.float32), "w.exp_avg_sq": np.zeros((2, 3), np.float32),
             "b.exp_avg": np.zeros(3, np.float32), "b.exp_avg_sq": np.zeros(3, np.float32)}
    return {**state, **changes}


def test_valid_optimizer_states():
    check_optimizer_state(adamw_state(), MODEL, optimizer="adamw", path="o")
    data = dump(adamw_state(), {"format": "tinyllm", "optimizer": "adamw", "step": "5"})
    header = read_header(io.BytesIO(data), path="o", file_size=len(data))
    check_optimizer_state(header, MODEL, optimizer="adamw", path="o")
    for optimizer in ("sgd", "muon"):
        check_optimizer_state({"w.momentum_buffer": np.zeros((2, 3), np.float32),
                               "b.momentum_buffer": np.zeros(3, np.float32)}, MODEL,
                              optimizer=optimizer, path="o")
        check_optimizer_state({}, MODEL, optimizer=optimizer, path="o")  # no momentum


@pytest.mark.parametrize(("state", "optimizer", "missing"), [
    ({"w.exp_avg": np.zeros((2, 3), np.float32)}, "adamw", "b.exp_avg"),  # one tensor only
    ({k: v for k, v in adamw_state().items() if k != "b.exp_avg_sq"}, "adamw", "b.exp_avg_sq"),
    ({k: v for k, v in adamw_state().items() if k.startswith("w.")}, "adamw", "b.exp_avg"),
    ({}, "adamw", "b.exp_avg"),  # no tensors at all
    ({"w.momentum_buffer": np.zeros((2, 3), np.float32)}, "sgd", "b.momentum_buffer"),
    ({"b.momentum_buffer": np.zeros(3, np.float32)}, "muon", "w.momentum_buffer"),
])
def test_incomplete_optimizer_state_is_refused(state, optimizer, missing):
    """Seed 000: AdamW keeps exp_avg and exp_avg_sq per parameter; SGD and
    Muon a momentum_buffer per parameter where momentum is used."""
    with pytest.raises(SafetensorsError, match=f"incomplete: '{missing}' is missing"):
        check_optimizer_state(state, MODEL, optimizer=optimizer, path="o")
    if state:
        data = dump(state, {"format": "tinyllm", "optimizer": optimizer, "step": "5"})
        header = read_header(io.BytesIO(data), path="o", file_size=len(data))
        with pytest.raises(SafetensorsError, match="incomplete"):
            check_optimizer_state(header, MODEL, optimizer=optimizer, path="o")


@pytest.mark.parametrize(("state", "optimizer", "rule"), [
    (adamw_state(**{"w.exp_avg": np.zeros((3, 2), np.float32)}), "adamw",
     "'w.exp_avg': shape [3, 2] differs from parameter 'w' shape [2, 3]"),
    (adamw_state(**{"v.exp_avg": np.zeros(3, np.float32)}), "adamw",
     "'v.exp_avg': the model has no parameter 'v'"),
    (adamw_state(**{"w.momentum_buffer": np.zeros((2, 3), np.float32)}), "adamw",
     "'w.momentum_buffer': name must be '<param>.exp_avg' or '<param>.exp_avg_sq' for adamw"),
    ({"w.exp_avg": np.zeros((2, 3), np.float32)}, "sgd", "'<param>.momentum_buffer' for sgd"),
    ({"exp_avg": np.zeros(3, np.float32)}, "adamw", "'exp_avg': name must be"),
    (adamw_state(**{"b.exp_avg_sq": np.zeros(3, ml_dtypes.bfloat16)}), "adamw",
     "'b.exp_avg_sq': dtype BF16, optimizer state must be F32"),
    ({}, "adam", "unknown optimizer 'adam'"),
])
def test_bad_optimizer_state(state, optimizer, rule):
    data = dump(state)
    header = read_header(io.BytesIO(data), path="optimizer.safetensors", file_size=len(data))
    for given in (state, header):
        with pytest.raises(SafetensorsError) as caught:
            check_optimizer_state(given, MODEL, optimizer=optimizer, path="optimizer.safetensors")
        assert rule in caught.value.rule
        assert caught.value.path == "optimizer.safetensors"
