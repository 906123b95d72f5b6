"""The :class:`registry.api.Registry` facade's parts (its alias and lifecycle methods)
and the JSON documents the CLI prints with ``--json`` and the web API serves.
``registry.api`` stays the public door; import the facade from there.

Rooms it may import (tests/test_house.py keeps this list): errors, host, rules, obs, store, protocol, formats, gating, checkpoint, index, lifecycle, refs, release, trust.
"""
