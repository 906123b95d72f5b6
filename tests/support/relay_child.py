"""A TCP relay in a process of its own: ``python -m tests.support.relay_child PORT UPSTREAM``.

Listens on 127.0.0.1:PORT (0: any; the port is printed on the first line)
and copies bytes both ways to UPSTREAM (``http://host:port``). Killing the
process is a store endpoint dying (connections refused and reset); starting
it again on the same port is the store coming back.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from urllib.parse import urlsplit


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


async def main(port: int, upstream: str) -> None:
    up = urlsplit(upstream)

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection(up.hostname, up.port)
        except OSError:
            w.close()
            return
        await asyncio.gather(_pipe(r, uw), _pipe(ur, w))

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    server = await asyncio.start_server(handle, sock=sock)
    print(sock.getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), sys.argv[2]))
