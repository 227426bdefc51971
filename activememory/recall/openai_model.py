"""The OpenAI-compatible chat-completions recall model (docs/design.md §4.8).

One client for every provider under `models.providers` with `api: "openai-completions"`
(OpenAI, Cerebras, Ollama, vLLM, LM Studio): it asks the model, runs the memory tools the
model calls, and returns the model's answer. The recall budget is passed down as the
request timeout, and there are no retries and no failover inside it (docs/design.md §4.6, §4.9).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Self

import anyio

from .._http import ERROR_BODY_CHARS, HttpFailure, post_json
from ..protocol.config import Provider
from ..protocol.errors import ActiveMemoryError
from ..protocol.recall import RecallRequest
from .tools import RecallTools

if TYPE_CHECKING:
    import httpx

DEFAULT_REQUEST_TIMEOUT_S: Final = 30.0  # per request, when the run has no deadline
MAX_ANSWER_BYTES: Final = 8 * 1024 * 1024  # a runaway or hostile provider cannot fill memory

# docs/design.md §4.1 `thinking` levels as OpenAI `reasoning_effort` values ("off" sends nothing).
_REASONING_EFFORT: Final[Mapping[str, str]] = {
    "minimal": "minimal",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
    "max": "high",
    "adaptive": "medium",
}
# `fast_mode` as an OpenAI `service_tier` (None sends nothing).
_SERVICE_TIER: Final[Mapping[object, str]] = {True: "priority", False: "default", "auto": "auto"}
_BAD_ARGUMENTS: Final = json.dumps({"error": "arguments are not a JSON object"})
_NO_NAME: Final = json.dumps({"error": "the tool call names no function"})


class ChatCompletionsClient:
    """An OpenAI-compatible chat-completions endpoint: the one round trip (request, capped
    read, answer checks) of the recall model and the pruning judge (`OpenAIJudge`).

    Requests go to `{base_url}/chat/completions`, with `Authorization: Bearer <api_key>`
    when a key is set. One `httpx.AsyncClient` serves every request (connections are
    reused); pass `client` to share one of your own (then `aclose` leaves it open). A
    subclass says how a failure reads (`_error`).
    """

    def __init__(
        self, base_url: str, api_key: str | None, client: httpx.AsyncClient | None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + "/chat/completions"
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._owns_client = client is None
        if client is None:
            import httpx  # when a client is made: see `_http`

            client = httpx.AsyncClient()
        self._client = client

    async def complete(self, body: dict[str, Any], *, seconds: float, late: str) -> dict[str, Any]:
        """POST `body`; the answer's `choices[0].message`.

        Raises `self._error(...)` for no answer within `seconds` (saying `late`), a
        network error, a non-2xx status, an answer over `MAX_ANSWER_BYTES`, one that is not
        JSON, or one without `choices[0].message`.

        Cancellation: the request is abandoned; its connection is dropped, not reused.
        """
        try:
            answer = await post_json(
                self._client,
                self.url,
                body,
                headers=self._headers,
                seconds=seconds,
                max_bytes=MAX_ANSWER_BYTES,
            )
        except HttpFailure as failure:
            raise self._error(
                {
                    "timeout": late,
                    "network": f"the request failed ({failure.detail})",
                    "too_large": f"the answer is larger than {MAX_ANSWER_BYTES} bytes",
                    "status": f"the provider answered {failure.detail}",
                    "json": f"the answer is not valid JSON ({failure.detail})",
                }[failure.kind]
            ) from failure.__cause__
        message = _first_message(answer)
        if message is None:
            error = answer.get("error") if isinstance(answer, dict) else None
            if error:
                said = " ".join(str(error)[:ERROR_BODY_CHARS].split())
                raise self._error(f"the provider answered an error: {said}")
            raise self._error("the answer has no choices[0].message")
        return message

    def _error(self, what: str) -> Exception:
        raise NotImplementedError

    async def aclose(self) -> None:
        """Close the HTTP client (unless it was passed in).

        Cancellation: shielded, so closing is never interrupted half-way; connections are
        dropped.
        """
        if self._owns_client:
            with anyio.CancelScope(shield=True):
                await self._client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class RecallModelError(ActiveMemoryError):
    """A recall model call failed: the message names the provider, the model and what happened.

    For example ``cerebras/gpt-oss-120b: the provider answered 429 Too Many Requests: ...``
    or ``ollama/qwen3: no answer within the budget``. The recall run ends `failed` (or
    `timeout`); nothing is retried.
    """


class OpenAICompatibleModel(ChatCompletionsClient):
    """A `RecallModel` that speaks OpenAI chat completions with tool calling.

    `ref` is `provider/model`; the part after the first `/` is the model id sent to the
    provider. `base_url` is the provider's API root (`https://host/v1`); requests, the API
    key and `client` are as `ChatCompletionsClient` says. Works under trio and asyncio.

    The request's switches are forwarded to the recall model only:

    - `thinking` → `reasoning_effort`: "off" sends nothing; minimal, low, medium and high
      as they are; xhigh and max → "high"; adaptive → "medium".
    - `fast_mode` → `service_tier`: True → "priority", "auto" → "auto", False →
      "default", None → nothing sent.

    `max_rounds` bounds the tool-call rounds of one recall: the model is asked at most
    `max_rounds + 1` times.
    """

    def __init__(
        self,
        ref: str,
        *,
        base_url: str,
        api_key: str | None = None,
        client: httpx.AsyncClient | None = None,
        max_rounds: int = 4,
    ) -> None:
        provider, _, model = ref.partition("/")
        if not provider or not model:
            raise ValueError(f"model {ref!r}: expected provider/model")
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"{ref}: base URL {base_url!r} is not an http(s) URL")
        if type(max_rounds) is not int or max_rounds < 0:
            raise ValueError(f"{ref}: max_rounds must be an int >= 0, got {max_rounds!r}")
        super().__init__(base_url, api_key, client)
        self.ref = ref
        self.model_id = model
        self.max_rounds = max_rounds

    async def recall(self, request: RecallRequest, tools: RecallTools) -> str:
        """Ask the model, run the tools it calls, and return its answer ("" for none).

        Each tool-call round appends the assistant message and one `tool` message per call,
        then asks again. Text the model sends along with tool calls is offered to
        `tools.draft`. When the model still asks for tools after `max_rounds` rounds, the
        latest draft (or "") is the answer. Raises `RecallModelError` for a non-2xx status,
        a network error, an answer that is not a chat completion, or the deadline.

        Cancellation: the deadline is `request.deadline` (on the `anyio.current_time()`
        clock), taken on entry: every HTTP request gets the time left as its timeout, and
        the whole call is cancelled at the deadline, so a hung connection never holds it
        longer; that raises `RecallModelError("...: no answer within the budget")`. With no
        deadline, each request has 30 s. A cancellation from outside propagates as
        cancellation. Tool results already recorded in `tools` stay there; the connection
        of an interrupted request is dropped, not reused.
        """
        with anyio.CancelScope(deadline=request.deadline) as budget:
            return await self._converse(request, tools)
        assert budget.cancelled_caught  # the only way out of the scope without a return
        raise self._error("no answer within the budget")

    def __repr__(self) -> str:
        return f"OpenAICompatibleModel({self.ref!r}, base_url={self.base_url!r})"

    async def _converse(self, request: RecallRequest, tools: RecallTools) -> str:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": request.prompt},
            {
                "role": "user",
                "content": request.context + "\n\nSearch query: " + request.search_query,
            },
        ]
        body: dict[str, Any] = {"model": self.model_id, "messages": messages}
        schemas = tools.schemas()
        if schemas:
            body["tools"] = schemas
            body["tool_choice"] = "auto"
        effort = _REASONING_EFFORT.get(request.thinking)
        if effort is not None:
            body["reasoning_effort"] = effort
        tier = _SERVICE_TIER.get(request.fast_mode)
        if tier is not None:
            body["service_tier"] = tier
        rounds = 0
        while True:
            message = await self._ask(body, request.deadline)
            text = content_text(message.get("content"))
            calls = message.get("tool_calls")
            if not isinstance(calls, list) or not calls:
                return text
            tools.draft(text)
            if rounds == self.max_rounds:
                return tools.draft_text or ""
            rounds += 1
            messages.append(message)
            for call in calls:
                messages.append(await self._run_tool(call, tools))

    async def _run_tool(self, call: object, tools: RecallTools) -> dict[str, Any]:
        """Run one tool call of the model; the answer is the `tool` message for it."""
        call = call if isinstance(call, dict) else {}
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        call_id = call.get("id")
        reply: dict[str, Any] = {
            "role": "tool",
            "tool_call_id": call_id if isinstance(call_id, str) else "",
        }
        name = function.get("name")
        arguments = _arguments(function.get("arguments"))
        if not isinstance(name, str) or arguments is None:
            reply["content"] = _BAD_ARGUMENTS if isinstance(name, str) else _NO_NAME
            return reply
        result = await tools.call(name, arguments)
        reply["content"] = result.content
        return reply

    async def _ask(self, body: dict[str, Any], deadline: float) -> dict[str, Any]:
        """One chat-completions request, given the time left of the run."""
        if math.isinf(deadline):
            seconds = DEFAULT_REQUEST_TIMEOUT_S
        else:
            seconds = max(0.001, deadline - anyio.current_time())
        return await self.complete(body, seconds=seconds, late="no answer within the budget")

    def _error(self, what: str) -> RecallModelError:
        return RecallModelError(f"{self.ref}: {what}")


def model_from_config(ref: str, provider: Provider) -> OpenAICompatibleModel:
    """The recall model `ref` (`provider/model`) of a `models.providers.<name>` entry.

    Raises `ValueError` when the provider cannot serve recall: its `api` is not
    `openai-completions`, or it has no `baseUrl`.
    """
    if not provider.serves_recall or provider.base_url is None:
        if provider.base_url:
            why = f"its api is {provider.api!r}, not 'openai-completions'"
        else:
            why = "it has no baseUrl"
        raise ValueError(f"{ref}: the provider cannot serve recall: {why}")
    return OpenAICompatibleModel(ref, base_url=provider.base_url, api_key=provider.api_key)


def _first_message(answer: object) -> dict[str, Any] | None:
    if not isinstance(answer, dict):
        return None
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    return message if isinstance(message, dict) else None


def content_text(content: object) -> str:
    """The text of a message's `content`: a string, or the text parts of a list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # some servers answer with content parts
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def _arguments(raw: object) -> dict[str, Any] | None:
    """A tool call's arguments as an object, or None when they are not one."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return None
    return raw if isinstance(raw, dict) else None
