"""A simulated OpenAI-compatible endpoint that behaves like a reasoning model at scale.

What it does, per ``/v1/chat/completions`` request:

- answers with ``reasoning_content`` (or ``reasoning``) and ``content``; lengths are drawn
  (deterministically per conversation) from log-normal distributions with a long tail;
- applies ``max_tokens`` as a reasoning model does: cut while thinking gives ``content: null``,
  ``finish_reason: length``; cut while answering gives a partial content;
- with a tokenizer, renders the conversation through a chat template (``reasoning`` in history
  messages is handed over as ``reasoning_content``, as vLLM does) to count prompt tokens, and
  returns ``prompt_token_ids``/``token_ids`` when asked (``return_token_ids``);
- sleeps ``latency_s + per_token_s * tokens`` to look busy;
- fails on request: ``die_after`` (stops listening and drops connections after N requests),
  ``retry_after`` (a 429 with that Retry-After value on the first attempt of each conversation
  turn), ``template_mismatch`` (renders prompts with an extra system message), ``think_format:
  compact`` (the model's tokens lack the newlines the template writes), ``think_format: missing``
  (a random-weight Qwen3: no think tags at all, so the reasoning parser files the whole answer as
  reasoning and the content is empty).

Run in a thread (``with ReasoningSim(...) as sim: sim.base_url``) or as a process
(``python -m tests.sim.reasoning_server --port 0 --print-port``) for benchmarks.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import math
import random
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

TEMPLATE = (Path(__file__).parent / "qwen3_style.jinja").read_text()
WORDS = (
    "the", "of", "and", "to", "in", "is", "it", "that", "for", "on", "with", "as",
    "was", "at", "by", "be", "this", "from", "or", "have", "an", "are", "not", "but",
    "we", "can", "all", "one", "so", "if", "more", "when", "will", "would", "there", "their",
    "what", "about", "which", "out", "up", "time", "they",
)


@dataclass
class SimSettings:
    reasoning_field: str = "reasoning_content"
    reasoning_log_mean: float = math.log(120)
    content_log_mean: float = math.log(60)
    log_sigma: float = 0.8
    think: bool = True
    latency_s: float = 0.0
    per_token_s: float = 0.0
    die_after: int | None = None
    retry_after: str | None = None
    template_mismatch: bool = False
    think_format: str = "template"
    tokenizer: object | None = None


@dataclass
class Stats:
    requests: int = 0
    answered: int = 0
    attempts: Counter = field(default_factory=Counter)


class ReasoningSim:
    def __init__(self, settings: SimSettings | None = None, port: int = 0):
        self.settings = settings or SimSettings()
        self.stats = Stats()
        self.port = port
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._dead = False

    # --- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> ReasoningSim:
        ready = threading.Event()
        threading.Thread(target=self._serve, args=(ready,), daemon=True).start()
        ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        if not self._dead:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def kill(self) -> None:
        """Stop listening and drop every open connection, like a crashed server."""
        asyncio.run_coroutine_threadsafe(self._die(), self._loop).result(10)

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        ready.set()
        self._loop.run_forever()

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, backlog=1024)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]

    async def _die(self) -> None:
        if not self._dead:
            self._dead = True
            await self._runner.cleanup()

    # --- handlers ----------------------------------------------------------------------------
    @staticmethod
    async def _health(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _models(self, _request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "sim", "object": "model"}]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        s = self.settings
        body = await request.json()
        self.stats.requests += 1
        if s.die_after is not None and self.stats.requests > s.die_after:
            asyncio.get_running_loop().create_task(self._die())
            request.transport.close()
            return web.Response(status=500)
        messages = body["messages"]
        key = hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()
        self.stats.attempts[key] += 1
        if s.retry_after is not None and self.stats.attempts[key] == 1:
            return web.Response(status=429, text="slow down", headers={"Retry-After": s.retry_after})
        answer = self._answer(key, messages, body)
        await asyncio.sleep(s.latency_s + s.per_token_s * answer["usage"]["completion_tokens"])
        self.stats.answered += 1
        return web.json_response(answer)

    # --- the "model" -------------------------------------------------------------------------
    def _answer(self, key: str, messages: list[dict], body: dict) -> dict:
        s = self.settings
        rng = random.Random(key)
        max_tokens = int(body.get("max_tokens") or 16)
        n_reason = max(1, int(rng.lognormvariate(s.reasoning_log_mean, s.log_sigma))) if s.think else 0
        n_content = max(1, int(rng.lognormvariate(s.content_log_mean, s.log_sigma)))
        reasoning = " ".join(rng.choice(WORDS) for _ in range(n_reason))
        content = " ".join(rng.choice(WORDS) for _ in range(n_content))
        if s.tokenizer is not None:
            produced, reasoning, content, finish = self._tokenized(reasoning if s.think else None, content, max_tokens)
            prompt_ids = self._prompt_ids(messages, body.get("chat_template_kwargs") or {})
        else:
            produced, reasoning, content, finish = self._by_words(reasoning if s.think else None, content, max_tokens)
            prompt_ids = list(range(sum(len(str(m.get("content") or "").split()) + 4 for m in messages)))
        message = {"role": "assistant", "content": content}
        if reasoning is not None:
            message[s.reasoning_field] = reasoning
        choice = {"index": 0, "message": message, "finish_reason": finish}
        payload = {"id": key[:12], "object": "chat.completion", "model": body.get("model"), "choices": [choice],
                   "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(produced),
                             "total_tokens": len(prompt_ids) + len(produced)}}
        if body.get("return_token_ids"):
            choice["token_ids"] = produced
            payload["prompt_token_ids"] = prompt_ids
        return payload

    @staticmethod
    def _by_words(reasoning, content, max_tokens):
        r_words = reasoning.split() if reasoning else []
        c_words = content.split()
        if len(r_words) >= max_tokens:
            return list(range(max_tokens)), " ".join(r_words[:max_tokens]), None, "length"
        room = max_tokens - len(r_words)
        finish = "length" if len(c_words) + 1 > room else "stop"
        c_words = c_words[:room]
        return list(range(len(r_words) + len(c_words) + (finish == "stop"))), reasoning, " ".join(c_words), finish

    def _tokenized(self, reasoning, content, max_tokens):
        tok = self.settings.tokenizer
        if self.settings.think_format == "missing" and reasoning is not None:
            ids = tok(f"{reasoning} {content}<|im_end|>", add_special_tokens=False)["input_ids"][:max_tokens]
            return ids, tok.decode(ids, skip_special_tokens=True), "", "length" if len(ids) == max_tokens else "stop"
        compact = self.settings.think_format == "compact"
        head = ("<think>" if compact else "<think>\n") if reasoning is not None else ""
        mid = ("</think>" if compact else "\n</think>\n\n") if reasoning is not None else ""
        text = f"{head}{reasoning or ''}{mid}{content}<|im_end|>"
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if len(ids) <= max_tokens:
            return ids, reasoning, content, "stop"
        ids = ids[:max_tokens]
        decoded = tok.decode(ids)
        if reasoning is not None and mid not in decoded:
            return ids, decoded[len(head):], None, "length"
        return ids, reasoning, decoded[len(head) + len(reasoning or "") + len(mid):], "length"

    def _prompt_ids(self, messages: list[dict], kwargs: dict) -> list[int]:
        conversation = []
        for m in messages:
            m = dict(m)
            if m.get("reasoning") is not None:
                m["reasoning_content"] = m["reasoning"]
            conversation.append(m)
        if self.settings.template_mismatch:
            conversation = [{"role": "system", "content": "You are a helpful assistant."}, *conversation]
        text = self.settings.tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True,
                                                           chat_template=TEMPLATE, **kwargs)
        return self.settings.tokenizer(text, add_special_tokens=False)["input_ids"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency-s", type=float, default=0.0)
    parser.add_argument("--per-token-s", type=float, default=0.0)
    parser.add_argument("--die-after", type=int)
    parser.add_argument("--reasoning-log-mean", type=float, default=7.0, help="log of the median reasoning length")
    parser.add_argument("--content-log-mean", type=float, default=6.0, help="log of the median answer length")
    args = parser.parse_args()
    sim = ReasoningSim(SimSettings(latency_s=args.latency_s, per_token_s=args.per_token_s, die_after=args.die_after,
                                   reasoning_log_mean=args.reasoning_log_mean,
                                   content_log_mean=args.content_log_mean), port=args.port)
    with sim:
        print(sim.port, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            sys.stdin.read()  # runs until the parent closes our stdin


if __name__ == "__main__":
    main()
