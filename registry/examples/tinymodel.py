"""The tiny model of :mod:`registry.examples.tinytrainer` (seed 000): its train spec,
data stream, MLP language model and AdamW, in numpy, float32 throughout.

Everything a checkpoint must hold to resume bitwise lives in these values: the
parameters and AdamW moments (``model.safetensors``, ``optimizer.safetensors``),
the spec (``config.json`` and its sha256) and the data cursor with its PCG32
state (``trainer_state.json``); the training loop and its checkpoints are
:mod:`registry.examples.tinytrainer`, which re-exports these names.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from registry.rules import numbers

F32 = np.float32
PARAMS = ("emb", "w1", "b1", "w2", "b2")
#: parameters AdamW decays (matrices; biases are not decayed).
DECAYED = frozenset({"emb", "w1", "w2"})


# -- PCG32 -----------------------------------------------------------------------

MASK64 = (1 << 64) - 1
PCG_MULT = 6364136223846793005


class PCG32:
    """PCG32 (O'Neill's pcg32_random_r): 64-bit LCG state, XSH RR 32-bit output.

    Args:
        state: the 64-bit state.
        inc: the 64-bit increment (odd; it selects the stream).
    """

    __slots__ = ("state", "inc")

    def __init__(self, state: int, inc: int) -> None:
        if not inc & 1:
            raise ValueError(f"pcg32 inc {inc:#x} must be odd")
        self.state = state & MASK64
        self.inc = inc & MASK64

    @classmethod
    def seeded(cls, initstate: int, initseq: int) -> PCG32:
        """pcg32_srandom_r(initstate, initseq)."""
        g = cls(0, (initseq << 1) | 1)
        g.next_u32()
        g.state = (g.state + initstate) & MASK64
        g.next_u32()
        return g

    def next_u32(self) -> int:
        old = self.state
        self.state = (old * PCG_MULT + self.inc) & MASK64
        xorshifted = (((old >> 18) ^ old) >> 27) & 0xFFFFFFFF
        rot = old >> 59
        return ((xorshifted >> rot) | (xorshifted << ((-rot) & 31))) & 0xFFFFFFFF

    def bounded(self, bound: int) -> int:
        """Uniform in ``[0, bound)`` without modulo bias (pcg32_boundedrand_r)."""
        if not 0 < bound <= 0xFFFFFFFF:
            raise ValueError(f"bound {bound} out of range")
        threshold = (0x100000000 - bound) % bound
        while True:
            r = self.next_u32()
            if r >= threshold:
                return r % bound

    def to_dict(self) -> dict[str, str]:
        """trainer_state.json's ``generator``: state and inc as 16 lowercase hex digits."""
        return {"algorithm": "pcg32", "state": f"{self.state:016x}", "inc": f"{self.inc:016x}"}

    @classmethod
    def from_dict(cls, doc: Mapping[str, str]) -> PCG32:
        if doc.get("algorithm") != "pcg32":
            raise ValueError(f"generator algorithm {doc.get('algorithm')!r} is not pcg32")
        return cls(int(doc["state"], 16), int(doc["inc"], 16))


# -- the train spec ------------------------------------------------------------------

DEFAULT_MODEL = {"model_type": "tinytrainer-mlp-lm", "vocab_size": 64, "context": 8,
                 "d_embed": 24, "d_hidden": 192}


