"""A TCP proxy that emulates the line between two datacenters: every chunk is forwarded
after a fixed one-way delay (order kept), and the bytes crossing it are counted."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator


class WanProxy:
    """Listens on 127.0.0.1:``port``, forwards to 127.0.0.1:``target`` with ``delay_s`` each
    way; runs on its own thread until ``close``. ``to_client`` counts the bytes sent back
    to whoever connected (a KV-event subscriber receives those)."""

    def __init__(self, port: int, target: int, delay_s: float) -> None:
        self.port, self.target, self.delay_s = port, target, delay_s
        self.to_client = 0
        self.to_target = 0
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("the WAN proxy did not start")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._accept, "127.0.0.1", self.port)
        )
        self._started.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            self._loop.run_until_complete(server.wait_closed())
            tasks = asyncio.all_tasks(self._loop)
            for task in tasks:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self._loop.run_until_complete(asyncio.sleep(0))  # transports finish closing
            self._loop.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # both ends closed however this ends (cancelled when the proxy stops, too): a
        # writer left open is collected after its loop has closed, and warns then
        up_writer = None
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
            await asyncio.gather(
                self._pipe(reader, up_writer, "to_target"),
                self._pipe(up_reader, writer, "to_client"),
                return_exceptions=True,
            )
        except OSError:
            pass
        finally:
            for end in (writer, up_writer):
                if end is not None:
                    end.close()

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, counter: str
    ) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, chunk = await queue.get()
                if not chunk:
                    break
                await asyncio.sleep(max(due - time.monotonic(), 0))
                writer.write(chunk)
                setattr(self, counter, getattr(self, counter) + len(chunk))
                await writer.drain()

        sender = asyncio.create_task(deliver())
        try:
            while chunk := await reader.read(1 << 16):
                queue.put_nowait((time.monotonic() + self.delay_s, chunk))
        finally:
            queue.put_nowait((0.0, b""))
            try:
                with contextlib.suppress(Exception):
                    await sender
            finally:
                writer.close()

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)


@contextlib.contextmanager
def wan(port: int, target: int, delay_s: float) -> Iterator[WanProxy]:
    proxy = WanProxy(port, target, delay_s)
    try:
        yield proxy
    finally:
        proxy.close()
