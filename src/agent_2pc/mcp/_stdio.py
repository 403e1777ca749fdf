"""The server side of the stdio transport, without a thread hop per message.

The SDK's ``stdio_server`` reads each line and writes (and flushes) each answer through anyio's
worker threads: three thread hops per call, about a millisecond on the machines we measured --
as much as staging a file costs. When stdin and stdout are pipes or sockets (as MCP clients
start servers), this transport reads and writes them with the event loop's own non-blocking
pipe transports instead; anything else (a terminal, a file) falls back to the SDK's.

Like the SDK's, it claims the wire: while serving, fd 0 reads /dev/null and fd 1 writes to
stderr, so that a child process or a stray print cannot corrupt the protocol; both are restored
on exit. Messages are parsed and serialized exactly as the SDK does. A line longer than
LINE_BYTES_MAX is discarded and reported to the session as a parse error.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import stat
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import anyio
import mcp_types as types
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage

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


@asynccontextmanager
async def server_streams() -> AsyncIterator[tuple[Any, Any]]:
    """``async with server_streams() as (read_stream, write_stream)``, for ``Server.run``."""
    if not usable():
        async with stdio_server() as streams:
            yield streams
        return
    wire_in = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    wire_out = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)
    saved_in = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    saved_out = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)
    null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=LINE_BYTES_MAX)
    read_transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(wire_in, "rb", buffering=0))
    write_transport, write_protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(wire_out, "wb", buffering=0))
    writer = asyncio.StreamWriter(write_transport, write_protocol, None, loop)

    incoming_send, incoming = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    outgoing, outgoing_receive = anyio.create_memory_object_stream[SessionMessage](0)

    async def read_lines() -> None:
        async with incoming_send:
            while True:
                try:
                    line = await reader.readuntil(b"\n")
                except asyncio.IncompleteReadError as exc:
                    line = exc.partial  # the last line may lack its newline
                    if not line.strip():
                        return
                except asyncio.LimitOverrunError as exc:
                    await _discard_line(reader, exc.consumed)
                    await incoming_send.send(ValueError(
                        f"a message longer than {LINE_BYTES_MAX} bytes was discarded"))
                    continue
                if not line.strip():
                    continue
                try:
                    message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                except Exception as exc:
                    await incoming_send.send(exc)
                    continue
                await incoming_send.send(SessionMessage(message))

    written = anyio.Event()

    async def write_messages() -> None:
        try:
            async with outgoing_receive:
                async for item in outgoing_receive:
                    data = item.message.model_dump_json(by_alias=True, exclude_unset=True)
                    writer.write(data.encode("utf-8") + b"\n")
                    await writer.drain()
        except (ConnectionError, OSError):
            pass  # the client went away: nothing more can be said to it
        finally:
            written.set()

    try:
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
    finally:
        read_transport.close()
        write_transport.close()
        await anyio.lowlevel.checkpoint()
        os.dup2(saved_in, 0)
        os.dup2(saved_out, 1)
        os.close(saved_in)
        os.close(saved_out)


async def _discard_line(reader: asyncio.StreamReader, consumed: int) -> None:
    """Drop the rest of an over-long line (up to and including its newline)."""
    await reader.readexactly(consumed)
    while True:
        try:
            await reader.readuntil(b"\n")
            return
        except asyncio.LimitOverrunError as exc:
            await reader.readexactly(exc.consumed)
        except asyncio.IncompleteReadError:
            return
