"""A small LangGraph app for the tests: a scripted chat model (LangChain's GenericFakeChatModel)
that calls tools, a ToolNode, and a SQLite checkpointer, run as one transaction. Run as a
program it is the process that crashes and the one that resumes:

    python langgraph_app.py REPO CHECKPOINT_DB EFFECTS_FILE

The model's first turn calls `charge` (fenced: it appends a line to EFFECTS_FILE),
`write_file` (staged) and `crash_once` in one step; `crash_once` kills the process (SIGKILL,
no cleanup) the first time, once the charge happened and the fence recorded it. The second run
resumes the thread.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from agent_2pc.integrations.langgraph import fenced_tool, transaction_tools, transactional

SCRIPT = [
    AIMessage("", tool_calls=[
        {"name": "charge", "args": {"customer": "c7", "cents": 500}, "id": "call-charge"},
        {"name": "write_file", "args": {"path": "invoice.txt", "content": "c7 500\n"},
         "id": "call-write"},
        {"name": "crash_once", "args": {}, "id": "call-crash"}]),
    AIMessage("done"),
]


def build(effects: str, checkpointer: Any = None, script: list[AIMessage] = SCRIPT,
          extra_tools: list[Any] = (), **compile_kw: Any) -> Any:
    marker = effects + ".crashed"

    def charge(customer: str, cents: int) -> str:
        """Charge a customer."""
        with open(effects, "a") as f:
            f.write(f"charge {customer} {cents}\n")
        return f"charged {customer}"

    fenced_charge = fenced_tool(charge)

    def crash_once() -> str:
        """Crash the process the first time, once the charge is done and recorded."""
        if not os.path.exists(marker):
            deadline = time.monotonic() + 10
            while fenced_charge.guard._fence is None or fenced_charge.guard.fence.status(
                    "charge:call:call-charge")["state"] != "done":
                assert time.monotonic() < deadline
                time.sleep(0.01)
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return "fine"

    tools = [*transaction_tools(), fenced_charge, crash_once, *extra_tools]

    def agent(state: MessagesState) -> dict:
        # The scripted model picks up where the thread is: one scripted answer per AI turn.
        turns = sum(1 for m in state["messages"] if isinstance(m, AIMessage))
        model = GenericFakeChatModel(messages=iter(script[turns:]))
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode(tools, handle_tool_errors=False), **compile_kw)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=checkpointer)


def main(repo: str, db: str, effects: str) -> None:
    import sqlite3

    from langgraph.checkpoint.sqlite import SqliteSaver

    saver = SqliteSaver(sqlite3.connect(db, check_same_thread=False))
    graph = transactional(build(effects, saver), root=repo)
    config = {"configurable": {"thread_id": "t1"}}
    resuming = graph.get_state(config).next
    out = graph.invoke(None if resuming else {"messages": [("user", "bill c7")]}, config)
    print(graph.last["state"], out["messages"][-1].content)


if __name__ == "__main__":
    main(*sys.argv[1:4])