def make_spec(steps: int, *, seed: int = 0, batch_size: int = 64,
              model: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The train spec: everything the math depends on (not where it is saved).

    Args:
        steps: total optimizer steps (the cosine schedule ends there).
        seed: initialization and data-order seed.
        batch_size: windows per step.
        model: overrides of the model config (``vocab_size``, ``context``,
            ``d_embed``, ``d_hidden``); it becomes config.json.
    """
    if steps < 1:
        raise ValueError(f"steps {steps} must be >= 1")
    return {
        "format": "tinytrainer-spec",
        "format_version": 1,
        "model": {**DEFAULT_MODEL, **(model or {})},
        "data": {"source": "synthetic-markov-v1", "seed": 20240611, "shards": 4,
                 "shard_tokens": 4096, "eval_windows": 256},
        "optimizer": {"name": "adamw", "lr": 1e-2, "min_lr": 1e-3, "betas": [0.9, 0.95],
                      "eps": 1e-8, "weight_decay": 0.1, "grad_clip": 1.0},
        "schedule": {"warmup_steps": max(1, min(20, steps // 10)), "kind": "cosine"},
        "batch_size": batch_size,
        "steps": steps,
        "seed": seed,
    }


def spec_sha256(spec: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of the spec (sorted keys, no spaces)."""
    text = numbers.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def learning_rate(spec: Mapping[str, Any], step: int) -> float:
    """The learning rate of optimizer step ``step`` (1-based): linear warmup to
    ``lr``, then cosine down to ``min_lr`` at ``steps``. A float64 computed from
    the step alone, so a resumed run gets the same value."""
    opt, warmup, total = spec["optimizer"], spec["schedule"]["warmup_steps"], spec["steps"]
    if step <= warmup:
        return float(opt["lr"] * step / warmup)
    progress = (step - warmup) / max(1, total - warmup)
    return float(opt["min_lr"] + 0.5 * (opt["lr"] - opt["min_lr"])
                 * (1.0 + math.cos(math.pi * min(1.0, progress))))


# -- data ------------------------------------------------------------------------------


def make_corpus(spec: Mapping[str, Any]) -> tuple[list[np.ndarray], np.ndarray]:
    """The training shards and the eval shard: token arrays of ``shard_tokens``.

    A second-order Markov chain: after tokens ``a, b`` comes one of four
    successors ``table[b, a % 2]`` with probabilities 1/2, 1/4, 1/8, 1/8
    (entropy 1.2 nats). The table and every shard come from PCG32 streams.
    """
    data, vocab = spec["data"], spec["model"]["vocab_size"]
    g = PCG32.seeded(data["seed"], 999)
    table = [[[g.bounded(vocab) for _ in range(4)] for _ in range(2)] for _ in range(vocab)]
    pick = (0, 0, 0, 0, 1, 1, 2, 3)
    shards = []
    for shard in range(data["shards"] + 1):  # the last one is the eval shard
        g = PCG32.seeded(data["seed"], 1000 + shard)
        x = [g.bounded(vocab), g.bounded(vocab)]
        for _ in range(data["shard_tokens"] - 2):
            x.append(table[x[-1]][x[-2] % 2][pick[g.bounded(8)]])
        shards.append(np.array(x, dtype=np.int64))
    return shards[:-1], shards[-1]


@dataclass(slots=True)
class Cursor:
    """The next window: ``shard`` index and token ``offset`` within it."""

    source: str
    shard: int
    offset: int

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "shard": self.shard, "offset": self.offset}


class DataStream:
    """Windows in PCG32 order; see the module docstring ("Data order")."""

    def __init__(self, spec: Mapping[str, Any], shards: list[np.ndarray], gen: PCG32,
                 cursor: Cursor | None = None) -> None:
        self.source = spec["data"]["source"]
        self.window = spec["model"]["context"] + 1
        self.shards = shards
        self.gen = gen
        self.cursor = cursor if cursor is not None else self._draw()
        if self.cursor.source != self.source:
            raise ValueError(f"data cursor source {self.cursor.source!r} is not "
                             f"{self.source!r}")
        if not (0 <= self.cursor.shard < len(shards)
                and 0 <= self.cursor.offset <= len(shards[self.cursor.shard]) - self.window):
            raise ValueError(f"data cursor {self.cursor.to_dict()} is out of range")

    def _draw(self) -> Cursor:
        shard = self.gen.bounded(len(self.shards))
        offset = self.gen.bounded(len(self.shards[shard]) - self.window + 1)
        return Cursor(self.source, shard, offset)

    def batch(self, n: int) -> np.ndarray:
        """The next ``n`` windows, ``[n, context + 1]`` token ids."""
        rows = []
        for _ in range(n):
            c = self.cursor
            rows.append(self.shards[c.shard][c.offset:c.offset + self.window])
            self.cursor = self._draw()
        return np.stack(rows)


# -- model and optimizer ------------------------------------------------------------------


def init_params(spec: Mapping[str, Any]) -> dict[str, np.ndarray]:
    m = spec["model"]
    v, c, d, h = m["vocab_size"], m["context"], m["d_embed"], m["d_hidden"]
    rng = np.random.Generator(np.random.PCG64(spec["seed"]))

    def normal(shape: tuple[int, ...], std: float) -> np.ndarray:
        return rng.standard_normal(shape, dtype=F32) * F32(std)

    return {"emb": normal((v, d), 0.5), "w1": normal((c * d, h), 1.0 / math.sqrt(c * d)),
            "b1": np.zeros(h, F32), "w2": normal((h, v), 1.0 / math.sqrt(h)),
            "b2": np.zeros(v, F32)}


