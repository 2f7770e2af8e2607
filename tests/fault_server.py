"""A real HTTP server speaking the OpenAI chat API that injects faults, for client tests.

Behaviour is chosen by words in the last user message, e.g. ``"q1 fault=503x2 tokens=7"``:
``fault=<kind>x<n>`` fails the first n attempts of that prompt (kinds: an HTTP status such as 500,
503, 501 or 400 (429 comes with Retry-After), reset, timeout, malformed, empty, badgzip (a body
that does not decompress), redirect (a redirect loop); n=all fails every time), ``then=<status>``
answers the attempts after those with that status, ``tokens=N`` sets completion tokens,
``finish=length`` the finish reason, ``think`` adds reasoning, ``delay=S`` sleeps S seconds.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections import Counter

from aiohttp import web


class FaultServer:
    def __init__(self):
        self.attempts: Counter[str] = Counter()
        self.requests: list[dict] = []
        self.auth_headers: list[str | None] = []
        self.headers: list[dict[str, str]] = []
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self.port = 0

    def __enter__(self) -> FaultServer:
        ready = threading.Event()
        threading.Thread(target=self._serve, args=(ready,), daemon=True).start()
        ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/loop", self._loop_forever)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        ready.set()
        self._loop.run_forever()

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self.auth_headers.append(request.headers.get("Authorization"))
        self.headers.append(dict(request.headers))
        text = body["messages"][-1]["content"]
        key = text + f"#turn{len(body['messages'])}"
        self.attempts[key] += 1
        opts = dict(re.findall(r"(\w+)=(\S+)", text))
        if "delay" in opts:
            await asyncio.sleep(float(opts["delay"]))
        fault = re.fullmatch(r"(\w+)x(\d+|all)", opts.get("fault", "nonex0"))
        if fault and (fault[2] == "all" or self.attempts[key] <= int(fault[2])):
            return await self._fail(fault[1], request)
        if "then" in opts:
            return web.Response(status=int(opts["then"]), text=f"then {opts['then']}")
        tokens = int(opts.get("tokens", 5))
        message = {"role": "assistant", "content": f"answer to {text}"}
        if "think" in text.split():
            message["reasoning_content"] = "thinking it over"
        return web.json_response({
            "choices": [{"index": 0, "message": message, "finish_reason": opts.get("finish", "stop")}],
            "usage": {"prompt_tokens": 3, "completion_tokens": tokens, "total_tokens": tokens + 3}})

    @staticmethod
    async def _loop_forever(_request: web.Request) -> web.StreamResponse:
        raise web.HTTPTemporaryRedirect("/v1/loop")

    async def _fail(self, kind: str, request: web.Request) -> web.StreamResponse:
        if kind.isdigit() and kind != "429":
            return web.Response(status=int(kind), text=f"injected {kind}")
        if kind == "429":
            return web.Response(status=429, text="slow down", headers={"Retry-After": "1"})
        if kind == "reset":
            request.transport.close()
            return web.Response()
        if kind == "timeout":
            await asyncio.sleep(3)  # longer than the tests' 1 s read timeout
        if kind == "malformed":
            return web.Response(status=200, text='{"choices": [', content_type="application/json")
        if kind == "badgzip":
            return web.Response(status=200, body=b"not gzip at all", headers={"Content-Encoding": "gzip",
                                                                             "Content-Type": "application/json"})
        if kind == "redirect":
            raise web.HTTPTemporaryRedirect("/v1/loop")
        if kind == "empty":
            return web.json_response({"choices": [], "usage": {}})
        return web.json_response({"error": json.dumps(kind)}, status=500)
