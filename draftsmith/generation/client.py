"""Async OpenAI-compatible chat client for long generation runs against one or more endpoints.

Works against vLLM, SGLang or a hosted API. What it guarantees:

- **Retries** with full-jitter exponential backoff on connection errors, timeouts,
  408/409/425/429, 5xx (except 501/505, which will not get better), malformed JSON and empty
  ``choices``; ``Retry-After`` is honoured up to a cap. Every other 4xx, a redirect loop or a bad
  URL fails at once. A request that still fails raises :class:`RequestFailed` with its class and
  the number of attempts it really made.
- **Endpoint health.** Each endpoint has a circuit breaker: after ``trip_after`` connection
  failures in a row it is taken out of rotation and probed (``GET /models``) with a growing
  cooldown before any request goes there again. Requests go to the least busy healthy endpoint
  (random tie-break), and a retry avoids the endpoint that just failed when there is another.
- **Systemic failure is loud.** Once every endpoint is out of rotation, the outage is timed: when
  the last one has been out for ``outage_grace_s`` (time down, not a count of failures, which
  would stretch with the probes' back-off), waiting requests raise :class:`EndpointsDown`
  instead of retrying forever; the caller stops the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from draftsmith.data.tool_calls import arguments_text

RETRYABLE_STATUS = {408, 409, 425, 429}
FINAL_5XX = {501, 505}  # not implemented / HTTP version not supported: retrying cannot help
CONNECTION = "connection"


@dataclass
class RetryPolicy:
    max_attempts: int = 5
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0
    max_retry_after_s: float = 600.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Full-jitter exponential backoff; a server's Retry-After wins when it asks for longer (capped)."""
        backoff = random.uniform(0, min(self.backoff_max_s, self.backoff_base_s * 2 ** (attempt - 1)))
        return max(backoff, min(retry_after or 0.0, self.max_retry_after_s))


@dataclass
class HealthPolicy:
    trip_after: int = 3
    cooldown_s: float = 2.0
    cooldown_max_s: float = 60.0
    outage_grace_s: float = 120.0
    probe_timeout_s: float = 10.0


@dataclass
class ChatResult:
    content: str
    reasoning: str | None
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    attempts: int
    cost: float | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    verify_steps: int | None = None  # SGLang's target steps for this request (meta_info.spec_verify_ct)
    tool_calls: list[dict] | None = None  # OpenAI shape, each with an id and its arguments as a JSON string


@dataclass
class RequestFailed(Exception):
    error_class: str
    message: str
    attempts: int

    def __str__(self) -> str:
        return f"{self.error_class}: {self.message} (after {self.attempts} attempts)"


class EndpointsDown(RuntimeError):
    """Every endpoint is unreachable and stayed so: the run cannot make progress."""


@dataclass
class ClientStats:
    retries: int = 0
    retries_by_class: dict[str, int] = field(default_factory=dict)


