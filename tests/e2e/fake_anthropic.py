"""A scripted stand-in for the Anthropic Messages API, for driving a real client (Claude Code)
in tests: no network, no model.

    def script(conv):                          # called for each main-loop request
        if conv.turn == 0:
            return ToolUse("Write", {"file_path": ..., "content": "..."})
        assert conv.last_result().is_error is False
        return Say("done")                     # text + stop_reason end_turn

    with FakeAnthropic(script) as api:         # serves http://127.0.0.1:PORT in a thread
        env["ANTHROPIC_BASE_URL"] = api.url
        ... run claude -p ...
    api.requests                               # every request, in order, as received
    api.errors                                 # what went wrong inside the script (assert empty)

What it serves (what Claude Code 2.1.x asks for):

- ``POST /v1/messages`` (with or without ``?beta=true``). A request that offers tools is a turn
  of the main agent loop: its ``turn`` is the number of assistant messages already in the
  conversation, so a client's retry of the same request gets the same answer, and the script
  sees the tool results that the client sent back (``conv.results``). A request without tools
  (a side call: a title, a summary, a quota probe) gets ``side_reply`` as text. ``stream: true``
  is answered with server-sent events framed as the real API frames them -- message_start,
  content_block_start / content_block_delta (``text_delta``, or ``input_json_delta`` in a few
  pieces for a tool's input) / content_block_stop per block, message_delta with the stop reason
  (``tool_use`` or ``end_turn``) and the usage, message_stop; otherwise with one JSON message.
- ``POST /v1/messages/count_tokens``: ``{"input_tokens": N}`` (a rough count).
- ``GET /v1/models`` and ``GET /v1/models/ID``: the one model the client asked for last.
- Anything else: 404, logged like the rest.

A script that raises, or names a tool the request does not offer, is answered with an
``end_turn`` text saying so (never a 5xx, which the client would retry with back-off), and the
error is kept in ``errors`` for the test to fail on.
"""

from __future__ import annotations

import json
import re
import threading
import traceback
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

DEFAULT_MODEL = "claude-sonnet-4-5"


@dataclass
class ToolUse:
    """One tool call: the reply's content is ``text`` (if any) then a tool_use block."""

    name: str
    input: dict[str, Any]
    text: str | None = None


@dataclass
class Say:
    """The last reply: a text block, stop_reason ``end_turn``."""

    text: str


Reply = ToolUse | Say


@dataclass
class ToolResult:
    """A tool_result block that the client sent back."""

    tool_use_id: str
    name: str | None  # the tool it answers, from the assistant message before it
    is_error: bool
    text: str  # the text parts of its content, joined

    def json(self) -> Any:
        """The result's text parsed as JSON (MCP tools answer with their JSON as text)."""
        return json.loads(self.text)


@dataclass
class Conversation:
    """What the script sees of one main-loop request."""

    turn: int
    body: dict[str, Any]
    results: list[ToolResult] = field(default_factory=list)

    @property
    def tool_names(self) -> list[str]:
        return [t.get("name", "") for t in self.body.get("tools") or []]

    def working_directory(self) -> str:
        """The working directory Claude Code tells the model about (its system context says
        "Primary working directory: DIR"), where a model would put absolute paths."""
        texts = [_text_of(self.body.get("system"))]
        texts += [_text_of(m.get("content")) for m in self.body.get("messages") or []]
        for text in texts:
            match = re.search(r"Primary working directory: (.+)", text)
            if match:
                return match.group(1).strip()
        raise AssertionError("no working directory in the request")

    def last_result(self) -> ToolResult:
        assert self.results, "no tool result in the conversation yet"
        return self.results[-1]

    def result_of(self, name: str) -> ToolResult:
        """The latest result of the tool called ``name``."""
        for res in reversed(self.results):
            if res.name == name:
                return res
        raise AssertionError(f"no result of {name} in the conversation")


Step = Reply | Callable[[Conversation], Reply]
Script = Callable[[Conversation], Reply] | Sequence[Step]


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for block in content or []:
        if isinstance(block, dict) and block.get("type") == "text":
            parts.append(block.get("text", ""))
    return "".join(parts)


