"""LangGraph and LangChain: ``fenced_tool`` wraps a tool so that its side effect runs under the
effect fence once per tool call; ``transaction_tools`` are the transaction's tools; and
``transactional(graph)`` makes a graph run one transaction: what its tools stage commits when
the run ends, an error aborts it, and a run cut short (a crash, an interrupt waiting for a
person) keeps it for the resume. Extra: ``agent-2pc[langgraph]``.

    from agent_2pc.integrations.langgraph import fenced_tool, transaction_tools, transactional

    tools = [*transaction_tools(), fenced_tool(send_invoice)]      # was [..., send_invoice]
    graph = transactional(builder.compile(checkpointer=saver))     # was builder.compile(...)
    graph.invoke({"messages": [...]}, {"configurable": {"thread_id": "t1"}})

A graph's thread has one transaction (labelled ``langgraph thread T``): resuming the thread
after a crash continues it, and the tools the interrupted step runs again that were fenced
answer from the fence instead of acting twice (a tool call keeps its id in the checkpoint).
``transaction_tools()`` without a transaction finds the run's in its config.
"""

from __future__ import annotations

import inspect
import os
from typing import TYPE_CHECKING, Any, Callable

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool
from langchain_core.tools import tool as as_tool
from langchain_core.tools.base import create_schema_from_function

from ..errors import UsageError
from ._fencing import KEY_ARG, ToolFence
from ._txtools import transaction_tools as _plain_tools

if TYPE_CHECKING:
    from ..coordinator.client import Agent2PC, Transaction
    from ..fence import Fence

TID_KEY = "agent_2pc_tid"  # config["configurable"][TID_KEY]: the run's transaction
ROOT_KEY = "agent_2pc_root"  # ... and its workspace
LABEL = "langgraph thread {}"
_MESSAGE = "agent_2pc.tool_message"  # how a recorded ToolMessage is marked in the fence


# -- fencing a tool ----------------------------------------------------------------------------


class FencedTool(BaseTool):
    """``wrapped``, its calls run once each under the fence (its name, description and
    arguments unchanged). Build it with ``fenced_tool``."""

    wrapped: BaseTool
    guard: Any

    def _model_args(self, args: Any) -> dict[str, Any]:
        """The arguments the model gave (injected state, store or runtime left out)."""
        if not isinstance(args, dict):
            return {"input": args}
        schema = self.wrapped.tool_call_schema
        names = (set(schema.get("properties", {})) if isinstance(schema, dict)
                 else set(getattr(schema, "model_fields", {})))
        return {k: v for k, v in args.items() if k in names} if names else dict(args)

    def _call(self, input: Any) -> tuple[str | None, dict[str, Any], str | None]:
        if isinstance(input, dict) and input.get("type") == "tool_call":
            call_id, args = input.get("id"), input.get("args") or {}
        else:
            call_id, args = None, input
        key = args.get(KEY_ARG) if isinstance(args, dict) else None
        return call_id, self._model_args(args), key if isinstance(key, str) else None

    def _root_from(self, config: RunnableConfig | None) -> None:
        self.guard.use_root(((config or {}).get("configurable") or {}).get(ROOT_KEY))

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        self._root_from(config)
        call_id, args, key = self._call(input)
        recorded = self.guard.call(
            self.name, args, lambda: _record(self.wrapped.invoke(input, config, **kwargs)),
            call_id=call_id, key=key)
        return _rebuild(recorded, call_id)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None,
                      **kwargs: Any) -> Any:
        self._root_from(config)
        call_id, args, key = self._call(input)

        async def run() -> Any:
            return _record(await self.wrapped.ainvoke(input, config, **kwargs))

        return _rebuild(await self.guard.acall(self.name, args, run, call_id=call_id, key=key),
                        call_id)

    def _run(self, *args: Any, **kwargs: Any) -> Any:  # BaseTool's; invoke is what runs
        raise NotImplementedError("FencedTool runs through invoke and ainvoke")


def _record(out: Any) -> Any:
    """What the fence keeps of a tool's answer (JSON): a ToolMessage's content and status."""
    if isinstance(out, ToolMessage):
        return {_MESSAGE: True, "content": out.content, "status": out.status,
                "name": out.name}
    return out


def _rebuild(recorded: Any, call_id: str | None) -> Any:
    if isinstance(recorded, dict) and recorded.get(_MESSAGE):
        return ToolMessage(content=recorded["content"], status=recorded["status"],
                           name=recorded["name"], tool_call_id=call_id or "")
    return recorded


def fenced_tool(tool: BaseTool | Callable[..., Any], *, fence: Fence | str | None = None,
                root: str | os.PathLike[str] | None = None, namespace: str = "",
                domain: str = "default", failed_on: tuple[type[BaseException], ...] = (),
                wait_s: float = 30.0) -> FencedTool:
    """``tool`` (a LangChain tool, or a function made one with ``@tool``), fenced: a call runs
    it once per tool-call id (or ``idempotency_key`` argument); a call run again -- a retry, a
    resumed graph -- gets the recorded answer. Answers must be JSON or ToolMessages."""
    base = tool if isinstance(tool, BaseTool) else as_tool(tool)
    guard = ToolFence(fence, root=root, namespace=namespace, domain=domain,
                      failed_on=failed_on, wait_s=wait_s)
    return FencedTool(name=base.name, description=base.description,
                      args_schema=base.args_schema, wrapped=base, guard=guard,
                      response_format=base.response_format)


