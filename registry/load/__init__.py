"""Load: a release's tensors straight from the store into memory, every byte
verified first (DESIGN section 9; issue 43).

Holds the weights reader (:mod:`~registry.load.reader`), the piece-verified
reads it is built on (:mod:`~registry.load.pieces`, :mod:`~registry.load.sources`),
its plan of a directory's weights (:mod:`~registry.load.layout`), the pull-cache
write-through (:mod:`~registry.load.place`), and the engine adapters
(:mod:`~registry.load.engines`). It may import the protocol modules (manifest,
pieces), ``weights``/``safetensors_*``, ``store`` and ``pull`` (the trust path
:func:`registry.pull.opened.open_release` and the cache); nothing imports it
but the CLI and the API.

    from registry.load import open_weights
    with open_weights("tiny-lm@prod", store="s3://bucket/registry") as w:
        for name, tensor in w:          # in the order pieces verify
            ...
        w.get_slice("lm_head.weight")[rank * n:(rank + 1) * n]


Rooms it may import (tests/test_house.py keeps this list): errors, host, rules, obs, store, protocol, formats, gating, checkpoint, pull, refs, release, trust.
"""

from __future__ import annotations

from registry.load.opener import open_weights
from registry.load.reader import LoadStats, TensorSlice, WeightsReader

__all__ = ["LoadStats", "TensorSlice", "WeightsReader", "open_weights"]
