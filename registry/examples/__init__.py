"""Example code shipped with the package (the quickstart trains registry.examples.tinytrainer).

Rooms it may import (tests/test_house.py keeps this list): errors, host, rules, obs, store, protocol, formats, gating, api, checkpoint, pull, trust.
"""