def tool_results(messages: list[dict[str, Any]]) -> list[ToolResult]:
    """Every tool_result block in a request's messages, in order, with the tool it answers."""
    names: dict[str, str] = {}
    out: list[ToolResult] = []
    for msg in messages:
        content = msg.get("content")
        if not isinstance(content, list):
            continue
        for block in content:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_use":
                names[block.get("id", "")] = block.get("name", "")
            elif block.get("type") == "tool_result":
                tid = block.get("tool_use_id", "")
                out.append(ToolResult(tid, names.get(tid), bool(block.get("is_error")),
                                      _text_of(block.get("content"))))
    return out


def _sse(event: str, data: dict[str, Any]) -> str:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n"


def _pieces(text: str, n: int = 3) -> list[str]:
    """``text`` cut into up to ``n`` pieces (streamed input JSON arrives in fragments)."""
    if len(text) < n:
        return [text]
    step = -(-len(text) // n)
    return [text[i:i + step] for i in range(0, len(text), step)]


class FakeAnthropic:
    """The stand-in server; a context manager that serves it on 127.0.0.1 in a thread."""

    def __init__(self, script: Script, *, side_reply: str = "OK") -> None:
        """``script``: a function of the conversation, or a list indexed by turn whose items
        are replies or functions of the conversation that return one."""
        self._script = script
        self.side_reply = side_reply
        self.requests: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._ids = 0
        self._model = DEFAULT_MODEL
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- life cycle ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._server is not None, "not started"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "FakeAnthropic":
        fake = self

        class Handler(_Handler):
            owner = fake

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> "FakeAnthropic":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what the tests read ---------------------------------------------------------------

    def message_requests(self) -> list[dict[str, Any]]:
        """The bodies of the main-loop ``/v1/messages`` requests (those that offer tools)."""
        with self._lock:
            reqs = list(self.requests)
        return [r["body"] for r in reqs
                if r["path"] == "/v1/messages" and isinstance(r["body"], dict)
                and r["body"].get("tools")]

    def final_results(self) -> list[ToolResult]:
        """The tool results of the longest conversation the client sent (its last turn)."""
        bodies = self.message_requests()
        if not bodies:
            return []
        return tool_results(max(bodies, key=lambda b: len(b.get("messages", [])))["messages"])

    # -- answering -------------------------------------------------------------------------

    def _log(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append(entry)

    def _next_id(self) -> str:
        with self._lock:
            self._ids += 1
            return f"{self._ids:04d}"

    def _reply_for(self, body: dict[str, Any]) -> tuple[Reply, bool]:
        """The reply to a /v1/messages request and whether it was a main-loop turn."""
        messages = body.get("messages") or []
        if not body.get("tools"):
            return Say(self.side_reply), False
        conv = Conversation(turn=sum(1 for m in messages if m.get("role") == "assistant"),
                            body=body, results=tool_results(messages))
        try:
            if callable(self._script):
                reply = self._script(conv)
            else:
                if conv.turn >= len(self._script):
                    raise AssertionError(f"the script has no turn {conv.turn}")
                step = self._script[conv.turn]
                reply = step(conv) if callable(step) else step
            if isinstance(reply, ToolUse) and reply.name not in conv.tool_names:
                raise AssertionError(f"turn {conv.turn}: the request does not offer the tool "
                                     f"{reply.name!r}; it offers {conv.tool_names}")
        except Exception as exc:  # noqa: BLE001 - reported to the test, not to the client
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            with self._lock:
                self.errors.append(f"turn {conv.turn}: {detail}")
            return Say(f"SCRIPT ERROR at turn {conv.turn}: {detail}"), True
        return reply, True

    def answer_messages(self, body: dict[str, Any]) -> tuple[str, bytes]:
        """(content type, response body) for a POST /v1/messages."""
        model = str(body.get("model") or DEFAULT_MODEL)
        self._model = model
        reply, _ = self._reply_for(body)
        blocks: list[dict[str, Any]] = []
        if isinstance(reply, Say):
            blocks.append({"type": "text", "text": reply.text})
            stop = "end_turn"
        else:
            if reply.text:
                blocks.append({"type": "text", "text": reply.text})
            blocks.append({"type": "tool_use", "id": f"toolu_fake{self._next_id()}",
                           "name": reply.name, "input": reply.input})
            stop = "tool_use"
        msg_id = f"msg_fake{self._next_id()}"
        in_tokens = max(1, len(json.dumps(body.get("messages", []))) // 4)
        out_tokens = max(1, len(json.dumps(blocks)) // 4)
        usage = {"input_tokens": in_tokens, "output_tokens": out_tokens,
                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        if not body.get("stream"):
            return "application/json", json.dumps({
                "id": msg_id, "type": "message", "role": "assistant", "model": model,
                "content": blocks, "stop_reason": stop, "stop_sequence": None,
                "usage": usage}).encode()
        events = [_sse("message_start", {"type": "message_start", "message": {
            "id": msg_id, "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": dict(usage, output_tokens=1)}})]
        events.append(_sse("ping", {"type": "ping"}))
        for index, block in enumerate(blocks):
            if block["type"] == "text":
                events.append(_sse("content_block_start", {
                    "type": "content_block_start", "index": index,
                    "content_block": {"type": "text", "text": ""}}))
                for piece in _pieces(block["text"]):
                    events.append(_sse("content_block_delta", {
                        "type": "content_block_delta", "index": index,
                        "delta": {"type": "text_delta", "text": piece}}))
            else:
                events.append(_sse("content_block_start", {
                    "type": "content_block_start", "index": index,
                    "content_block": {"type": "tool_use", "id": block["id"],
                                      "name": block["name"], "input": {}}}))
                for piece in _pieces(json.dumps(block["input"])):
                    events.append(_sse("content_block_delta", {
                        "type": "content_block_delta", "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": piece}}))
            events.append(_sse("content_block_stop", {"type": "content_block_stop",
                                                      "index": index}))
        events.append(_sse("message_delta", {
            "type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": {"output_tokens": out_tokens}}))
        events.append(_sse("message_stop", {"type": "message_stop"}))
        return "text/event-stream", "".join(events).encode()


class _Handler(BaseHTTPRequestHandler):
    owner: FakeAnthropic
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass

    def _read_body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode("utf-8", "replace")

    def _send(self, status: int, ctype: str, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        if ctype == "text/event-stream":
            self.send_header("Cache-Control", "no-cache")
        self.send_header("request-id", "req_fake")
        self.end_headers()
        self.wfile.write(data)

    def _handle(self, method: str) -> None:
        parts = urlsplit(self.path)
        body = self._read_body() if method == "POST" else None
        self.owner._log({"method": method, "path": parts.path, "query": parts.query,
                         "headers": dict(self.headers.items()), "body": body})
        path = parts.path.rstrip("/")
        if method == "POST" and path == "/v1/messages" and isinstance(body, dict):
            ctype, data = self.owner.answer_messages(body)
            self._send(200, ctype, data)
        elif method == "POST" and path == "/v1/messages/count_tokens":
            size = len(json.dumps(body)) if body is not None else 0
            self._send(200, "application/json",
                       json.dumps({"input_tokens": max(1, size // 4)}).encode())
        elif method == "GET" and (path == "/v1/models" or path.startswith("/v1/models/")):
            model = {"type": "model", "id": self.owner._model, "display_name": "Scripted",
                     "created_at": "2025-01-01T00:00:00Z"}
            data = model if path.startswith("/v1/models/") else {
                "data": [model], "has_more": False, "first_id": model["id"],
                "last_id": model["id"]}
            self._send(200, "application/json", json.dumps(data).encode())
        else:
            self._send(404, "application/json", json.dumps({
                "type": "error", "error": {"type": "not_found_error",
                                           "message": f"{method} {parts.path}"}}).encode())

    def do_GET(self) -> None:  # noqa: N802 - the base's naming
        self._handle("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._handle("POST")

    def do_HEAD(self) -> None:  # noqa: N802
        parts = urlsplit(self.path)
        self.owner._log({"method": "HEAD", "path": parts.path, "query": parts.query,
                         "headers": dict(self.headers.items()), "body": None})
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
