"""The server side of the stdio transport: lines in, lines out, malformed input answered.

The SDK's ``stdio_server`` reads each line and writes (and flushes) each answer through anyio's
worker threads: three thread hops per call, about a millisecond on the machines we measured --
as much as staging a file costs. When stdin and stdout are pipes or sockets (as MCP clients
start servers), this transport reads and writes them with the event loop's own non-blocking
pipe transports instead (``_PipeWire``); anything else (a terminal, a file) is read and written
in a worker thread (``_FileWire``).

Each line is decoded by _framing.py: a line that is not JSON, or not a JSON-RPC message, is
answered on the spot (-32700 parse error, -32600 invalid request) instead of being handed to
the SDK's session, which would drop it and leave the client waiting. So is a line longer than
LINE_BYTES_MAX, which is discarded unread. Messages are serialized exactly as the SDK does.

Like the SDK's, it claims the wire: while serving, fd 0 reads /dev/null and fd 1 writes to
stderr, so that a child process or a stray print cannot corrupt the protocol; both are restored
on exit.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import stat
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, BinaryIO

import anyio
import anyio.lowlevel
import anyio.to_thread
from mcp.shared.message import SessionMessage

from ._framing import Refusal, decode, too_long

LINE_BYTES_MAX = 256 << 20
FLUSH_S_MAX = 2.0  # at exit, how long the answers already handed over may take to be written


def _is_stream(fd: int) -> bool:
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _same_file(a: int, b: int) -> bool:
    try:
        sa, sb = os.fstat(a), os.fstat(b)
    except OSError:
        return True
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def usable() -> bool:
    """Pipes (or sockets) on both ends, and stdout not shared with stderr (the event loop's
    transport makes its file description non-blocking, which would reach stderr's writes)."""
    return _is_stream(0) and _is_stream(1) and not _same_file(1, 2)


def encode(item: SessionMessage) -> bytes:
    return item.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"


class _TooLong(Exception):
    """The line was over LINE_BYTES_MAX; it has been discarded (up to its newline)."""


class _PipeWire:
    """Pipes, read and written on the event loop's thread."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 read_transport: Any) -> None:
        self.reader, self.writer, self._read_transport = reader, writer, read_transport

    @classmethod
    async def open(cls, wire_in: int, wire_out: int) -> _PipeWire:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=LINE_BYTES_MAX)
        read_transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(wire_in, "rb", buffering=0))
        write_transport, write_protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, os.fdopen(wire_out, "wb", buffering=0))
        return cls(reader, asyncio.StreamWriter(write_transport, write_protocol, None, loop),
                   read_transport)

    async def read_line(self) -> bytes:
        """The next line (b"" at the end); _TooLong for one over the limit."""
        try:
            return await self.reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            return exc.partial  # the last line may lack its newline
        except asyncio.LimitOverrunError as exc:
            await self._discard(exc.consumed)
            raise _TooLong() from None

    async def _discard(self, consumed: int) -> None:
        await self.reader.readexactly(consumed)
        while True:
            try:
                await self.reader.readuntil(b"\n")
                return
            except asyncio.LimitOverrunError as exc:
                await self.reader.readexactly(exc.consumed)
            except asyncio.IncompleteReadError:
                return

    async def write(self, data: bytes) -> None:
        self.writer.write(data)  # whole lines: writes from two tasks never interleave
        await self.writer.drain()

    async def close(self) -> None:
        self._read_transport.close()
        self.writer.transport.close()
        await anyio.lowlevel.checkpoint()


class _FileWire:
    """A terminal or a file: blocking reads and writes in worker threads."""

    def __init__(self, wire_in: int, wire_out: int) -> None:
        self._in: BinaryIO = os.fdopen(wire_in, "rb")
        self._out: BinaryIO = os.fdopen(wire_out, "wb")
        self._write_lock = anyio.Lock()
        self._reading = False

    async def read_line(self) -> bytes:
        self._reading = True
        # Abandoned if the server stops first: the thread stays blocked in read(2), harmless.
        line = await anyio.to_thread.run_sync(self._in.readline, LINE_BYTES_MAX + 1,
                                              abandon_on_cancel=True)
        if len(line) > LINE_BYTES_MAX and not line.endswith(b"\n"):
            while (rest := await anyio.to_thread.run_sync(self._in.readline, 1 << 20,
                                                          abandon_on_cancel=True)) \
                    and not rest.endswith(b"\n"):
                pass
            self._reading = False
            raise _TooLong()
        self._reading = False
        return line

    async def write(self, data: bytes) -> None:
        async with self._write_lock:
            await anyio.to_thread.run_sync(self._write, data)

    def _write(self, data: bytes) -> None:
        self._out.write(data)
        self._out.flush()

    async def close(self) -> None:
        try:
            self._out.close()
        except OSError:
            pass
        if not self._reading:  # never close a descriptor a blocked thread still reads
            self._in.close()


@asynccontextmanager
async def server_streams() -> AsyncIterator[tuple[Any, Any]]:
    """``async with server_streams() as (read_stream, write_stream)``, for ``Server.run``."""
    wire_in = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    wire_out = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)
    fast = usable()
    saved_in = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    saved_out = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)
    null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    wire: _PipeWire | _FileWire | None = None
    try:
        wire = await _PipeWire.open(wire_in, wire_out) if fast else _FileWire(wire_in, wire_out)
        async with _serving(wire) as streams:
            yield streams
    finally:
        if wire is not None:
            await wire.close()
        os.dup2(saved_in, 0)
        os.dup2(saved_out, 1)
        os.close(saved_in)
        os.close(saved_out)


@asynccontextmanager
async def _serving(wire: _PipeWire | _FileWire) -> AsyncIterator[tuple[Any, Any]]:
    incoming_send, incoming = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    outgoing, outgoing_receive = anyio.create_memory_object_stream[SessionMessage](0)

    async def refuse(refusal: Refusal) -> None:
        try:
            await wire.write(encode(refusal.reply))
        except (ConnectionError, OSError):
            pass  # the client stopped reading; it may still be writing

    async def read_lines() -> None:
        async with incoming_send:
            while True:
                try:
                    line = await wire.read_line()
                except _TooLong:
                    await refuse(too_long(LINE_BYTES_MAX))
                    continue
                if not line:
                    return
                if not line.strip():
                    continue
                item = decode(line)
                if isinstance(item, Refusal):
                    await refuse(item)
                else:
                    await incoming_send.send(item)

    written = anyio.Event()

    async def write_messages() -> None:
        try:
            async with outgoing_receive:
                async for item in outgoing_receive:
                    await wire.write(encode(item))
        except (ConnectionError, OSError):
            pass  # the client went away: nothing more can be said to it
        finally:
            written.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(read_lines)
        tg.start_soon(write_messages)
        try:
            yield incoming, outgoing
        finally:
            await outgoing.aclose()
            with anyio.move_on_after(FLUSH_S_MAX, shield=True):
                await written.wait()  # the last answers reach the wire
            tg.cancel_scope.cancel()
