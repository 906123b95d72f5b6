"""File formats of a model directory: safetensors (the format, a streaming reader and
writer), a directory's weights (one file, or an index and its shards), optimizer state,
and the rules of a model directory.

* :mod:`~registry.formats.safetensors_format`, :mod:`~registry.formats.safetensors_io`,
  :mod:`~registry.formats.safetensors_write`;
* :mod:`~registry.formats.weights`: ``model.safetensors`` or an index and its shards;
* :mod:`~registry.formats.optimizer_state`: ``optimizer.safetensors``;
* :mod:`~registry.formats.modeldir`: what a model directory holds.

Rooms it may import (tests/test_house.py keeps this list): errors, host, rules, obs, store, protocol.
"""