class _Retryable(Exception):
    def __init__(self, error_class: str, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.error_class = error_class
        self.retry_after = retry_after


@dataclass
class Endpoint:
    url: str
    http: httpx.AsyncClient
    in_flight: int = 0
    requests: int = 0
    failures_in_a_row: int = 0
    down_since: float | None = None
    probe_at: float = 0.0
    cooldown_s: float = 0.0
    probing: bool = False
    last_error: str = ""

    @property
    def up(self) -> bool:
        return self.down_since is None


class EndpointPool:
    """Health-aware choice among endpoints; see the module docstring for the policy."""

    def __init__(self, endpoints: list[Endpoint], policy: HealthPolicy):
        self.endpoints = endpoints
        self.policy = policy
        self.fatal: EndpointsDown | None = None
        self._changed = asyncio.Event()
        self._probes: set[asyncio.Task] = set()

    async def acquire(self, avoid: Endpoint | None = None) -> Endpoint:
        """The least busy healthy endpoint (not ``avoid`` if another is up); waits while none is."""
        while True:
            if self.fatal:
                raise self.fatal
            up = [e for e in self.endpoints if e.up]
            if up:
                choices = [e for e in up if e is not avoid] or up
                least = min(e.in_flight for e in choices)
                endpoint = random.choice([e for e in choices if e.in_flight == least])
                endpoint.in_flight += 1
                endpoint.requests += 1
                return endpoint
            self._tick()
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=0.5)

    def release(self, endpoint: Endpoint, *, connection_failed: bool, reason: str = "") -> None:
        endpoint.in_flight -= 1
        if connection_failed:
            self._failed(endpoint, reason)
        else:
            self._recovered(endpoint)

    def _failed(self, endpoint: Endpoint, reason: str) -> None:
        endpoint.failures_in_a_row += 1
        endpoint.last_error = reason
        now = time.monotonic()
        if endpoint.up and endpoint.failures_in_a_row >= self.policy.trip_after:
            endpoint.down_since = now
            endpoint.cooldown_s = self.policy.cooldown_s
            endpoint.probe_at = now + endpoint.cooldown_s
        self._check_outage()

    def _recovered(self, endpoint: Endpoint) -> None:
        endpoint.failures_in_a_row = 0
        if not endpoint.up:
            endpoint.down_since = None
            self._changed.set()

    def _check_outage(self) -> None:
        now, policy = time.monotonic(), self.policy
        if self.fatal or any(e.up for e in self.endpoints):
            return
        down_for = now - max(e.down_since for e in self.endpoints)
        if down_for >= policy.outage_grace_s:
            urls = ", ".join(e.url for e in self.endpoints)
            self.fatal = EndpointsDown(
                f"no endpoint reachable for {down_for:.0f} s (outage_grace_s {policy.outage_grace_s:.0f}): {urls}; "
                f"last error: {self.endpoints[-1].last_error}")
            self._changed.set()

    def _tick(self) -> None:
        """Start due probes of endpoints that are down, and notice a lasting outage."""
        now = time.monotonic()
        for endpoint in self.endpoints:
            if not endpoint.up and not endpoint.probing and now >= endpoint.probe_at:
                endpoint.probing = True
                task = asyncio.create_task(self._probe(endpoint))
                self._probes.add(task)
                task.add_done_callback(self._probes.discard)
        self._check_outage()

    async def _probe(self, endpoint: Endpoint) -> None:
        try:
            response = await endpoint.http.get("/models", timeout=self.policy.probe_timeout_s)
            alive = response.status_code < 500
            reason = f"probe answered {response.status_code}"
        except httpx.HTTPError as err:
            alive, reason = False, f"probe: {type(err).__name__}: {err}"
        finally:
            endpoint.probing = False
        if alive:
            self._recovered(endpoint)
        else:
            endpoint.cooldown_s = min(endpoint.cooldown_s * 2, self.policy.cooldown_max_s)
            endpoint.probe_at = time.monotonic() + endpoint.cooldown_s
            self._failed(endpoint, reason)

    async def aclose(self) -> None:
        for task in list(self._probes):
            task.cancel()
        await asyncio.gather(*self._probes, return_exceptions=True)
        for endpoint in self.endpoints:
            await endpoint.http.aclose()


