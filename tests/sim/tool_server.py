"""A deterministic OpenAI-compatible endpoint that calls tools as the prompt scripts it.

The last user message holding ``calls=`` scripts the stretch that follows it: ``calls=a,b+c`` calls
``a`` in the first answer, ``b`` and ``c`` at once (parallel) in the second, and answers in text in
the third and later ones. A call's arguments are ``{"step": <its answer's place>}``, or as scripted after
its name: ``calls=get_weather:city=Paris;days=2`` calls ``get_weather(city="Paris", days=2)`` (a value
is read as JSON where it is JSON, else as a string), ``calls=pwd:`` calls ``pwd()``. The answer's place in
the stretch is the number of assistant messages since that user message, so the server keeps no state between
requests and a resumed run gets the same answers. ``length=N`` ends the N-th answer (0-based) with
``finish_reason: length``; ``delay=S`` sleeps S seconds before answering.

With ``text=True`` the calls are written into the content as Hermes ``<tool_call>`` blocks (what a
model does where the tools are rendered as text and no parser runs), else returned in
``message.tool_calls``. ``return_token_ids`` gets, with a ``tokenizer``, the ids it gives for the text the
answer stands for (its content, or its calls as Hermes blocks: what a Qwen3 model writes and the parser
reads), else one made-up id per word of the answer. With ``reasoning=True`` every answer thinks first
(``reasoning: thinking <place>``, its ids behind ``<think>`` tags as Qwen3 writes them), and a history
answer's ``reasoning`` reaches the template as ``reasoning_content``, as vLLM 0.32 hands it on. Every request
body is kept in ``requests``. Runs in a thread like :class:`tests.sim.reasoning_server.ReasoningSim`.
"""

from __future__ import annotations

import asyncio
import json
import re

from aiohttp import web

from tests.sim.reasoning_server import ReasoningSim


class ToolSim(ReasoningSim):
    """``tokenizer``: count each prompt as the target's template renders it with the request's tools, and the
    calls' arguments as objects (what vLLM hands the template), so the tokenize stage's prompt round trip holds."""

    def __init__(self, text: bool = False, port: int = 0, tokenizer=None, reasoning: bool = False):
        super().__init__(port=port)
        self.text = text
        self.tokenizer = tokenizer
        self.reasoning = reasoning
        self.requests: list[dict] = []

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        messages = body["messages"]
        start = max((i for i, m in enumerate(messages) if m["role"] == "user" and "calls=" in str(m["content"])),
                    default=max(i for i, m in enumerate(messages) if m["role"] == "user"))
        script = str(messages[start]["content"])
        place = sum(m["role"] == "assistant" for m in messages[start:])
        delay = re.search(r"delay=([\d.]+)", script)
        await asyncio.sleep(float(delay.group(1)) if delay else 0.0)
        return web.json_response(self._answer_at(script, place, body))

    def _answer_at(self, script: str, place: int, body: dict) -> dict:
        found = re.search(r"calls=(\S+)", script)
        stretch = found.group(1).split(",") if found else []
        names = stretch[place].split("+") if place < len(stretch) else []
        calls = [{"id": f"call_{place}_{i}", "type": "function", "function": _scripted_call(name, place)}
                 for i, name in enumerate(names)]
        message: dict = {"role": "assistant", "content": f"answer {place} done"}
        finish = "tool_calls" if calls else "stop"
        written = "\n".join(
            f'<tool_call>\n{{"name": "{c["function"]["name"]}", "arguments": {c["function"]["arguments"]}}}\n'
            "</tool_call>" for c in calls) if calls else message["content"]
        if calls and self.text:
            message["content"] = written
        elif calls:
            message = {"role": "assistant", "content": None, "tool_calls": calls}
        if self.reasoning:
            message["reasoning"] = f"thinking {place}"
            written = f"<think>\n{message['reasoning']}\n</think>\n\n{written}"
        length = re.search(r"length=(\d+)", script)
        if length and int(length.group(1)) == place:
            finish = "length"
        produced = list(self.tokenizer(written, add_special_tokens=False)["input_ids"]) if self.tokenizer \
            else list(range(len(json.dumps(message).split())))
        choice = {"index": 0, "message": message, "finish_reason": finish}
        prompt_tokens = self._prompt_tokens(body) if self.tokenizer else len(json.dumps(body["messages"]).split())
        payload = {"id": f"sim-{place}", "object": "chat.completion", "model": body.get("model"), "choices": [choice],
                   "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(produced)}}
        if body.get("return_token_ids"):
            choice["token_ids"] = produced
        return payload

    def _prompt_tokens(self, body: dict) -> int:
        messages = [{**m, "tool_calls": [{**c, "function": {**c["function"],
                                                             "arguments": json.loads(c["function"]["arguments"])}}
                                         for c in m["tool_calls"]]} if m.get("tool_calls") else m
                    for m in body["messages"]]
        messages = [{**{k: v for k, v in m.items() if k != "reasoning"}, "reasoning_content": m["reasoning"]}
                    if m.get("reasoning") else m for m in messages]
        text = self.tokenizer.apply_chat_template(messages, tools=body.get("tools"), tokenize=False,
                                                  add_generation_prompt=True, **body.get("chat_template_kwargs", {}))
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])


def _scripted_call(script: str, place: int) -> dict:
    """``name`` or ``name:key=value;key=value`` as the call's function."""
    name, colon, arguments = script.partition(":")
    if not colon:
        return {"name": name, "arguments": json.dumps({"step": place})}
    if not arguments:  # "name:": no arguments
        return {"name": name, "arguments": "{}"}
    parsed = {}
    for pair in arguments.split(";"):
        key, _, value = pair.partition("=")
        try:
            parsed[key] = json.loads(value)
        except json.JSONDecodeError:
            parsed[key] = value
    return {"name": name, "arguments": json.dumps(parsed)}