# -- the transaction's tools -------------------------------------------------------------------


def run_transaction(config: RunnableConfig | None, client: Agent2PC | None = None
                    ) -> Transaction:
    """The transaction of the run whose config this is (``transactional`` puts it there)."""
    configurable = (config or {}).get("configurable") or {}
    tid = configurable.get(TID_KEY)
    if not tid:
        raise UsageError("no transaction in this run's config: run the graph with "
                         "transactional(graph), or give transaction_tools a transaction")
    from ..coordinator.client import Agent2PC

    return (client or Agent2PC(configurable.get(ROOT_KEY))).get(tid)


def transaction_tools(tx: Transaction | None = None, *, allow_commit: bool = False,
                      client: Agent2PC | None = None) -> list[BaseTool]:
    """The transaction's tools as LangChain tools: on ``tx``, or (None) on the transaction of
    the run that calls them. ``allow_commit`` adds commit and abort (``transactional`` commits
    at the end of the run by itself)."""
    if tx is not None:
        return [StructuredTool.from_function(fn)
                for fn in _plain_tools(tx, allow_commit=allow_commit)]
    # The functions made on no transaction serve as templates: their names, docs, arguments.
    templates = _plain_tools(None, allow_commit=allow_commit)  # type: ignore[arg-type]
    return [_late_bound(fn.__name__, fn, client) for fn in templates]


def _late_bound(name: str, template: Callable[..., Any], client: Agent2PC | None) -> BaseTool:
    def call(config: RunnableConfig, **kwargs: Any) -> Any:
        tx = run_transaction(config, client)
        fn = next(f for f in _plain_tools(tx, allow_commit=True) if f.__name__ == name)
        return fn(**kwargs)

    params = list(inspect.signature(template).parameters.values())
    call.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [*params, inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY,
                                    annotation=RunnableConfig)])
    return StructuredTool.from_function(
        call, name=name, description=inspect.getdoc(template) or name,
        args_schema=create_schema_from_function(name, template))


# -- a graph run as one transaction ------------------------------------------------------------


class TransactionalGraph:
    """``graph`` (compiled), each run one transaction: begun (or, for a thread with one still
    active, continued), given to the tools in the config, committed when the run ends, aborted
    when it raises, kept when the run stops at an interrupt. ``last`` is the last answer: the
    commit's, the abort's, or ``{tid, state: "active"}``."""

    def __init__(self, graph: Any, client: Agent2PC | None = None,
                 root: str | os.PathLike[str] | None = None, label: str | None = None,
                 checks: tuple[str, ...] = ()) -> None:
        from ..coordinator.client import Agent2PC

        self.graph = graph
        self.client = client or Agent2PC(root)
        self.label = label
        self.checks = tuple(checks)
        self.last: dict[str, Any] | None = None

    def __getattr__(self, name: str) -> Any:  # get_state, stream, ... as the graph's
        return getattr(self.graph, name)

    def _begin(self, given: RunnableConfig | None) -> tuple[Transaction, RunnableConfig]:
        config: dict[str, Any] = dict(given or {})
        configurable = dict(config.get("configurable") or {})
        thread = configurable.get("thread_id")
        label = self.label or (LABEL.format(thread) if thread is not None else "langgraph run")
        tx = None
        if thread is not None:
            live = [t for t in self.client.transactions(state="active")
                    if t.get("label") == label]
            if live:
                tx = self.client.get(live[-1]["tid"])
        tx = tx or self.client.begin(label=label)
        configurable[TID_KEY] = tx.tid
        configurable[ROOT_KEY] = self.client.root
        config["configurable"] = configurable
        return tx, config  # type: ignore[return-value]

    def _end(self, tx: Transaction, out: Any) -> Any:
        if isinstance(out, dict) and out.get("__interrupt__"):
            self.last = {"tid": tx.tid, "state": "active"}  # a person answers, then resume
            return out
        for check in self.checks:
            tx.stage_cmd(check)  # a failing check raises CheckFailed: the caller decides
        self.last = tx.commit()
        return out

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        tx, config = self._begin(config)
        try:
            out = self.graph.invoke(input, config, **kwargs)
        except Exception as exc:
            self.last = tx.abort(f"langgraph: {type(exc).__name__}: {exc}"[:500])
            raise
        return self._end(tx, out)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None,
                      **kwargs: Any) -> Any:
        tx, config = self._begin(config)
        try:
            out = await self.graph.ainvoke(input, config, **kwargs)
        except Exception as exc:
            self.last = tx.abort(f"langgraph: {type(exc).__name__}: {exc}"[:500])
            raise
        return self._end(tx, out)


def transactional(graph: Any, **kwargs: Any) -> TransactionalGraph:
    """``TransactionalGraph(graph, **kwargs)``."""
    return TransactionalGraph(graph, **kwargs)