class ChatClient:
    """Chat completions against one or more OpenAI-compatible endpoints."""

    def __init__(self, base_urls: str | list[str], model: str, *, api_key: str | None = None,
                 headers: dict[str, str] | None = None, request_timeout_s: float = 1800.0,
                 connect_timeout_s: float = 30.0, retry: RetryPolicy | None = None,
                 health: HealthPolicy | None = None, max_connections: int = 200):
        all_headers = dict(headers or {})
        if api_key:
            all_headers["Authorization"] = f"Bearer {api_key}"
        self.model = model
        self.retry = retry or RetryPolicy()
        self.stats = ClientStats()
        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        if not urls:
            raise ValueError("no endpoint base URL given")
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self.pool = EndpointPool([Endpoint(url, httpx.AsyncClient(
            base_url=url.rstrip("/"), headers=all_headers, limits=limits, follow_redirects=True,
            timeout=httpx.Timeout(request_timeout_s, connect=connect_timeout_s))) for url in urls],
            health or HealthPolicy())

    @property
    def requests_by_endpoint(self) -> list[int]:
        return [e.requests for e in self.pool.endpoints]

    async def aclose(self) -> None:
        await self.pool.aclose()

    async def chat(self, messages: list[dict], sampling: dict[str, Any], tools: list[dict] | None = None,
                   text_tool_calls: Callable[[str], list[dict]] | None = None) -> ChatResult:
        """One answer. With ``tools`` the request carries them and ``tool_choice: auto`` (the model
        decides; the server's parser fills ``message.tool_calls``). ``text_tool_calls`` reads the calls
        from the answer's text instead, where the tools were rendered as text and no parser runs."""
        body = {"model": self.model, "messages": messages, **sampling}
        if tools:
            body |= {"tools": tools, "tool_choice": "auto"}
        attempt = 0
        last: Endpoint | None = None
        while True:
            attempt += 1
            endpoint = await self.pool.acquire(avoid=last)
            try:
                result = self._parse(await self._post(endpoint, body), attempt)
                if text_tool_calls is not None:
                    result.tool_calls = _tool_calls(text_tool_calls(result.content))
                return result
            except _Retryable as err:
                last = endpoint
                if attempt >= self.retry.max_attempts:
                    raise RequestFailed(err.error_class, str(err), attempt) from None
                self.stats.retries += 1
                self.stats.retries_by_class[err.error_class] = self.stats.retries_by_class.get(err.error_class, 0) + 1
                await asyncio.sleep(self.retry.delay(attempt, err.retry_after))
            except RequestFailed as err:
                err.attempts = attempt
                raise

    async def _post(self, endpoint: Endpoint, body: dict) -> dict:
        connection_failed, reason = False, ""
        try:
            response = await endpoint.http.post("/chat/completions", json=body)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.NetworkError, httpx.RemoteProtocolError) as err:
            connection_failed, reason = True, f"{type(err).__name__}: {err}"
            raise _Retryable(CONNECTION, f"{endpoint.url}: {reason}") from None
        except httpx.TimeoutException as err:
            raise _Retryable("timeout", f"{type(err).__name__}: {err}") from None
        except (httpx.DecodingError, httpx.TransportError) as err:
            raise _Retryable("transport", f"{type(err).__name__}: {err}") from None
        except (httpx.TooManyRedirects, httpx.InvalidURL, httpx.UnsupportedProtocol) as err:
            raise RequestFailed("request", f"{type(err).__name__}: {err}", 0) from None
        finally:
            self.pool.release(endpoint, connection_failed=connection_failed, reason=reason)
        status = response.status_code
        if status in RETRYABLE_STATUS or (status >= 500 and status not in FINAL_5XX):
            raise _Retryable(f"http_{status}", _short(response.text), _retry_after(response))
        if status >= 400:
            raise RequestFailed(f"http_{status}", _short(response.text), 0)
        try:
            return response.json()
        except ValueError:
            raise _Retryable("malformed_json", _short(response.text)) from None

    @staticmethod
    def _parse(payload: dict, attempt: int) -> ChatResult:
        choices = payload.get("choices") if isinstance(payload, dict) else None
        if not choices or not isinstance(choices[0], dict):
            raise _Retryable("empty_choices", f"response has no choices: {_short(str(payload))}")
        choice = choices[0]
        message = choice.get("message") or {}
        # vLLM names it `reasoning` (newer) or `reasoning_content`; SGLang and hosted APIs vary.
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        reasoning = reasoning if isinstance(reasoning, str) else None
        content = message.get("content")
        finish_reason = choice.get("finish_reason")
        tool_calls = _tool_calls(message.get("tool_calls"))
        if content is None and (reasoning or tool_calls or finish_reason == "length"):
            content = ""  # cut while thinking, or only calls: an answer, not an error
        if not isinstance(content, str):
            raise _Retryable("malformed_response", "choices[0].message.content is not a string")
        usage = payload.get("usage") or {}
        return ChatResult(content=content, reasoning=reasoning, finish_reason=finish_reason,
                          prompt_tokens=int(usage.get("prompt_tokens") or 0),
                          completion_tokens=int(usage.get("completion_tokens") or 0),
                          attempts=attempt, cost=usage.get("cost"),
                          token_ids=_int_list(choice.get("token_ids")),
                          prompt_token_ids=_int_list(payload.get("prompt_token_ids")),
                          verify_steps=_verify_steps(choice), tool_calls=tool_calls)


def _tool_calls(value: Any) -> list[dict] | None:
    """``message.tool_calls`` in OpenAI's shape, or None when the answer made none. A call without a
    function name is a malformed answer (retried like one)."""
    if not value:
        return None
    if not isinstance(value, list):
        raise _Retryable("malformed_response", "choices[0].message.tool_calls is not a list")
    return [normalize_call(call, i) for i, call in enumerate(value)]


def normalize_call(call: Any, index: int) -> dict:
    """A tool call as draftsmith records it: ``{"id", "type": "function", "function": {"name", "arguments"}}``
    with the arguments as a JSON string. Takes OpenAI's shape or Hermes' flat ``{"name", "arguments"}``
    (text tool calls); an id the server did not give is ``call_<index>``."""
    function = call.get("function", call) if isinstance(call, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or not name:
        raise _Retryable("malformed_response", f"tool call {index} has no function name: {_short(str(call))}")
    arguments = arguments_text(function.get("arguments", {}))
    call_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else f"call_{index}"
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _verify_steps(choice: dict) -> int | None:
    """SGLang's target verification steps for the request, where it was asked for them (``return_meta_info``)."""
    steps = (choice.get("meta_info") or {}).get("spec_verify_ct")
    return int(steps) if isinstance(steps, int | float) else None


def _int_list(value: Any) -> list[int] | None:
    return [int(v) for v in value] if isinstance(value, list) else None


def _retry_after(response: httpx.Response) -> float | None:
    """Seconds the server asks us to wait; None when absent, unparsable or not finite."""
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    return max(0.0, seconds) if math.isfinite(seconds) else None


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"
