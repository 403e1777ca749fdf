"""The OpenAI Agents SDK (``openai-agents``): the transaction's tools for an Agent, and
``fenced_tool``, a ``function_tool`` whose side effect runs under the effect fence, once per
tool call across retries and re-runs. Extra: ``agent-2pc[openai-agents]``.

    from agent_2pc import Agent2PC
    from agent_2pc.integrations.openai_agents import fenced_tool, transaction_tools

    @fenced_tool                      # was @function_tool
    def charge(customer: str, cents: int) -> dict: ...

    tx = Agent2PC(".").begin(label="agent")
    agent = Agent(name="dev", tools=[*transaction_tools(tx), charge])

The intent of a fenced call is its ``idempotency_key`` argument when the function has one,
else the tool-call id the model gave the call (the SDK keeps it when a run is resumed from its
saved state). A call whose intent ran before gets the recorded result without running again; a
call whose earlier attempt failed midway is refused (``intent_fenced``) until reconciled
(docs/fence.md), never run twice.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import os
from typing import TYPE_CHECKING, Any, Callable, get_type_hints

from agents import FunctionTool, function_tool
from agents.tool_context import ToolContext

from ._fencing import KEY_ARG, ToolFence
from ._txtools import transaction_tools as _plain_tools

if TYPE_CHECKING:
    from ..coordinator.client import Transaction
    from ..fence import Fence


def transaction_tools(tx: Transaction, *, allow_commit: bool = True) -> list[FunctionTool]:
    """Tools that read and stage files in ``tx``, run commands and checks in its staged view,
    show its diff and (``allow_commit``) commit or abort it."""
    return [function_tool(_answers_json(fn)) for fn in _plain_tools(tx, allow_commit=allow_commit)]


def _answers_json(fn: Callable[..., dict[str, Any]]) -> Callable[..., str]:
    """``fn`` answering its dict as JSON text (the SDK would give the model its repr)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> str:
        return json.dumps(fn(*args, **kwargs), ensure_ascii=False)

    wrapper.__annotations__ = {**get_type_hints(fn), "return": str}
    return wrapper


def fenced_tool(fn: Callable[..., Any] | None = None, *,
                fence: Fence | str | None = None, root: str | os.PathLike[str] | None = None,
                namespace: str = "", domain: str = "default",
                failed_on: tuple[type[BaseException], ...] = (),
                wait_s: float = 30.0, **tool_kwargs: Any) -> Any:
    """``function_tool`` for a side-effecting function (sync or async): each tool call runs it
    at most once under the fence (``fence``: a Fence or a store URL; default: the workspace's
    store, as ``agent-2pc fence``). ``tool_kwargs`` go to ``function_tool``. Results must be
    JSON (str, numbers, lists, dicts)."""
    def make(func: Callable[..., Any]) -> FunctionTool:
        guard = ToolFence(fence, root=root, namespace=namespace, domain=domain,
                          failed_on=failed_on, wait_s=wait_s)
        name = tool_kwargs.get("name_override") or func.__name__
        sig = inspect.signature(func)
        hints = get_type_hints(func, include_extras=True)

        async def wrapper(ctx: ToolContext[Any], *args: Any, **kwargs: Any) -> Any:
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            arguments = dict(bound.arguments)
            key = arguments.get(KEY_ARG) if KEY_ARG in sig.parameters else None
            if inspect.iscoroutinefunction(func):
                return await guard.acall(name, arguments, lambda: func(*args, **kwargs),
                                         call_id=ctx.tool_call_id, key=key)
            return await asyncio.to_thread(
                guard.call, name, arguments, lambda: func(*args, **kwargs),
                call_id=ctx.tool_call_id, key=key)

        functools.update_wrapper(wrapper, func)
        del wrapper.__wrapped__  # type: ignore[attr-defined]  # the SDK reads the signature below
        ctx_param = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                      annotation=ToolContext[Any])
        wrapper.__signature__ = sig.replace(  # type: ignore[attr-defined]
            parameters=[ctx_param, *sig.parameters.values()])
        wrapper.__annotations__ = {"ctx": ToolContext[Any], **hints}
        tool = function_tool(wrapper, **tool_kwargs)
        tool.fence = guard  # type: ignore[attr-defined]
        return tool

    return make(fn) if fn is not None else make
