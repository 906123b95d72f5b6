"""Records which process group every collective of a rank runs on, and from
which thread (issue 46: a save must never issue a collective on a group
training uses).

:func:`install` wraps every collective of ``torch.distributed`` (c10d: the
``group=`` functions) and of its functional collectives (what DTensor
redistributions such as ``full_tensor`` call), wherever a module imported
them by name, so that each call appends ``(thread name, group name, function)``
to :data:`CALLS` before it runs. :func:`saving` marks the caller's thread as
inside a save (``maybe_save``, ``wait``, ``finish``, ``on_step_start``); the
checkpointer's writer thread is inside a save by construction.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.distributed.distributed_c10d as c10d

#: (thread name, group name, function name, inside a save) per collective call.
CALLS: list[tuple[str, str, str, bool]] = []
_lock = threading.Lock()
_inside = threading.local()

C10D = ("all_gather", "all_gather_into_tensor", "all_gather_object", "all_reduce",
        "all_to_all", "all_to_all_single", "barrier", "broadcast", "broadcast_object_list",
        "gather", "gather_object", "irecv", "isend", "recv", "reduce", "reduce_scatter",
        "reduce_scatter_tensor", "scatter", "scatter_object_list", "send",
        "monitored_barrier", "all_gather_coalesced", "batch_isend_irecv")


def _c10d_group(fn: str, bound: inspect.BoundArguments) -> str:
    group = bound.arguments.get("group")
    if group is None:
        group = bound.arguments.get("pg")
    if group is None:
        return c10d._get_default_group().group_name
    return str(group.group_name)


def _funcol_group(fn: str, bound: inspect.BoundArguments) -> str:
    return str(funcol._resolve_group_name(bound.arguments["group"],
                                          bound.arguments.get("tag", "")))


def _wrap(name: str, original: Callable[..., Any],
          group_of: Callable[[str, inspect.BoundArguments], str]) -> Callable[..., Any]:
    sig = inspect.signature(original)

    @functools.wraps(original)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = sig.bind(*args, **kwargs)
            group = group_of(name, bound)
        except Exception as e:  # noqa: BLE001 - recorded, never hides the call
            group = f"?{type(e).__name__}"
        thread = threading.current_thread()
        inside = thread is not threading.main_thread() or getattr(_inside, "depth", 0) > 0
        with _lock:
            CALLS.append((thread.name, group, name, inside))
        return original(*args, **kwargs)
    recorded.__recorded__ = True  # type: ignore[attr-defined]
    return recorded


def install() -> None:
    """Wrap the collectives, in every loaded ``torch.distributed`` and
    ``registry`` module that holds them (call after importing the registry)."""
    swaps: dict[int, Callable[..., Any]] = {}
    for name in C10D:
        fn = getattr(c10d, name, None)
        if fn is not None and not hasattr(fn, "__recorded__"):
            swaps[id(fn)] = _wrap(name, fn, _c10d_group)
    for name, fn in vars(funcol).items():
        if (inspect.isfunction(fn) and not name.startswith("_") and fn.__module__ == funcol.__name__
                and "group" in inspect.signature(fn).parameters):
            swaps[id(fn)] = _wrap(f"funcol.{name}", fn, _funcol_group)
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not (mod_name.startswith("torch.distributed")
                               or mod_name.startswith("registry")):
            continue
        for attr, value in list(vars(mod).items()):
            if id(value) in swaps and callable(value):
                setattr(mod, attr, swaps[id(value)])
    assert dist.gather_object.__recorded__  # type: ignore[attr-defined]


def saving(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` with the caller's thread marked as inside a save."""
    @functools.wraps(method)
    def marked(*args: Any, **kwargs: Any) -> Any:
        _inside.depth = getattr(_inside, "depth", 0) + 1  # saves call each other
        try:
            return method(*args, **kwargs)
        finally:
            _inside.depth -= 1
    return marked


def foreign(own: set[str]) -> list[tuple[str, str, str, bool]]:
    """The calls made inside a save on a group other than the checkpointer's
    own (``own``: their names: the save's group, its control group)."""
    with _lock:
        return [c for c in CALLS if c[3] and c[1] not in own]
