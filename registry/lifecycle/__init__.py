"""The life of a release after its commit (issue 32 items 1-3).

* :mod:`registry.lifecycle.yank`: take a release out of service (the
  ``yanked`` gate) and back;
* :mod:`registry.lifecycle.delete` and :mod:`registry.lifecycle.tombstone`:
  remove a release, keep its tombstone, never reuse its version name;
* :mod:`registry.lifecycle.retention`: ``registry release gc``'s policy;
* :mod:`registry.lifecycle.tags`: mutable tags, moved by compare-and-swap;
* :mod:`registry.lifecycle.guard`: what a pull checks first.

Records live under ``ledger/`` beside the releases (:mod:`registry.lifecycle.records`);
the index follows them and ``registry index rebuild`` recomputes it from them.
See docs/lifecycle.md.


Rooms it may import (tests/test_house.py keeps this list): errors, host, rules, obs, store, protocol, formats, gating, checkpoint, events, refs, trust.
"""
