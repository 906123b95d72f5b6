"""The host a command runs on: file modes of trusted files, the package's resource
folders, shared thread pools, signals, lazy package attributes, redacted secrets,
the source directory publish reads (its confinement rule and a file that must hold
still), the actor a write records, whether a process on this host lives, and the
config file with its profiles.

Rooms it may import (tests/test_house.py keeps this list): errors.
"""
