"""Sampling or a fault, at a sampled export gate: the drafter replayed on the answers its own server served.

At T > 0 the gate compares two samples: the server's answers, and the one stored answer per row the prediction
walks (:func:`draftsmith.training.replay.at_gate`). A gap between them is sampling, a fault of the engine, or stored
answers that are not distributed like served output. This benchmark takes the difference between the two samples
away: it serves the gate's rows from a finished run (its exported drafter, ``--per-request-spec-decode-metrics
detailed``), reads back the token ids each request served, computes the target's hidden states of exactly those
tokens (a bare transformers forward pass, the stored layers), and replays the drafter on them:

- **by matches**: a draft accepted where the served token is the draft (greedy drafts: vLLM's rejection sampler
  emits the draft exactly when it accepts it, and draws the recovered token with the draft removed). An engine
  that does what the replay assumes serves the same counts, request by request: position by position, the same
  number of steps;
- **by expected acceptance** on the served tokens (the gate's own estimator), and on the stored answers (the gate's
  prediction): averaged over rows, the two agree where the stored answers are distributed like served output.

It also reads, over each answer's window, the target's mean log-probability of the answer's tokens (at the
answers' sampling) and the share that are the target's argmax, for the stored and the served answers: a stored
answer re-tokenized or trimmed otherwise than the server writes shows there.

    .venv/bin/python benchmarks/served_replay.py RUN --config RUN_CONFIG.yaml [--rows 19] [--samples 4] [--seed 1]

RUN is a finished workflow folder (``results/drafters/{family}/gate.json``, its merged table and hidden states); the
server is vLLM's, started as the gate starts it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from draftsmith.config.load import EMBEDDED, WORKFLOW_DIR, load_layers, validate_config  # noqa: E402
from draftsmith.config.target import resolve  # noqa: E402
from draftsmith.core import compute  # noqa: E402
from draftsmith.evaluation.measure import evaluate as ev  # noqa: E402
from draftsmith.generation.generate import answer_sampling, model_sampling  # noqa: E402
from draftsmith.generation.server import managed_server  # noqa: E402
from draftsmith.hidden_states.extract import extract_transformers  # noqa: E402
from draftsmith.training import export as ex  # noqa: E402
from draftsmith.training import replay  # noqa: E402

PER_REQUEST = ["--per-request-spec-decode-metrics", "detailed"]


class Served:
    """The hidden states computed here for the served answers, read as a store is (``read(row)``)."""

    def __init__(self):
        self.rows: dict[int, dict] = {}

    def write(self, row: int, states: torch.Tensor, ids: torch.Tensor) -> None:
        self.rows[row] = {"hidden_states": states.clone(), "token_ids": ids.clone()}

    def read(self, row: int) -> dict:
        return self.rows[row]


def engine_counts(response: dict, k: int) -> dict:
    """vLLM's own counts for one request: its verify steps and the drafts accepted at each position."""
    counts = ex.request_counts(response) or {"drafts": 0, "accepted": [0] * k}
    detail = response["metrics"]["speculative_decoding"]
    return {**counts, "per_step": detail.get("per_step_accepted")}


def walked(walks: list[replay.Walk]) -> list[dict]:
    return [{"drafts": w.steps, "accepted": list(w.accepted)} for w in walks]


def answer_stats(head: replay.TargetHead, ids: list[int], final: torch.Tensor, first: int, last: int,
                 sampling: dict) -> tuple[float, int, int]:
    """Over the answer's positions ``first`` to ``last``: the sum of the target's log-probability of each token at
    ``sampling`` (temperature, top-k, top-p applied), the tokens that are the target's argmax, and the tokens."""
    logp, argmax = 0.0, 0
    for start, logits in head.logits(final[first - 1:last]):
        probabilities = replay.served_probabilities(logits, sampling)
        for j in range(logits.shape[0]):
            token = ids[first + start + j]
            logp += math.log(max(probabilities[j, token].item(), 1e-30))
            argmax += int(logits[j].argmax().item() == token)
    return logp, argmax, last - first + 1


