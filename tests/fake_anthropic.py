"""A fake Anthropic Messages endpoint on loopback, for testing through the real `anthropic` SDK.

A test scripts the replies in order (a tool call, a 429, a 500, a body that is not JSON, ...), points the SDK's
`base_url` at `fake.url`, and afterwards reads `fake.requests` to see exactly what the SDK sent: bodies, headers,
and the SDK's own retry count. No network beyond 127.0.0.1 is touched.

    with FakeAnthropic() as fake:
        fake.error(429)
        fake.tool_use({"lr": 0.01, "rationale": "..."})
        client = anthropic.Anthropic(base_url=fake.url, max_retries=2)
"""

from __future__ import annotations

import itertools
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


@dataclass
class Reply:
    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    raw: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.raw)

    @property
    def text(self) -> str:
        return self.raw.decode("utf-8", "replace")


class FakeAnthropic:
    def __init__(self) -> None:
        self._script: list[tuple[Reply, int | None]] = []  # (reply, remaining times; None = forever)
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.requests: list[Request] = []
        self.unscripted = 0  # requests that found the script empty: a test made more calls than it expected
        self._server: ThreadingHTTPServer | None = None

    # -- lifecycle ----------------------------------------------------------------------------------------------

    def start(self) -> FakeAnthropic:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                fake._handle(self)

            def do_GET(self) -> None:
                fake._handle(self)

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        # A short poll interval makes stop() quick (shutdown waits for the serving loop to notice).
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeAnthropic:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the fake first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def messages_requests(self) -> list[Request]:
        return [r for r in self.requests if r.method == "POST" and r.path.startswith("/v1/messages")]

    # -- scripting ----------------------------------------------------------------------------------------------

    def push(self, reply: Reply, times: int | None = 1) -> None:
        with self._lock:
            self._script.append((reply, times))

    def message(
        self,
        content: list[dict],
        *,
        stop_reason: str = "end_turn",
        input_tokens: int = 1200,
        output_tokens: int = 80,
        model: str = "claude-fake",
        times: int | None = 1,
    ) -> None:
        body = {
            "id": f"msg_{next(self._ids):04d}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
        }
        self.push(Reply(200, json.dumps(body).encode()), times)

    def tool_use(self, tool_input: Any, *, name: str = "propose_trial", **kw: Any) -> None:
        """An answer that calls the tool, as a forced tool_choice makes the real API answer."""
        block = {"type": "tool_use", "id": f"toolu_{next(self._ids):04d}", "name": name, "input": tool_input}
        self.message([block], stop_reason="tool_use", **kw)

    def text(self, text: str, **kw: Any) -> None:
        """An answer without any tool call."""
        self.message([{"type": "text", "text": text}], **kw)

    def error(
        self,
        status: int,
        message: str = "scripted failure",
        *,
        retry_after_ms: str | None = "1",
        times: int | None = 1,
        headers: dict[str, str] | None = None,
    ) -> None:
        """An API error. retry-after-ms makes the SDK's retries immediate (plain retry-after 0 would fall back to
        its exponential backoff)."""
        body = {"type": "error", "error": {"type": _ERROR_TYPES.get(status, "api_error"), "message": message}}
        hdrs = dict(headers or {})
        if retry_after_ms is not None:
            hdrs["retry-after-ms"] = retry_after_ms
        self.push(Reply(status, json.dumps(body).encode(), hdrs), times)

    def raw(self, status: int, body: bytes, **kw: Any) -> None:
        """Any bytes at all, e.g. a 200 whose body is not JSON."""
        self.push(Reply(status, body), **kw)

    # -- serving ------------------------------------------------------------------------------------------------

    def _next_reply(self) -> Reply:
        with self._lock:
            if not self._script:
                self.unscripted += 1
                body = {
                    "type": "error",
                    "error": {"type": "invalid_request_error", "message": "fake: no reply scripted for this request"},
                }
                return Reply(400, json.dumps(body).encode(), {"x-should-retry": "false"})
            reply, times = self._script[0]
            if times is not None:
                if times <= 1:
                    self._script.pop(0)
                else:
                    self._script[0] = (reply, times - 1)
            return reply

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("content-length") or 0)
        raw = h.rfile.read(length) if length else b""
        with self._lock:
            self.requests.append(Request(h.command, h.path, {k.lower(): v for k, v in h.headers.items()}, raw))
        reply = self._next_reply()
        h.send_response(reply.status)
        h.send_header("content-type", "application/json")
        h.send_header("content-length", str(len(reply.body)))
        h.send_header("request-id", f"req_fake_{len(self.requests):04d}")
        for k, v in reply.headers.items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(reply.body)
