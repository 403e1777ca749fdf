"""``agent-2pc mcp``: the tool table (_tools.py) served over stdio on the SDK's low-level Server.

Why the low-level ``Server`` and not ``MCPServer``: MCPServer answers malformed arguments with a
text-only isError result (the contract wants ``{ok: false, error: {code, message}}`` as
structured content there too), and wraps a union result in ``{"result": ...}``. The low-level
server lets each row of the table carry its own input and output schema, and every answer go
through one renderer (_results.py).

Each call: validate the arguments with the row's input model (``usage`` on failure), run the
library call (engine calls one at a time: one engine per server; quick steps on the event
loop's thread, the others in a worker thread), render. A call that raises something
unexpected is logged to stderr and answered ``internal``; the server keeps serving. An unknown
tool name is a protocol error (JSON-RPC -32602), as the protocol asks.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from .. import __version__
from ..errors import Agent2PCError, IoFailed, UsageError
from . import _results
from ._schema import input_schema, output_schema
from ._stdio import server_streams
from ._tools import INSTRUCTIONS, Runtime, ToolSpec, available


def log(message: str) -> None:
    sys.stderr.write(f"agent-2pc mcp: {message}\n")
    sys.stderr.flush()


def describe_tool(spec: ToolSpec) -> types.Tool:
    a = spec.annotations
    return types.Tool(
        name=spec.name, title=spec.title, description=spec.description,
        input_schema=input_schema(spec.input), output_schema=output_schema(*spec.output),
        annotations=types.ToolAnnotations(
            title=spec.title, read_only_hint=a.read_only,
            destructive_hint=None if a.read_only else a.destructive,
            idempotent_hint=a.idempotent, open_world_hint=a.open_world))


def usage_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False, include_input=False)[:10]:
        where = ".".join(str(p) for p in err["loc"]) or "arguments"
        parts.append(f"{where}: {err['msg']}")
    return "invalid arguments: " + "; ".join(parts)


class App:
    """The server's state: the runtime and the table, described once."""

    def __init__(self, rt: Runtime, tools: list[ToolSpec] | None = None) -> None:
        self.rt = rt
        self.tools = {t.name: t for t in (tools if tools is not None else available())}
        self.listing = types.ListToolsResult(tools=[describe_tool(t) for t in
                                                    self.tools.values()])

    def run_sync(self, spec: ToolSpec, args: Any) -> dict[str, Any]:
        if spec.uses_engine:
            with self.rt.engine_lock:
                return spec.call(self.rt, args)
        return spec.call(self.rt, args)

    async def run(self, spec: ToolSpec, args: Any) -> dict[str, Any]:
        """A quick step runs here, on the event loop's thread, if the engine is free (no lock
        wait can stall the loop); anything else, or a quick step while another engine call
        runs, in a worker thread."""
        if spec.quick and not spec.uses_engine:
            return spec.call(self.rt, args)
        if spec.quick and self.rt.engine_lock.acquire(blocking=False):
            try:
                return spec.call(self.rt, args)
            finally:
                self.rt.engine_lock.release()
        return await anyio.to_thread.run_sync(self.run_sync, spec, args)

    async def call(self, name: str, arguments: dict[str, Any] | None) -> types.CallToolResult:
        spec = self.tools.get(name)
        if spec is None:
            raise MCPError(code=types.INVALID_PARAMS, message=f"unknown tool {name!r}")
        try:
            args = spec.input.model_validate(arguments or {})
        except ValidationError as exc:
            return _results.error(UsageError(usage_message(exc)))
        try:
            result = await self.run(spec, args)
        except Agent2PCError as err:
            return _results.error(err)
        except OSError as exc:  # a disk that refuses (EIO, ENOSPC): io_error, as the CLI says
            return _results.error(IoFailed.from_os_error(exc))
        except Exception as exc:  # a bug or the host failing: report it, keep serving
            log(f"{name} failed:\n{traceback.format_exc()}")
            return _results.internal(exc)
        return _results.success(result)

    def server(self) -> Server[Any]:
        async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
            return self.listing

        async def call_tool(ctx: Any, params: types.CallToolRequestParams
                            ) -> types.CallToolResult:
            return await self.call(params.name, params.arguments)

        server: Server[Any] = Server(
            "agent-2pc", version=__version__, title="agent-2pc", instructions=INSTRUCTIONS,
            on_list_tools=list_tools, on_call_tool=call_tool)
        server.middleware.clear()  # the SDK's OpenTelemetry middleware: a no-op that costs
        return server


async def serve_stdio(app: App) -> None:
    server = app.server()
    async with server_streams() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def serve(root: str | None = None, store: str | None = None) -> None:
    """Serve the tools over stdin/stdout until the client closes the connection."""
    rt = Runtime(root, store)
    try:
        anyio.run(serve_stdio, App(rt))
    finally:
        rt.close()