def pooled(rows: list[dict], position: int) -> float:
    drafts = sum(r["drafts"] for r in rows)
    return sum(r["accepted"][position] for r in rows) / drafts if drafts else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a finished workflow folder")
    parser.add_argument("--config", type=Path, required=True, help="the config the run was made with")
    parser.add_argument("--family", default="eagle3")
    parser.add_argument("--rows", type=int, help="validation rows (default: the gate's size)")
    parser.add_argument("--samples", type=int, default=4, help="served samples per row, each with its own seed")
    parser.add_argument("--seed", type=int, default=None, help="the first request's seed (default: drawn)")
    parser.add_argument("--out", type=Path, help="write every request's figures and served tokens here (JSON)")
    parser.add_argument("--served", type=Path, help="an earlier --out: replay its served tokens, serve nothing")
    args = parser.parse_args()
    run = args.run.resolve()
    config = validate_config(load_layers([WORKFLOW_DIR / EMBEDDED, args.config.resolve()], {}))
    os.chdir(run)
    tgt = resolve(config["target"], run)
    samplings = answer_sampling(config["datasets"], model_sampling(tgt.model, tgt.revision))
    any_sampled = any(replay.sampled(s) for s in samplings.values())
    table = run / "results" / "merged" / "train.parquet"
    manifests = sorted((run / "results" / "hidden_states").glob("*/manifest.json"))
    stores, skip = replay.open_stores(manifests)
    aux = json.loads(manifests[0].read_text())["aux_layers"]
    checkpoint = Path(json.loads((run / "results" / "train" / args.family / "training.json").read_text())["checkpoint"])
    drafter_dir = run / "results" / "drafters" / args.family
    rows = ex.gate_rows(table, args.rows or ex.gate_size(config["export"].get("gate_prompts"), any_sampled),
                        samplings, skip=skip)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    requests, of_row = ex.gate_requests(rows, args.samples, seed)
    name, k = ev.drafted_per_step(str(drafter_dir), ex.GATE_CHAIN)
    spec = ev.server_spec("vllm", tgt, config["server"], name, k, str(drafter_dir))
    spec.extra_args = [a for a in spec.extra_args if not a.startswith(PER_REQUEST[0])] + PER_REQUEST
    print(f"{len(rows)} rows x {args.samples} samples (seed {seed}), k={k}, window {ex.GATE_WINDOW}", flush=True)
    if args.served:  # the same rows, samples and seed, served before
        earlier = json.loads(args.served.read_text())
        engine, served_ids = earlier["engine"], earlier["served_ids"]
    else:
        with tempfile.TemporaryDirectory() as scratch, managed_server(spec, Path(scratch) / "server.log") as server:
            bodies = [(ids, n, {**s, "return_token_ids": True}) for ids, n, s in requests]
            responses = asyncio.run(ev.continue_rows(server.base_url, tgt.model, bodies, 2))
        engine = [engine_counts(r, k) for r in responses]
        served_ids = [list(r["choices"][0]["token_ids"]) for r in responses]

    # the served answers' hidden states: the stored layers, in the stored states' dtype
    probe = next(iter(stores.values())).read(replay.held_out(table, skip, 1)[0]["source_row"])["hidden_states"]
    served = Served()
    device = compute.device()  # the job's accelerator where it has one, as the gate's replay runs
    todo = [(i, [*requests[i][0], *served_ids[i]]) for i in range(len(requests))]
    extract_transformers(tgt.model, todo, served, aux, threads=torch.get_num_threads(),
                         dtype=str(probe.dtype).removeprefix("torch."), device=device)
    head = replay.TargetHead(Path(tgt.model), device)
    drafter = replay.load_drafter(checkpoint, Path(tgt.model), device)
    served_rows = []
    samplings_served = [{key: v for key, v in s.items() if key != "seed"} for _, _, s in requests]  # a draw's seed
    for i, (ids, _, _) in enumerate(requests):  # is no sampling parameter: the expected walk would refuse it
        sampling = samplings_served[i]
        full = torch.tensor([*ids, *served_ids[i]], dtype=torch.long)
        final = served.read(i)["hidden_states"][:, -1]
        served_rows.append(replay.Row(("served", i), full, [0] * len(ids) + [1] * len(served_ids[i]),
                                      head.tokens(final), sampling=sampling if replay.sampled(sampling) else None))
    stores_served = {"served": served}
    by_matches = walked(replay.predict(drafter, served_rows, stores_served, [k], window=ex.GATE_WINDOW,
                                       first_turn_only=True, head=None)[k][1])
    expected_served = walked(replay.predict(drafter, served_rows, stores_served, [k], window=ex.GATE_WINDOW,
                                            first_turn_only=True, head=head)[k][1])
    predicted, why = replay.at_gate(checkpoint, table, stores, skip, Path(tgt.model), len(rows), k, ex.GATE_WINDOW,
                                    device, samplings)
    if predicted is None:
        raise SystemExit(f"the stored-answer replay failed: {why}")

    # the answers themselves: log-probability and argmax share, stored against served
    stored_rows, _ = replay.rows_and_head(table, stores, skip, Path(tgt.model), device, samplings, limit=len(rows),
                                          tokens=2**62)
    text_stats = {"stored": [0.0, 0, 0], "served": [0.0, 0, 0]}
    for row in stored_rows:
        first, last = replay.turns(row.loss_mask)[0]
        last = min(last, first + ex.GATE_WINDOW - 1)
        final = replay.read_states(stores, {"dataset": row.key[0], "source_row": row.key[1],
                                            "input_ids": row.input_ids.tolist()})[:, -1]
        for j, v in enumerate(answer_stats(head, row.input_ids.tolist(), final, first, last,
                                           row.sampling or replay.GREEDY)):
            text_stats["stored"][j] += v
    for i, row in enumerate(served_rows):
        first = len(requests[i][0])
        last = len(row.input_ids) - 1
        for j, v in enumerate(answer_stats(head, row.input_ids.tolist(), served.read(i)["hidden_states"][:, -1],
                                           first, last, samplings_served[i] if replay.sampled(samplings_served[i])
                                           else replay.GREEDY)):
            text_stats["served"][j] += v

    same = sum(e["drafts"] == m["drafts"] and e["accepted"] == [round(a) for a in m["accepted"]]
               for e, m in zip(engine, by_matches, strict=True))
    print("\n| row | sample | served tokens | vLLM steps / accepted by position | replay by matches, served | "
          "expected, served | expected, stored (the gate's prediction) |")
    print("|---:|---:|---:|---|---|---|---|")
    for i, row in enumerate(of_row):
        e, m, x, p = engine[i], by_matches[i], expected_served[i], predicted["per_row"][row]
        sample = sum(1 for j in of_row[:i] if j == row)
        print(f"| {row} | {sample} | {len(served_ids[i])} | {e['drafts']} / {e['accepted']} | {m['drafts']} / "
              f"{[round(a) for a in m['accepted']]} | {x['drafts']} / {[round(a, 2) for a in x['accepted']]} | "
              f"{p['drafts']} / {[round(a, 2) for a in p['accepted']]} |")
    print(f"\nrequests whose vLLM counts equal the replay by matches on their served tokens: {same} of {len(engine)}")
    print("\n| position | vLLM served | replay by matches, served | expected, served | expected, stored (prediction) |")
    print("|---:|---:|---:|---:|---:|")
    for pos in range(k):
        print(f"| {pos + 1} | {pooled(engine, pos):.4f} | {pooled(by_matches, pos):.4f} | "
              f"{pooled(expected_served, pos):.4f} | {pooled(predicted['per_row'], pos):.4f} |")
    print("\n| answers | tokens | mean log-probability at their sampling | target's argmax share |")
    print("|---|---:|---:|---:|")
    for label, (logp, argmax, n) in text_stats.items():
        print(f"| {label} | {n} | {logp / n:.4f} | {argmax / n:.4f} |")
    if args.out:
        args.out.write_text(json.dumps({"seed": seed, "rows": len(rows), "samples": args.samples, "k": k,
                                        "of_row": of_row, "engine": engine, "by_matches": by_matches,
                                        "expected_served": expected_served, "predicted": predicted["per_row"],
                                        "served_ids": served_ids,
                                        "text_stats": text_stats}, indent=1))


if __name__ == "__main__":
    main()