def forward(params: Mapping[str, np.ndarray], tokens: np.ndarray, *,
            grad: bool) -> tuple[np.float32, dict[str, np.ndarray] | None]:
    """Mean cross-entropy of predicting ``tokens[:, -1]`` from the rest, in F32,
    and (``grad``) its gradient with respect to every parameter."""
    x, y = tokens[:, :-1], tokens[:, -1]
    n = tokens.shape[0]
    emb, w1, b1, w2, b2 = (params[k] for k in PARAMS)
    e = emb[x].reshape(n, -1)                              # [n, context*d_embed]
    h = np.tanh(e @ w1 + b1)                               # [n, d_hidden]
    logits = h @ w2 + b2                                   # [n, vocab]
    shifted = logits - logits.max(axis=1, keepdims=True)
    ex = np.exp(shifted)
    sumex = ex.sum(axis=1, keepdims=True)
    logp = shifted - np.log(sumex)
    rows = np.arange(n)
    loss = F32(-logp[rows, y].mean(dtype=F32))
    if not grad:
        return loss, None
    dlogits = ex / sumex
    dlogits[rows, y] -= F32(1.0)
    dlogits /= F32(n)
    dh = (dlogits @ w2.T) * (F32(1.0) - h * h)
    de = (dh @ w1.T).reshape(n, x.shape[1], -1)
    demb = np.zeros_like(emb)
    np.add.at(demb, x, de)
    grads = {"emb": demb, "w1": e.T @ dh, "b1": dh.sum(axis=0, dtype=F32),
             "w2": h.T @ dlogits, "b2": dlogits.sum(axis=0, dtype=F32)}
    assert all(g.dtype == F32 for g in grads.values())
    return loss, grads


class AdamW:
    """AdamW (Loshchilov & Hutter; PyTorch's update order) in float32.

    State per parameter: ``exp_avg`` and ``exp_avg_sq``; the step count is the
    trainer's step. Gradients are clipped to a global L2 norm first.
    """

    def __init__(self, spec: Mapping[str, Any], params: Mapping[str, np.ndarray],
                 state: Mapping[str, np.ndarray] | None = None) -> None:
        opt = spec["optimizer"]
        self.beta1, self.beta2 = (float(b) for b in opt["betas"])
        self.eps, self.wd, self.clip = float(opt["eps"]), float(opt["weight_decay"]), \
            float(opt["grad_clip"])
        if state is None:
            state = {f"{k}.{s}": np.zeros_like(p) for k, p in params.items()
                     for s in ("exp_avg", "exp_avg_sq")}
        self.state = {k: np.array(v, dtype=F32, copy=True) for k, v in state.items()}

    def step(self, params: dict[str, np.ndarray], grads: Mapping[str, np.ndarray], *,
             step: int, lr: float) -> None:
        """Update ``params`` in place with optimizer step ``step`` (1-based)."""
        sq = F32(0.0)
        for k in PARAMS:
            sq += np.vdot(grads[k], grads[k]).astype(F32)
        norm = np.sqrt(sq, dtype=F32)
        scale = F32(self.clip) / (norm + F32(1e-6)) if norm > F32(self.clip) else F32(1.0)
        b1, b2 = F32(self.beta1), F32(self.beta2)
        step_size = F32(lr / (1.0 - self.beta1 ** step))
        bc2_sqrt = F32(math.sqrt(1.0 - self.beta2 ** step))
        for k in PARAMS:
            p, g = params[k], grads[k] * scale
            m, v = self.state[f"{k}.exp_avg"], self.state[f"{k}.exp_avg_sq"]
            if k in DECAYED:
                p *= F32(1.0 - lr * self.wd)
            m *= b1
            m += (F32(1.0) - b1) * g
            v *= b2
            v += (F32(1.0) - b2) * g * g
            p -= step_size * (m / (np.sqrt(v) / bc2_sqrt + F32(self.eps)))


def eval_loss(params: Mapping[str, np.ndarray], spec: Mapping[str, Any],
              eval_shard: np.ndarray | None = None) -> np.float32:
    """Mean next-token loss (nats) of ``params`` on the fixed held-out windows."""
    if eval_shard is None:
        eval_shard = make_corpus(spec)[1]
    window = spec["model"]["context"] + 1
    stride = (len(eval_shard) - window) // spec["data"]["eval_windows"]
    tokens = np.stack([eval_shard[i * stride:i * stride + window]
                       for i in range(spec["data"]["eval_windows"])])
    loss, _ = forward(params, tokens, grad=False)
    return loss


def tensors_sha256(tensors: Mapping[str, np.ndarray]) -> str:
    """sha256 over name, shape, dtype and bytes of every tensor, in name order."""
    h = hashlib.sha256()
    for k in sorted(tensors):
        a = np.ascontiguousarray(tensors[k])
        h.update(f"{k}|{a.dtype.str}|{list(a.shape)}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()
