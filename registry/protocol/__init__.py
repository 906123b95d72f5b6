"""The commit protocol: how a directory is written so that readers see all of it or none,
and how a reader checks it (DESIGN sections 1-3).

* :mod:`~registry.protocol.commit`: write a directory (``DirectoryWriter``), the commit;
* :mod:`~registry.protocol.claim`: which writer owns a directory being written;
* :mod:`~registry.protocol.manifest`: ``MANIFEST.json``, every file with size and sha256;
* :mod:`~registry.protocol.pointer`: ``LATEST`` and ``refs/<alias>`` pointer files;
* :mod:`~registry.protocol.pieces`, :mod:`~registry.protocol.hashing`,
  :mod:`~registry.protocol.fastdigest`: digests, whole and per piece, while writing;
* :mod:`~registry.protocol.sequence`: release order; :mod:`~registry.protocol.storeclock`:
  the store's own time;
* :mod:`~registry.protocol.layout`: one function per shape of key the registry writes;
* :mod:`~registry.protocol.verify`, :mod:`~registry.protocol.confirm`: the readers' side.

Rooms it may import (tests/test_house.py keeps this list): errors, host, rules, obs, store.
"""
