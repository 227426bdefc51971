"""A real OpenAI-compatible chat-completions server on loopback, answering from a script.

`serve(script)` starts it on 127.0.0.1 (a free port) in a background thread and yields a
`ChatServer`: `base_url` (`http://127.0.0.1:<port>/v1`) and `requests`, every request it
received in order. Each `POST /v1/chat/completions` takes the next step of the script:

- `Answer(content=..., tool_calls=[Call(...)], delay=...)`: a chat completion;
- `Hang()`: read the request, never answer (until the server shuts down);
- `Malformed(body=...)`: a 200 whose body is not JSON;
- `Status(code, body=..., headers=...)`: an error status (429 with Retry-After, 500, ...).

A request past the end of the script gets a 500 saying so.

`POST /v1/embeddings` takes the next step too: `Embeddings(dim=..., reverse=...)` answers
in the OpenAI embeddings shape (one vector per input, made from the text), and `Hang`,
`Malformed` and `Status` work the same there.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeAlias


@dataclass(frozen=True)
class Call:
    """One tool call in an answer; `arguments` is sent as written (a JSON string, or not)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Answer:
    """A chat completion with `content` and/or `tool_calls`, sent after `delay` seconds."""

    content: str | None = None
    tool_calls: Sequence[Call] = ()
    delay: float = 0.0


@dataclass(frozen=True)
class Hang:
    """Read the request and never answer; the connection stays open until shutdown."""


@dataclass(frozen=True)
class Malformed:
    """A 200 answer whose body is not JSON."""

    body: bytes = b'{"id": "chatcmpl-1", "choices": [{"message": '


@dataclass(frozen=True)
class Status:
    """An error answer: `code`, a JSON error body, extra headers (e.g. Retry-After)."""

    code: int
    body: str = '{"error": {"message": "try again later"}}'
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Embeddings:
    """An embeddings answer: one `dim`-sized vector per input (`vector_for` the text), in
    `data[]` in reverse order when `reverse` (clients must sort by `index`)."""

    dim: int = 8
    reverse: bool = False
    delay: float = 0.0


def vector_for(text: str, dim: int) -> list[float]:
    """The server's vector for `text`: deterministic, not normalised, never zero."""
    seed = sum(text.encode()) + len(text)
    return [float((seed * (i + 3)) % 17 + 1) for i in range(dim)]


Step: TypeAlias = Answer | Hang | Malformed | Status | Embeddings


@dataclass(frozen=True)
class Received:
    """One request as the server saw it: `body` is the decoded JSON (or None)."""

    path: str
    headers: dict[str, str]
    body: Any
    peer: tuple[str, int]


class ChatServer:
    """The running server: its `base_url`, and the `requests` it has received so far."""

    def __init__(self, script: Sequence[Step]) -> None:
        self.script = list(script)
        self.requests: list[Received] = []
        self.closing = threading.Event()
        self._lock = threading.Lock()
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._http.daemon_threads = True
        host, port = self._http.server_address[:2]
        self.base_url = f"http://{host!s}:{port}/v1"
        self._thread = threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def bodies(self) -> list[Any]:
        """The JSON bodies of the requests received so far."""
        return [r.body for r in self.requests]

    def take(self, received: Received) -> Step | None:
        with self._lock:
            self.requests.append(received)
            return self.script.pop(0) if self.script else None

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self.closing.set()  # hung and delayed handlers return now
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(5)


@contextmanager
def serve(script: Sequence[Step]) -> Iterator[ChatServer]:
    """Run a `ChatServer` answering `script` for the duration of the block."""
    server = ChatServer(script)
    server.start()
    try:
        yield server
    finally:
        server.close()


def completion(content: str | None, tool_calls: Sequence[Call] = ()) -> dict[str, Any]:
    """A chat.completions answer in the OpenAI shape."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in tool_calls
        ]
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "test-model",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if tool_calls else "stop",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def _handler_for(server: ChatServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the client may reuse its connection
        timeout = 10  # an idle keep-alive connection does not hold a thread forever

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            received = Received(
                path=self.path,
                headers={k.lower(): v for k, v in self.headers.items()},
                body=body,
                peer=self.client_address[:2],
            )
            step = server.take(received)
            if self.path not in ("/v1/chat/completions", "/v1/embeddings"):
                self._send(404, b'{"error": {"message": "not found"}}')
            elif step is None:
                self._send(500, b'{"error": {"message": "the test script is exhausted"}}')
            elif isinstance(step, Hang):
                server.closing.wait()
                self.close_connection = True
            elif isinstance(step, Malformed):
                self._send(200, step.body)
            elif isinstance(step, Status):
                self._send(step.code, step.body.encode(), step.headers)
            elif isinstance(step, Embeddings):
                if step.delay and server.closing.wait(step.delay):
                    self.close_connection = True
                    return
                texts = body.get("input", []) if isinstance(body, dict) else []
                data = [
                    {"object": "embedding", "index": i, "embedding": vector_for(t, step.dim)}
                    for i, t in enumerate(texts)
                ]
                answer = {
                    "object": "list",
                    "data": data[::-1] if step.reverse else data,
                    "model": body.get("model") if isinstance(body, dict) else None,
                    "usage": {"prompt_tokens": 1, "total_tokens": 1},
                }
                self._send(200, json.dumps(answer).encode())
            else:
                if step.delay and server.closing.wait(step.delay):
                    self.close_connection = True
                    return
                answer = completion(step.content, step.tool_calls)
                self._send(200, json.dumps(answer).encode())

        def _send(self, code: int, body: bytes, headers: dict[str, str] | None = None) -> None:
            try:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)
            except OSError:  # the client gave up (its budget ended): nothing to answer
                self.close_connection = True

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet tests

    return Handler
