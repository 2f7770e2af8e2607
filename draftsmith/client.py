"""Async OpenAI-compatible chat client: bounded retries with backoff, jitter and Retry-After.

Works against vLLM, SGLang or a hosted API. Errors are classified so the generation stats can
count them by class; a request that still fails after its attempts raises :class:`RequestFailed`.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

RETRYABLE_STATUS = {408, 409, 425, 429}


@dataclass
class RetryPolicy:
    max_attempts: int = 5
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Full-jitter exponential backoff; a server's Retry-After wins when it asks for longer."""
        backoff = random.uniform(0, min(self.backoff_max_s, self.backoff_base_s * 2 ** (attempt - 1)))
        return max(backoff, retry_after or 0.0)


@dataclass
class ChatResult:
    content: str
    reasoning: str | None
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    attempts: int
    cost: float | None = None


@dataclass
class RequestFailed(Exception):
    error_class: str
    message: str
    attempts: int

    def __str__(self) -> str:
        return f"{self.error_class}: {self.message} (after {self.attempts} attempts)"


@dataclass
class ClientStats:
    retries: int = 0
    retries_by_class: dict[str, int] = field(default_factory=dict)


class _Retryable(Exception):
    def __init__(self, error_class: str, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.error_class = error_class
        self.retry_after = retry_after


class ChatClient:
    """Chat completions against one or more OpenAI-compatible endpoints.

    With several base URLs (one server per node, say) every attempt goes to the endpoint with
    the fewest requests in flight, so a retry after a failure usually lands elsewhere.
    """

    def __init__(self, base_urls: str | list[str], model: str, *, api_key: str | None = None,
                 headers: dict[str, str] | None = None, request_timeout_s: float = 1800.0,
                 connect_timeout_s: float = 30.0, retry: RetryPolicy | None = None,
                 max_connections: int = 200):
        all_headers = dict(headers or {})
        if api_key:
            all_headers["Authorization"] = f"Bearer {api_key}"
        self.model = model
        self.retry = retry or RetryPolicy()
        self.stats = ClientStats()
        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        if not urls:
            raise ValueError("no endpoint base URL given")
        self._endpoints = [httpx.AsyncClient(
            base_url=url.rstrip("/"), headers=all_headers,
            timeout=httpx.Timeout(request_timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections))
            for url in urls]
        self._in_flight = [0] * len(urls)
        self.requests_by_endpoint = [0] * len(urls)

    async def aclose(self) -> None:
        for endpoint in self._endpoints:
            await endpoint.aclose()

    async def chat(self, messages: list[dict], sampling: dict[str, Any]) -> ChatResult:
        body = {"model": self.model, "messages": messages, **sampling}
        attempt = 0
        while True:
            attempt += 1
            try:
                return self._parse(await self._post(body), attempt)
            except _Retryable as err:
                if attempt >= self.retry.max_attempts:
                    raise RequestFailed(err.error_class, str(err), attempt) from None
                self.stats.retries += 1
                self.stats.retries_by_class[err.error_class] = self.stats.retries_by_class.get(err.error_class, 0) + 1
                await asyncio.sleep(self.retry.delay(attempt, err.retry_after))

    async def _post(self, body: dict) -> dict:
        i = min(range(len(self._endpoints)), key=self._in_flight.__getitem__)
        self._in_flight[i] += 1
        self.requests_by_endpoint[i] += 1
        try:
            response = await self._endpoints[i].post("/chat/completions", json=body)
        except httpx.TimeoutException as err:
            raise _Retryable("timeout", f"{type(err).__name__}: {err}") from None
        except httpx.TransportError as err:
            raise _Retryable("connection", f"{type(err).__name__}: {err}") from None
        finally:
            self._in_flight[i] -= 1
        status = response.status_code
        if status in RETRYABLE_STATUS or status >= 500:
            raise _Retryable(f"http_{status}", _short(response.text), _retry_after(response))
        if status >= 400:
            raise RequestFailed(f"http_{status}", _short(response.text), 1)
        try:
            return response.json()
        except ValueError:
            raise _Retryable("malformed_json", _short(response.text)) from None

    @staticmethod
    def _parse(payload: dict, attempt: int) -> ChatResult:
        choices = payload.get("choices") if isinstance(payload, dict) else None
        if not choices:
            raise _Retryable("empty_choices", f"response has no choices: {_short(str(payload))}")
        choice = choices[0]
        message = choice.get("message") or {}
        content = message.get("content")
        if not isinstance(content, str):
            raise _Retryable("malformed_response", "choices[0].message.content is not a string")
        # vLLM names it `reasoning` (newer) or `reasoning_content`; SGLang and hosted APIs vary.
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        usage = payload.get("usage") or {}
        return ChatResult(content=content, reasoning=reasoning if isinstance(reasoning, str) else None,
                          finish_reason=choice.get("finish_reason"),
                          prompt_tokens=int(usage.get("prompt_tokens") or 0),
                          completion_tokens=int(usage.get("completion_tokens") or 0),
                          attempts=attempt, cost=usage.get("cost"))


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
        except (TypeError, ValueError):
            return None


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"
