"""Measured evaluations as the evaluate jobs write them, built small for the pick, report and card tests."""

from __future__ import annotations


def run(set_name: str, temperature: float, speedup: float | None, tokens_per_step: float | None,
        tau: float | None = None, rates: tuple[float, ...] = (0.4, 0.1), concurrency: int = 2) -> dict:
    base = 40.0
    return {"set": set_name, "temperature": temperature, "prompts": 3, "output_tokens": 96, "window_s": 3.0,
            "requests": 2 * concurrency, "mean_in_flight": concurrency - 0.1 * (concurrency > 2), "held": True,
            "mean_running": concurrency - 0.5 * (concurrency > 2), "peak_running": float(concurrency),
            "repeats": round(2 * concurrency / 3, 2),
            "output_tok_s": None if speedup is None else base * speedup, "baseline_tok_s": base, "speedup": speedup,
            "acceptance": {"drafts": 10.0, "draft_tokens": 10.0 * len(rates), "accepted_tokens": 5.0,
                           "tau_pooled": tau if tau is not None else tokens_per_step,
                           "tokens_per_step": tokens_per_step, "acceptance_rate_per_position": list(rates)}}


def evaluation(method: str, cells: dict[tuple[int, int], tuple[float | None, float | None]], trained: bool = True,
               sets=(("everyday", 0.0), ("everyday", 1.0))) -> dict:
    """``cells``: (draft tokens, concurrency) -> (speed-up, tokens per step), the same in every run."""
    label = "finetuned" if trained else method
    concurrencies = sorted({c for _, c in cells})
    return {"method": method, "trained": trained, "target": "t", "engine": "vllm", "concurrency": concurrencies,
            "temperatures": sorted({t for _, t in sets}), "max_tokens": 32,
            "draft_lengths": sorted({k for k, _ in cells}), "on_accelerator": False, "seeded_sampling": False,
            "compute": {"dtype": "bfloat16", "reason": "CPU capability AVX512"},
            "baseline": [{"concurrency": c, "runs": [{**run(s, t, None, None, concurrency=c), "output_tok_s": 40.0}
                                                     for s, t in sets]} for c in concurrencies],
            "cells": [{"drafter": label, "k": k, "concurrency": c,
                       "runs": [run(s, t, speedup, tps, concurrency=c) for s, t in sets]}
                      for (k, c), (speedup, tps) in cells.items()],
            "server_start_s": [30.0] * (1 + len({k for k, _ in cells})), "window": [0.0, 1.0]}


def training(done_s: float = 120.0, simulated_tau: float = 1.5) -> dict:
    return {"chosen": {"simulated_tau": simulated_tau}, "phases": {"done_s": done_s}}
