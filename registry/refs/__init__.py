"""Mutable names of immutable releases: aliases (``models/<model_id>/refs/<alias>``)
and their append-only history (signed moves are trust's, :mod:`registry.trust.alias_sign`).

Rooms it may import (tests/test_house.py keeps this list): errors, host, rules, obs, store, protocol, formats, gating, events, lifecycle, trust.
"""
