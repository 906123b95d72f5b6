"""Ranks, DP buckets and RNG of a multi-rank LoongSage ``dist_ckpt/`` (seed 003
sections 3 and 4.4).

Rank order (Megatron's default, TP fastest)::

    rank = tp_rank + tp * (ep_rank + ep * (dp_rank + dp * pp_rank))

``dp`` may be left out of a topology: it is then ``world / (tp * pp * ep)``.

``dp_reshardable`` ("follows the distributed optimizer's internal bucket
layout ... reshardable along the DP dimension only"): for each optimizer
entry ``<name>``, the DP ranks that share one TP/PP/EP coordinate each hold a
contiguous piece of that coordinate's flat buffer, in DP-rank order. Each
rank writes its piece as it is, flattened, with no communication::

    optimizer.dp_bucket.tp<t>_pp<p>_ep<e>.dp<d>.<name>    [numel] of DP rank d
    optimizer.dp_bucket.tp<t>_pp<p>_ep<e>.scalar.<name>   a 0-d entry (AdamW's step),
                                                         the same on every DP rank

A resume at another DP size gives each rank, in DP-rank order, the next
contiguous range of the buffer, as long as its template holds (the new pieces
of one coordinate must add up to the saved buffer). The TP/PP/EP sizes must be
the saved ones: the buffer's content is laid out by them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from registry.checkpoint.loongsage_format import RNG_TOPOLOGY_KEYS, TOPOLOGY_KEYS
from registry.errors import CheckpointError, UsageError

BUCKET = "optimizer.dp_bucket."
_KEY_RE = re.compile(r"optimizer\.dp_bucket\.(tp\d+_pp\d+_ep\d+)\.(?:dp(\d+)|scalar)\.(.+)")
#: seed 003 section 4.4, quoted in the refusal.
RULE = ("megatron.optimizer_sharding_type=dp_reshardable is \"reshardable along the DP "
        "dimension only\" (seed 003 section 4.4)")


def effective(topology: Mapping[str, int], world: int, *, what: str) -> dict[str, int]:
    """``topology`` with ``dp`` filled in from the world size.

    Raises:
        UsageError: the sizes do not multiply to ``world`` (and ``dp`` cannot
            be derived).
    """
    topo = dict(topology)
    mp = topo["tp"] * topo["pp"] * topo["ep"]
    if mp * topo["dp"] == world:
        return topo
    if topo["dp"] == 1 and world % mp == 0:
        topo["dp"] = world // mp
        return topo
    sizes = ", ".join(f"{k}={topo[k]}" for k in TOPOLOGY_KEYS)
    raise UsageError(f"{what}: topology {sizes} does not fit {world} ranks "
                     "(tp * pp * ep * dp must be the world size)")


def coords(topo: Mapping[str, int], rank: int) -> dict[str, int]:
    """``rank``'s position ``{"tp", "ep", "dp", "pp"}`` (see the module's rank order)."""
    out = {}
    for k in ("tp", "ep", "dp", "pp"):
        out[k], rank = rank % topo[k], rank // topo[k]
    return out


def rank_at(topo: Mapping[str, int], c: Mapping[str, int]) -> int:
    """The rank at position ``c`` of ``topo`` (inverse of :func:`coords`)."""
    return c["tp"] + topo["tp"] * (c["ep"] + topo["ep"] * (c["dp"] + topo["dp"] * c["pp"]))


def _tag(c: Mapping[str, int]) -> str:
    return f"tp{c['tp']}_pp{c['pp']}_ep{c['ep']}"


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def bucket_entries(opt: Mapping[str, torch.Tensor], topo: Mapping[str, int],
                   rank: int) -> dict[str, torch.Tensor]:
    """This rank's ``dp_reshardable`` state dict entries (module notes)."""
    c = coords(topo, rank)
    out: dict[str, torch.Tensor] = {}
    for name, value in opt.items():
        local = _local(value)
        if local.dim() == 0:
            if c["dp"] == 0:  # the same on every DP rank: written once
                out[f"{BUCKET}{_tag(c)}.scalar.{name}"] = local
        else:
            out[f"{BUCKET}{_tag(c)}.dp{c['dp']}.{name}"] = local.reshape(-1)
    return out


def check_dp_only(saved: Mapping[str, int], topo: Mapping[str, int], *, url: str) -> None:
    """Refuse a TP/PP/EP change of ``dp_reshardable`` state.

    Raises:
        CheckpointError: naming the seed's rule and ``fully_reshardable``.
    """
    changed = [f"{k.upper()} {saved[k]} -> {topo[k]}" for k in ("tp", "pp", "ep")
               if saved[k] != topo[k]]
    if changed:
        raise CheckpointError(
            f"{url}: saved with {RULE}; it cannot be resumed with {', '.join(changed)} "
            f"(saved at {describe(saved)}, this run {describe(topo)}): resume with the "
            "saved TP/PP/EP sizes (any DP size), or save with "
            "megatron.optimizer_sharding_type=fully_reshardable to change them")


