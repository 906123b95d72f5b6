"""What decides whether a release may serve: the release gates (pure functions from a
release's facts to one result per check) and the live ledger of revoked data sources.

Rooms it may import (tests/test_house.py keeps this list): errors, host, rules, obs, store, protocol, formats.
"""
