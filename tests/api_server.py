"""A small payment service on 127.0.0.1 for the API participant's tests.

It honours Idempotency-Key the way Stripe documents it: the first request with a key is
executed and its response (success or error, a 500 included) is stored; a later request with the
same key and the same body gets the stored response again (header ``Idempotent-Replayed: true``),
with another body a 422; while the first is still running, a 409. ``performed`` counts the
effects it really carried out, per path, so that tests count executions from the side effect.

Faults, queued per path with ``fail(path, kind, ...)`` and used once each:
  drop_after  carry out the effect, store the response, then drop the connection unanswered
  delay       sleep ``seconds`` before carrying it out (the client may time out meanwhile)
  error_500   carry out the effect and answer 500 (stored, so replays answer 500 too)
  reject_503  answer 503 without doing anything and without storing the key
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Service:
    def __init__(self, port: int = 0) -> None:
        self.lock = threading.Lock()
        self.performed: Counter[str] = Counter()
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, key)
        self.executed: Counter[str] = Counter()  # key -> effects carried out under it
        self._stored: dict[str, tuple[str, int, dict]] = {}  # key -> (body, status, reply)
        self._running: set[str] = set()
        self._faults: dict[str, list[dict]] = {}
        # The service's state after each request it answered (tests/crashsim replays a crash
        # at any point of a recorded run against the service as it was then).
        self.history: list[dict] = [self.state()]
        self.server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=10)

    def state(self) -> dict:
        """What the service has done so far (its effects and stored answers), as data."""
        with self.lock:
            return {"performed": dict(self.performed), "executed": dict(self.executed),
                    "stored": {k: (v[0], v[1], dict(v[2])) for k, v in self._stored.items()}}

    def restore(self, state: dict) -> None:
        """Be the service as it was in ``state``; forget the requests seen since."""
        with self.lock:
            self.performed = Counter(state["performed"])
            self.executed = Counter(state["executed"])
            self._stored = {k: (v[0], v[1], dict(v[2])) for k, v in state["stored"].items()}
            self.requests = []
            self._running = set()

    def fail(self, path: str, kind: str, **params: float) -> None:
        with self.lock:
            self._faults.setdefault(path, []).append({"kind": kind, **params})

    def _take_fault(self, path: str) -> dict:
        with self.lock:
            queue = self._faults.get(path) or []
            return queue.pop(0) if queue else {}

    def _effect(self, path: str, body: dict, key: str | None) -> tuple[int, dict]:
        """Carry out the request for real (counted) and say what to answer."""
        with self.lock:
            self.performed[path] += 1
            if key is not None:
                self.executed[key] += 1
            n = self.performed[path]
        if path == "/charges":
            return 200, {"id": f"ch_{n}", "amount": body.get("amount")}
        if path == "/refunds":
            return 200, {"id": f"re_{n}", "charge": body.get("charge")}
        if path == "/declined":
            return 402, {"error": "card_declined"}
        return 404, {"error": "no such endpoint"}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        service = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _reply(self, status: int, obj: dict, replayed: bool = False) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if replayed:
                    self.send_header("Idempotent-Replayed", "true")
                self.end_headers()
                self.wfile.write(data)

            def _handle(self) -> None:
                try:
                    self._handle_one()
                finally:
                    snap = service.state()
                    with service.lock:
                        service.history.append(snap)

            def _handle_one(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length).decode() if length else ""
                key = self.headers.get("Idempotency-Key")
                with service.lock:
                    service.requests.append((self.command, self.path, key))
                if key is not None:
                    with service.lock:
                        stored = service._stored.get(key)
                        if stored is not None:
                            if stored[0] != raw:
                                self._reply(422, {"error": "idempotency key reused with "
                                                  "another body"})
                                return
                            self._reply(stored[1], stored[2], replayed=True)
                            return
                        if key in service._running:
                            self._reply(409, {"error": "a request with this key is running"})
                            return
                        service._running.add(key)
                try:
                    fault = service._take_fault(self.path)
                    if fault.get("kind") == "reject_503":
                        self._reply(503, {"error": "try again"})
                        return
                    if fault.get("kind") == "delay":
                        time.sleep(float(fault["seconds"]))
                    status, reply = service._effect(self.path, json.loads(raw) if raw else {},
                                                    key)
                    if fault.get("kind") == "error_500":
                        status, reply = 500, {"error": "internal error after the effect"}
                    if key is not None:
                        with service.lock:
                            service._stored[key] = (raw, status, reply)
                    if fault.get("kind") == "drop_after":
                        self.close_connection = True
                        self.connection.shutdown(2)
                        return
                    self._reply(status, reply)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting (a timeout test): the effect stands
                finally:
                    if key is not None:
                        with service.lock:
                            service._running.discard(key)

            do_POST = do_PUT = do_DELETE = do_PATCH = _handle

        return Handler
