"""The benchmark's OTLP/HTTP receiver: oteltap's own native receiver (PyPI
``oteltap``, the one the tests run through its ``oteltap --port`` command),
started without NDJSON printing and drained by one plain thread.

Why not the command: ``oteltap --port`` prints every span as JSON and its
Python side hands each span from the native receiver to asyncio through a
worker thread (``asyncio.to_thread`` per span), which costs more CPU than the
traced server's own tracing; on the benchmark's two shared cores that CPU
came out of the server's throughput. Here the native receiver still parses
every export request and answers it; this process only counts the spans.

    python bench/oteltap_sink.py PORT

prints ``Listening`` once it listens, and the number of spans received when
stopped (SIGTERM).
"""

from __future__ import annotations

import signal
import sys
import threading

from oteltap.oteltap_core import OtelTapCore


def main() -> None:
    port = int(sys.argv[1])
    status, handle = OtelTapCore.oteltap_start_receiving_http_protobuf(port, 0, None, None, None)
    if status < 0:
        sys.exit(f"oteltap could not listen on port {port} (status {status})")
    stop = threading.Event()
    count = [0]

    def drain() -> None:  # until stopped and nothing more came for 1 s
        while True:
            code, data = OtelTapCore.oteltap_poll_trace(handle, 200 if not stop.is_set() else 1000)
            if code < 0:
                return
            if data is not None:
                count[0] += 1
            elif stop.is_set():
                return

    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    worker = threading.Thread(target=drain)
    worker.start()
    print("Listening", flush=True)
    while not stop.wait(0.5):
        pass
    worker.join()
    OtelTapCore.oteltap_stop_receiving(handle)
    print(count[0], flush=True)


if __name__ == "__main__":
    main()
