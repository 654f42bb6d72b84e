"""A TCP proxy whose links can be cut and restored by signal: a network partition between one
node and etcd, on one machine.

    python -m hafo.local.proxy LISTEN_PORT:TARGET_PORT [...]   (all on 127.0.0.1)

SIGUSR1 cuts: every open connection is closed and new ones are refused (closed at once).
SIGUSR2 heals. SIGTERM stops (``hafo.stopping``). Standard library only (and hafo.stopping,
itself standard library only).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
import sys

from hafo.stopping import stop_on_signals

HOST = "127.0.0.1"


class Proxy:
    """Forwards each listen port to its target port while not cut."""

    def __init__(self, routes: list[tuple[int, int]]) -> None:
        self.routes = routes
        self.cut = False
        self.writers: set[asyncio.StreamWriter] = set()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while not self.cut:
                data = await reader.read(65536)
                if not data:
                    break
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _handle(self, target: int, client_r: asyncio.StreamReader,
                      client_w: asyncio.StreamWriter) -> None:
        if self.cut:
            client_w.close()
            return
        try:
            server_r, server_w = await asyncio.open_connection(HOST, target)
        except OSError:
            client_w.close()
            return
        self.writers.update((client_w, server_w))
        try:
            await asyncio.gather(self._pipe(client_r, server_w), self._pipe(server_r, client_w))
        finally:
            self.writers.discard(client_w)
            self.writers.discard(server_w)

    def set_cut(self, cut: bool) -> None:
        """Cut (closing every link) or heal."""
        self.cut = cut
        if cut:
            for writer in list(self.writers):
                with contextlib.suppress(Exception):
                    writer.transport.abort()
            self.writers.clear()

    async def run(self) -> None:
        """Serve until SIGTERM."""
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR1, self.set_cut, True)
        loop.add_signal_handler(signal.SIGUSR2, self.set_cut, False)
        with stop_on_signals((signal.SIGTERM,)) as stop:
            servers = []
            for listen, target in self.routes:
                servers.append(await asyncio.start_server(
                    functools.partial(self._handle, target), HOST, listen))
            print("ready", flush=True)
            await stop.wait()
            for server in servers:
                server.close()


def main(argv: list[str]) -> int:
    """Parse LISTEN:TARGET pairs and run."""
    routes = [(int(a), int(b)) for a, b in (arg.split(":") for arg in argv)]
    asyncio.run(Proxy(routes).run())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
