"""Rules on what the registry accepts and how it says so: names of models, versions and
aliases, every size and count limit, the JSON Schemas, numbers JSON and the index can
hold, and the words of messages ("1 file", "did you mean ...?").

Rooms it may import (tests/test_house.py keeps this list): errors, host.
"""
