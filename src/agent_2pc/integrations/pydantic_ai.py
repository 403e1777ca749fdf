"""PydanticAI: a toolset with the transaction's tools, and a wrapper toolset that runs any other
toolset's tools that are not read-only under the effect fence, once per tool call.
Extra: ``agent-2pc[pydantic-ai]``.

    from agent_2pc import Agent2PC
    from agent_2pc.integrations.pydantic_ai import FencedToolset, TransactionToolset

    with Agent2PC(".").transaction(label="agent") as tx:       # commit at the end, abort on error
        agent = Agent(model, toolsets=[TransactionToolset(tx), FencedToolset(billing_tools)])
        agent.run_sync("...")

A tool is read-only (called as it is, never fenced) when its definition's metadata says so --
``read_only: True``, or MCP's ``annotations.readOnlyHint`` -- or its name is in ``read_only``.
The intent of a fenced call is its ``idempotency_key`` argument when it has one, else the tool
call's id (kept by durable execution when a run is replayed). A tool that raises ``ModelRetry``
surely did nothing: the intent is freed for the model's next attempt. Any other exception may
have come after the effect: the intent is fenced until reconciled (docs/fence.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic_ai import ModelRetry
from pydantic_ai.toolsets import FunctionToolset, WrapperToolset

from ._fencing import KEY_ARG, ToolFence
from ._txtools import transaction_tools

if TYPE_CHECKING:
    from pydantic_ai.tools import RunContext
    from pydantic_ai.toolsets import AbstractToolset
    from pydantic_ai.toolsets.abstract import ToolsetTool

    from ..coordinator.client import Transaction
    from ..fence import Fence


class TransactionToolset(FunctionToolset[Any]):
    """Tools that read and stage files in ``tx``, run commands and checks in its staged view,
    show its diff and (``allow_commit``) commit or abort it. Refusals are answers
    (``{ok: false, error: {code, message}}``), not exceptions."""

    def __init__(self, tx: Transaction, *, allow_commit: bool = True, **kwargs: Any) -> None:
        super().__init__(transaction_tools(tx, allow_commit=allow_commit), **kwargs)
        self.tx = tx


def is_read_only(tool: ToolsetTool[Any], names: frozenset[str] = frozenset()) -> bool:
    meta = tool.tool_def.metadata or {}
    notes = meta.get("annotations") or {}
    return (tool.tool_def.name in names or meta.get("read_only") is True
            or (isinstance(notes, dict) and notes.get("readOnlyHint") is True))


@dataclass
class FencedToolset(WrapperToolset[Any]):
    """``wrapped``'s tools, the ones that are not read-only run under the fence. ``fence``: a
    Fence, a store URL, or None for the workspace's store (at ``root``, else found from the
    working directory)."""

    fence: Fence | str | None = None
    root: str | os.PathLike[str] | None = None
    namespace: str = ""
    domain: str = "default"
    read_only: frozenset[str] = frozenset()
    failed_on: tuple[type[BaseException], ...] = (ModelRetry,)
    wait_s: float = 30.0
    guard: ToolFence | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.guard is None:
            self.guard = ToolFence(self.fence, root=self.root, namespace=self.namespace,
                                   domain=self.domain, failed_on=self.failed_on,
                                   wait_s=self.wait_s)
        self.read_only = frozenset(self.read_only)

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any],
                        tool: ToolsetTool[Any]) -> Any:
        if is_read_only(tool, self.read_only):
            return await self.wrapped.call_tool(name, tool_args, ctx, tool)
        assert self.guard is not None
        key = tool_args.get(KEY_ARG)

        async def run() -> Any:
            return await self.wrapped.call_tool(name, tool_args, ctx, tool)

        return await self.guard.acall(name, tool_args, run, call_id=ctx.tool_call_id,
                                      key=key if isinstance(key, str) else None)


def fenced(toolset: AbstractToolset[Any], **kwargs: Any) -> FencedToolset:
    """``FencedToolset(toolset, **kwargs)``."""
    return FencedToolset(toolset, **kwargs)
