"""Checkpoint tree layouts: how step directories and the pointer are named.

Two layouts share one commit protocol, manifest and retention code; only the
names differ:

``tinyllm`` (seed 000, "Checkpoint step directory")::

    runs/<run_id>/ckpt/step-<nnnnnn>/   six digits at least, sorted numerically
    runs/<run_id>/ckpt/LATEST           "step-000500\\n"

``loongsage`` (seed 003, "Directory Layout")::

    <checkpoint_path>/train_step_<N>/{dist_ckpt/, hf_model/, data_source/}
    <checkpoint_path>/latest_checkpointed_iteration.txt   "<N>\\n" (whitespace tolerated)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from registry.errors import PointerError, UsageError
from registry.protocol.layout import LATEST, STEP_DIR_FORMAT
from registry.protocol.layout import run_root as run_root  # re-exported: the key lives in registry.protocol.layout
from registry.protocol.manifest import Manifest
from registry.protocol.pointer import parse_pointer


@dataclass(frozen=True, slots=True)
class Layout:
    """Naming rules of one checkpoint tree layout.

    Attributes:
        name: ``"tinyllm"`` or ``"loongsage"``.
        pointer: file name of the pointer at the tree root.
        step_re: full match of a step directory name; group 1 is the step.
        dir_format: ``str.format`` pattern of a step directory name.
        pointer_holds_dir: the pointer holds the directory name (tinyllm),
            else the bare step number (loongsage).
        resumable_paths: a committed step holds state training can resume
            from when its manifest lists one of these paths, or a path under
            one ending in ``/`` (the rest is an export: weights only).
    """

    name: str
    pointer: str
    step_re: re.Pattern[str]
    dir_format: str
    pointer_holds_dir: bool
    resumable_paths: tuple[str, ...] = ()

    def resumable(self, manifest: Manifest) -> bool:
        """Whether the committed step of ``manifest`` can be resumed from."""
        return any(e.path == p or (p.endswith("/") and e.path.startswith(p))
                   for e in manifest.files for p in self.resumable_paths)

    def step_dir(self, step: int) -> str:
        """Directory name of ``step`` (``step-000500`` / ``train_step_500``)."""
        if step < 0:
            raise UsageError(f"step {step}: a step is a number >= 0")
        return self.dir_format.format(step=step)

    def parse_dir(self, name: str) -> int | None:
        """The step of a directory name, or None for anything else
        (staging directories, claims, ``train_step_x``)."""
        m = self.step_re.fullmatch(name)
        return int(m.group(1)) if m else None

    def pointer_value(self, step: int) -> str:
        """What the pointer holds for ``step`` (without the newline)."""
        return self.step_dir(step) if self.pointer_holds_dir else str(step)

    def parse_pointer(self, raw: bytes, *, path: str) -> int:
        """The step a pointer names.

        Raises:
            PointerError: empty, garbled, or naming something outside the tree.
        """
        if self.pointer_holds_dir:
            value = parse_pointer(raw, path=path, pattern=self.step_re)
            step = self.parse_dir(value)
        else:
            value = parse_pointer(raw, path=path, strip=True)
            step = int(value) if value.isdigit() and value.isascii() else None
        if step is None:
            raise PointerError(path, f"garbled: {value[:60]!r} names no step")
        return step

    def order(self, value: str) -> int:
        """Sort key of a pointer value, for forward-only pointer moves."""
        step = self.parse_dir(value) if self.pointer_holds_dir else int(value)
        if step is None:
            raise ValueError(value)
        return step


TINYLLM = Layout("tinyllm", LATEST, re.compile(r"step-(\d{6,})"), STEP_DIR_FORMAT, True,
                 ("optimizer.safetensors",))
LOONGSAGE = Layout("loongsage", "latest_checkpointed_iteration.txt",
                   re.compile(r"train_step_(0|[1-9]\d*)"), "train_step_{step}", False,
                   ("dist_ckpt/",))
LAYOUTS = {layout.name: layout for layout in (TINYLLM, LOONGSAGE)}


def get_layout(name: str) -> Layout:
    """The layout called ``name``. Raises UsageError for an unknown one."""
    try:
        return LAYOUTS[name]
    except KeyError:
        raise UsageError(f"unknown layout {name!r} (known: {', '.join(LAYOUTS)})") from None