def describe(topo: Mapping[str, int]) -> str:
    """``tp=2, dp=3 (6 ranks)``: the sizes other than 1, and the world size."""
    sizes = ", ".join(f"{k}={v}" for k, v in topo.items() if v != 1) or "no parallelism"
    return f"{sizes} ({math.prod(topo.values())} ranks)"


def plan_bucket_load(saved_keys: Mapping[str, tuple[torch.Size, torch.dtype]],
                     templates: Mapping[str, torch.Tensor], topo: Mapping[str, int],
                     rank: int, group: Any, *, url: str,
                     partial: bool) -> tuple[dict[str, torch.Tensor], Callable[[], None]]:
    """What this rank must read of the saved DP buckets to fill ``templates``
    (its ``dp_reshardable`` optimizer state at ``topo``), and the function
    that copies it into them once DCP has read it. Collective (every rank
    says how many elements its pieces hold).

    Args:
        saved_keys: the checkpoint's entries (DCP metadata): key -> (size, dtype).

    Raises:
        CheckpointError: a template entry that was not saved, a saved entry
            the templates lack (unless ``partial``), or new pieces that do not
            add up to the saved buffer (naming the entry and both sizes).
    """
    c = coords(topo, rank)
    tag = _tag(c)
    pieces: dict[str, dict[int, int]] = {}
    scalars: set[str] = set()
    for key, (size, _) in saved_keys.items():
        m = _KEY_RE.fullmatch(key)
        if m is None or m.group(1) != tag:
            continue
        if m.group(2) is None:
            scalars.add(m.group(3))
        else:
            pieces.setdefault(m.group(3), {})[int(m.group(2))] = math.prod(size)
    mine = {n: _local(t).numel() for n, t in templates.items() if _local(t).dim() > 0}
    everyone: list[Any] = [None] * (dist.get_world_size(group) if dist.is_initialized() else 1)
    if dist.is_initialized():
        dist.all_gather_object(everyone, (tag, c["dp"], mine), group=group)
    else:
        everyone = [(tag, c["dp"], mine)]
    peers = sorted((d, sizes) for t, d, sizes in everyone if t == tag)
    for name, t in templates.items():
        if name not in (scalars if _local(t).dim() == 0 else pieces):
            raise CheckpointError(f"{url}: optimizer state {name!r} of this run is not in the "
                                  f"checkpoint ({BUCKET}{tag}.*)")
    lacking = sorted((set(pieces) | scalars) - set(templates))
    if lacking and not partial:
        raise CheckpointError(f"{url}: the checkpoint holds optimizer state {lacking[0]!r} "
                              "that this run's optimizer_state lacks (pass partial=True to "
                              "resume without it)")
    reads: dict[str, torch.Tensor] = {}
    copies: list[tuple[torch.Tensor, list[tuple[str, int, int, int]]]] = []
    for name, t in templates.items():
        local = _local(t)
        if local.dim() == 0:
            key = f"{BUCKET}{tag}.scalar.{name}"
            reads[key] = torch.empty((), dtype=saved_keys[key][1])
            copies.append((local, [(key, 0, 0, 0)]))
            continue
        saved = pieces[name]
        total = sum(saved.values())
        new_total = sum(sizes.get(name, 0) for _, sizes in peers)
        if new_total != total:
            raise CheckpointError(
                f"{url}: optimizer state {name!r}: the DP pieces of {tag} hold {new_total} "
                f"elements at this DP size, the saved buffer {total} ({RULE})")
        start = sum(sizes.get(name, 0) for d, sizes in peers if d < c["dp"])
        end, at, spans = start + local.numel(), 0, []
        for d in sorted(saved):
            lo, hi = at, at + saved[d]
            at = hi
            if hi <= start or lo >= end:
                continue
            key = f"{BUCKET}{tag}.dp{d}.{name}"
            reads[key] = torch.empty(saved[d], dtype=saved_keys[key][1])
            a, b = max(lo, start), min(hi, end)
            spans.append((key, a - lo, b - lo, a - start))
        copies.append((local, spans))

    def fill() -> None:
        for local, spans in copies:
            if local.dim() == 0:
                local.copy_(reads[spans[0][0]])
                continue
            flat = torch.empty(local.numel(), dtype=local.dtype)
            for key, lo, hi, to in spans:
                flat[to:to + hi - lo] = reads[key][lo:hi]
            local.copy_(flat.view(local.shape))
    return reads, fill


def rng_rank(saved: Mapping[str, int], topo: Mapping[str, int], rank: int) -> tuple[int | None, str]:
    """The saved rank whose RNG state ``rank`` restores at ``topo``, or None
    and why not: a TP/PP change (seed 003 section 3: skipped with a warning),
    or no rank was saved at this rank's EP/DP position."""
    changed = [f"{k.upper()} {saved[k]} -> {topo[k]}" for k in RNG_TOPOLOGY_KEYS
               if saved[k] != topo[k]]
    if changed:
        return None, f"parallel topology changed since the save ({', '.join(changed)})"
    c = coords(topo, rank)
    for k in ("ep", "dp"):
        if c[k] >= saved[k]:
            return None, (f"no RNG state was saved for {k.upper()} rank {c[k]} (saved at "
                          f"{k}={saved[k]})")
    return rank_at(saved, c), ""
