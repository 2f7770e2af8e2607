"""Regenerate a dataset's answers with the target model: resumable, budgeted, counted.

Semantics (documented in the README):
- **Resume by id.** Each finished record is appended to a journal (flushed and fsynced every
  ``fsync_every`` records). A rerun skips ids already journaled and re-sends only what was in
  flight when the run died. A line cut by a kill is detected and dropped. The journal's name
  carries a hash of everything that changes an answer (model, prompts file, sampling), so a
  settings change never mixes old and new answers.
- **Token budget.** Prompts are launched in file order. A new prompt is not launched once
  ``completion tokens journaled + expected tokens of requests in flight >= token_budget``; the
  expectation per in-flight request is the running mean of finished records (``max_tokens``
  before the first finishes). Requests in flight always complete, so the final total may exceed
  the budget by at most the in-flight answers. ``max_samples`` caps kept records likewise.
- **finish_reason policy.** ``keep`` keeps truncated answers, ``mark`` keeps them with
  ``"truncated": true``, ``drop`` journals them as dropped (not retried on resume) and counts them.
- **Failures** after all retries go to the errors file with class and message, and are counted;
  they are not journaled, so the next run of the dataset tries them again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import signal
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from draftsmith.atomic import write_json, write_jsonl
from draftsmith.client import ChatClient, RequestFailed, RetryPolicy
from draftsmith.datasets import Prompt

log = logging.getLogger(__name__)

RECORD_FORMAT = 1


class GenerationInterrupted(RuntimeError):
    pass


@dataclass
class GenerationSettings:
    max_tokens: int = 512
    temperature: float = 0.0
    top_p: float | None = None
    concurrency: int = 200
    request_timeout_s: float = 1800.0
    connect_timeout_s: float = 30.0
    max_attempts: int = 5
    finish_reason_policy: str = "keep"
    chat_template_kwargs: dict[str, Any] | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)
    fsync_every: int = 16

    @classmethod
    def from_config(cls, cfg: dict) -> GenerationSettings:
        known = {k: v for k, v in cfg.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    def sampling(self) -> dict[str, Any]:
        body: dict[str, Any] = {"max_tokens": self.max_tokens, "temperature": self.temperature}
        if self.top_p is not None:
            body["top_p"] = self.top_p
        if self.chat_template_kwargs:
            body["chat_template_kwargs"] = self.chat_template_kwargs
        return {**body, **self.extra_body}


def settings_key(model: str, prompts_file: Path, settings: GenerationSettings) -> str:
    """Hash of everything that changes an answer: names the journal so settings never mix."""
    payload = json.dumps([model, str(prompts_file), settings.sampling(), settings.finish_reason_policy],
                         sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


class Journal:
    """Append-only record log; tolerant of a last line cut by kill -9."""

    def __init__(self, path: Path, fsync_every: int):
        self.path = path
        self.fsync_every = fsync_every
        self._pending = 0
        self._fh = None

    def load(self) -> dict[str, dict]:
        records: dict[str, dict] = {}
        if not self.path.exists():
            return records
        good_bytes = 0
        with self.path.open("rb") as fh:
            for number, raw in enumerate(fh, start=1):
                try:
                    if not raw.endswith(b"\n"):
                        raise ValueError("cut")
                    rec = json.loads(raw)
                except ValueError:
                    log.warning("%s: line %d is incomplete (cut by a kill?); dropping it and resending",
                                self.path, number)
                    break
                if rec.get("format") != RECORD_FORMAT:
                    raise ValueError(f"{self.path}: line {number} has record format {rec.get('format')!r}, "
                                     f"this draftsmith writes format {RECORD_FORMAT}; delete the journal "
                                     "to regenerate that dataset")
                records[rec["id"]] = rec
                good_bytes += len(raw)
        if good_bytes != self.path.stat().st_size:
            os.truncate(self.path, good_bytes)
        return records

    def append(self, record: dict) -> None:
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("a", encoding="utf-8")
        self._fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._pending += 1
        if self._pending >= self.fsync_every:
            self.sync()

    def sync(self) -> None:
        if self._fh is not None and self._pending:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._pending = 0

    def close(self) -> None:
        self.sync()
        if self._fh is not None:
            self._fh.close()
            self._fh = None


@dataclass
class Outputs:
    responses: Path
    stats: Path
    errors: Path
    journal: Path


@dataclass
class _Run:
    """Mutable state of one generation run."""

    done: dict[str, dict]
    completion_tokens: int = 0
    kept: int = 0
    in_flight: int = 0
    errors: list[dict] = field(default_factory=list)
    requests_this_run: int = 0
    cost: float = 0.0
    tokens_this_run: int = 0
    started: float = field(default_factory=time.monotonic)

    def expected_per_request(self, max_tokens: int) -> float:
        return self.completion_tokens / self.kept if self.kept else float(max_tokens)


async def generate(prompts: list[Prompt], client: ChatClient | None, settings: GenerationSettings, outputs: Outputs,
                   *, max_samples: int | None, token_budget: int | None, dataset: str,
                   rejects: int = 0) -> dict:
    """Answer ``prompts`` through ``client`` and write responses, stats and errors atomically.

    ``client`` may be None when :func:`has_work` said there is nothing to send.
    """
    journal = Journal(outputs.journal, settings.fsync_every)
    run = _resume(prompts, journal)
    todo = [p for p in prompts if p.id not in run.done]
    log.info("%s: %d prompts, %d already journaled, %d to send", dataset, len(prompts), len(prompts) - len(todo),
             len(todo))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        loop.add_signal_handler(sig, stop.set)
    bar = tqdm(total=_bar_total(len(prompts), max_samples, token_budget), desc=dataset,
               unit="tok" if token_budget else "rec", initial=run.completion_tokens if token_budget else run.kept,
               mininterval=2.0, dynamic_ncols=True)
    try:
        await _launch_all(todo, client, settings, journal, run, bar, stop, max_samples, token_budget)
    finally:
        journal.close()
        bar.close()
        for sig, handler in previous.items():
            loop.remove_signal_handler(sig)
            signal.signal(sig, handler)  # e.g. the managed server's "stop me" handler
    if stop.is_set():
        raise GenerationInterrupted(f"{dataset}: interrupted; {len(run.done)} records are journaled in "
                                    f"{outputs.journal} and a rerun resumes from there")
    stats = _stats(dataset, prompts, run, client, time.monotonic() - run.started, rejects, max_samples, token_budget)
    ordered = [run.done[p.id] for p in prompts if p.id in run.done and run.done[p.id]["status"] == "ok"]
    write_jsonl(outputs.errors, run.errors)
    write_json(outputs.stats, stats)
    write_jsonl(outputs.responses, ordered)
    return stats


def _resume(prompts: list[Prompt], journal: Journal) -> _Run:
    """State of a run that starts from what the journal already holds."""
    run = _Run(done=journal.load())
    ids = {p.id for p in prompts}
    for rec in run.done.values():
        if rec["id"] in ids and rec["status"] == "ok":
            run.kept += 1
            run.completion_tokens += rec["usage"]["completion_tokens"]
    return run


def has_work(prompts: list[Prompt], journal_path: Path, max_samples: int | None, token_budget: int | None) -> bool:
    """Whether a run would send anything, so a finished dataset does not start a server."""
    run = _resume(prompts, Journal(journal_path, 1))
    if all(p.id in run.done for p in prompts):
        return False
    if max_samples is not None and run.kept >= max_samples:
        return False
    return token_budget is None or run.completion_tokens < token_budget


def _bar_total(n: int, max_samples: int | None, token_budget: int | None) -> int:
    if token_budget:
        return token_budget
    return min(n, max_samples) if max_samples else n


async def _launch_all(todo, client, settings, journal, run, bar, stop, max_samples, token_budget) -> None:
    """Launch prompts in order, at most ``concurrency`` at once, until done, budget or stop."""
    tasks: set[asyncio.Task] = set()
    stopper = asyncio.create_task(stop.wait())

    async def wait_some() -> None:
        done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
        for task in done - {stopper}:
            tasks.discard(task)
            task.result()  # surface bugs; request failures are handled inside _one

    def budget_reached() -> bool:
        if max_samples is not None and run.kept + run.in_flight >= max_samples:
            return True
        expected = run.completion_tokens + run.in_flight * run.expected_per_request(settings.max_tokens)
        return token_budget is not None and expected >= token_budget

    try:
        for prompt in todo:
            while len(tasks) >= settings.concurrency and not stop.is_set():
                await wait_some()
            if stop.is_set() or budget_reached():
                break
            run.in_flight += 1
            tasks.add(asyncio.create_task(_one(prompt, client, settings, journal, run, bar)))
        while tasks and not stop.is_set():
            await wait_some()
    finally:
        stopper.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _one(prompt: Prompt, client: ChatClient, settings: GenerationSettings, journal: Journal, run: _Run,
               bar: tqdm) -> None:
    run.requests_this_run += 1
    try:
        messages: list[dict] = [{"role": "system", "content": prompt.system}] if prompt.system else []
        usage = {"prompt_tokens": 0, "completion_tokens": 0}
        finish_reasons: list[str | None] = []
        begun = time.monotonic()
        try:
            for turn in prompt.turns:  # multi-turn prompts are answered turn by turn
                messages.append({"role": "user", "content": turn})
                result = await client.chat(messages, settings.sampling())
                answer: dict[str, Any] = {"role": "assistant", "content": result.content}
                if result.reasoning:
                    answer["reasoning"] = result.reasoning
                messages.append(answer)
                usage["prompt_tokens"] += result.prompt_tokens
                usage["completion_tokens"] += result.completion_tokens
                finish_reasons.append(result.finish_reason)
                run.cost += result.cost or 0.0
        except RequestFailed as failed:
            run.errors.append({"id": prompt.id, "error_class": failed.error_class, "message": failed.message,
                               "attempts": failed.attempts})
            log.warning("%s failed: %s", prompt.id, failed)
            return
        truncated = "length" in finish_reasons
        status = "dropped_truncated" if truncated and settings.finish_reason_policy == "drop" else "ok"
        record = {"format": RECORD_FORMAT, "id": prompt.id, "status": status, "messages": messages,
                  "finish_reason": finish_reasons[-1], "finish_reasons": finish_reasons, "usage": usage,
                  "latency_s": round(time.monotonic() - begun, 3)}
        if settings.finish_reason_policy == "mark":
            record["truncated"] = truncated
        journal.append(record)
        run.done[prompt.id] = record
        if status == "ok":
            run.kept += 1
            run.completion_tokens += usage["completion_tokens"]
            run.tokens_this_run += usage["completion_tokens"]
            bar.update(usage["completion_tokens"] if bar.unit == "tok" else 1)
            elapsed = max(time.monotonic() - run.started, 1e-6)
            bar.set_postfix(rec=run.kept, req_s=f"{run.requests_this_run / elapsed:.2f}",
                            tok_s=f"{run.tokens_this_run / elapsed:.0f}", refresh=False)
    finally:
        run.in_flight -= 1


def _stats(dataset, prompts, run: _Run, client: ChatClient, wall_s, rejects, max_samples, token_budget) -> dict:
    ids = {p.id for p in prompts}
    records = [r for r in run.done.values() if r["id"] in ids]
    ok = [r for r in records if r["status"] == "ok"]
    lat = sorted(r["latency_s"] for r in ok)
    return {
        "dataset": dataset,
        "prompts_available": len(prompts),
        "rejected_rows": rejects,
        "records": len(ok),
        "dropped_truncated": sum(r["status"] == "dropped_truncated" for r in records),
        "truncated_kept": sum(r["status"] == "ok" and "length" in r["finish_reasons"] for r in ok),
        "errors": len(run.errors),
        "errors_by_class": dict(Counter(e["error_class"] for e in run.errors)),
        "retries": client.stats.retries if client else 0,
        "retries_by_class": client.stats.retries_by_class if client else {},
        "requests_by_endpoint": client.requests_by_endpoint if client else [],
        "prompt_tokens": sum(r["usage"]["prompt_tokens"] for r in ok),
        "completion_tokens": sum(r["usage"]["completion_tokens"] for r in ok),
        "max_samples": max_samples,
        "token_budget": token_budget,
        "requests_this_run": run.requests_this_run,
        "latency_p50_s": statistics.median(lat) if lat else None,
        "latency_p95_s": lat[min(len(lat) - 1, int(0.95 * len(lat)))] if lat else None,
        "wall_s_this_run": round(wall_s, 3),
        "cost": run.cost or None,
    }


def make_client(base_urls: str | list[str], model: str, settings: GenerationSettings, api_key_env: str | None,
                headers: dict[str, str] | None) -> ChatClient:
    """The API key is read from the environment variable named in config, never from config itself."""
    api_key = None
    if api_key_env:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            raise ValueError(f"environment variable {api_key_env} (generation_server.api_key_env) is not set")
    return ChatClient(base_urls, model, api_key=api_key, headers=headers,
                      request_timeout_s=settings.request_timeout_s, connect_timeout_s=settings.connect_timeout_s,
                      retry=RetryPolicy(max_attempts=settings.max_attempts), max_connections=settings.concurrency)
