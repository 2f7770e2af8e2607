"""What a server would accept from an EAGLE-3 drafter, predicted without a server: the drafter replayed on the
stored hidden states of held-out answers, walked the way a server drafts and verifies.

speculators' validation figures (``full_acc_k``) are not what a server accepts: they count every position of
every answer (a server verifies from where the last step ended, so it never drafts from inside a run it
accepted), they judge a draft against the verifier's best token *among the draft vocabulary* (a server's
verifier picks from its whole vocabulary), and they count the whole answer where the export gate serves a
window of it. Users of both peers meet the gap (speculators#613: good validation metrics, acceptance ≈ 1.05
in vLLM). This replay closes it:

- the drafter's chain (speculators' own forward, its TTT steps) from every position, teacher-forced with the
  answer's tokens, which are what it drafted wherever every earlier draft of the chain was accepted;
- the target's token at every position: the argmax of its final hidden state through its own norm and LM
  head over the **whole** vocabulary;
- a greedy walk per answer turn: draft ``k`` from the last committed token, accept the leading drafts that
  are the target's tokens, commit them and the target's own next token, draft again from there. A draft step
  at position ``j`` counts only when every earlier one of its step was accepted (vLLM's per-position
  counters count the same).

Exact where the answers are the target's own greedy ones (its token at a position is then the answer's
next token, so teacher forcing feeds the chain what a server would); an estimate for sampled answers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from draftsmith.core import platform

# The argmax over a 1T target's vocabulary (160K) is taken this many positions at a time: 512 x 163,840
# fp32 logits are 320 MiB, where a whole 8,192-token row at once would be 5 GiB.
HEAD_CHUNK = 512


@dataclass
class Walk:
    """A walk's counts: draft steps, drafts accepted at each position, and the tokens the walk covered."""

    k: int
    steps: int = 0
    accepted: list[int] = field(default_factory=list)
    tokens: int = 0

    def __post_init__(self):
        self.accepted = self.accepted or [0] * self.k

    def add(self, other: Walk) -> None:
        self.steps += other.steps
        self.tokens += other.tokens
        self.accepted = [a + b for a, b in zip(self.accepted, other.accepted, strict=True)]

    def as_dict(self) -> dict:
        """The figures the server's counters give: acceptance rate by position, τ per draft and tokens per
        target step (every step drafts: EAGLE-3)."""
        steps = self.steps
        return {"drafts": steps, "accepted_tokens": sum(self.accepted), "tokens": self.tokens,
                "acceptance_rate_per_position": [a / steps for a in self.accepted] if steps else [],
                "tau_pooled": 1.0 + sum(self.accepted) / steps if steps else None,
                "tokens_per_step": 1.0 + sum(self.accepted) / steps if steps else None}


def walk(drafts: list[list[int]], targets: list[int], first: int, last: int) -> Walk:
    """The greedy draft-and-verify walk over one answer turn whose tokens are at positions ``first..last`` of its
    row. ``drafts[s][i]``: the drafter's ``s``-th draft from the token at ``i`` (its chain's prediction of the
    token at ``i + s + 1``); ``targets[j]``: the target's token after position ``j``. The first answer token
    comes from the prompt's prefill; each step drafts from the last committed token, accepts the leading drafts
    equal to the target's tokens, and commits those and the target's next token. A draft past ``last`` (the
    answer, or the window served, ends) is not accepted."""
    k = len(drafts)
    out = Walk(k, tokens=last - first + 1)
    at = first  # the last committed token
    while at < last:
        out.steps += 1
        accepted = 0
        while accepted < k and at + accepted + 1 <= last and drafts[accepted][at] == targets[at + accepted]:
            out.accepted[accepted] += 1
            accepted += 1
        at += accepted + 1
    return out


def turns(loss_mask: list[int]) -> list[tuple[int, int]]:
    """The supervised runs of a row (its answer turns) as ``(first, last)`` positions."""
    spans, start = [], None
    for i, supervised in enumerate([*loss_mask, 0]):
        if supervised and start is None:
            start = i
        elif not supervised and start is not None:
            spans.append((start, i - 1))
            start = None
    return spans


class Replay:
    """An EAGLE-3 checkpoint with its target's final norm and whole-vocabulary LM head, on ``device``."""

    def __init__(self, checkpoint: Path, target_dir: Path, device: str = "cpu"):
        from speculators.models.eagle3.core import Eagle3DraftModel
        from speculators.utils.loading import load_model_layers
        from transformers import AutoConfig

        config = Eagle3DraftModel.config_class.from_pretrained(checkpoint)
        # uncompiled (this forward runs once): FlexAttention is fast only compiled
        config.transformer_layer_config._attn_implementation = platform.draft_attention(device, compiled=False)
        config.speculators_config.verifier.name_or_path = str(target_dir)  # the prepared target, wherever it is
        model = Eagle3DraftModel.from_pretrained(checkpoint, config=config)
        model.load_verifier_weights()  # the target's embeddings, which the checkpoint does not carry
        self.model = model.to(device).eval()
        self.device = device
        weights = load_model_layers(["lm_head.weight", "embed_tokens.weight", "model.norm.weight"], str(target_dir))
        self.head = weights.get("lm_head.weight", weights["embed_tokens.weight"]).to(device)
        self.norm_weight = weights["model.norm.weight"].to(device)
        target_config = AutoConfig.from_pretrained(target_dir)
        text = getattr(target_config, "text_config", target_config)
        self.eps = getattr(text, "rms_norm_eps", 1e-6)
        self.d2t = self.model.d2t.to(device)

    @torch.no_grad()
    def chains(self, input_ids: torch.Tensor, hidden_states: torch.Tensor, k: int) -> tuple[list[list[int]], list[int]]:
        """For one row (``input_ids`` ``[seq]``, ``hidden_states`` ``[seq, layers, hidden]``: the stored aux layers
        then the final one), the drafts from every position (``drafts[s][i]``, target vocabulary) and the
        target's token after every position. Aligned as speculators trains (``shift_batch``): the chain from
        the token at ``i`` reads the aux states at ``i - 1`` and that token."""
        hidden_states = hidden_states.to(self.device)
        aux = hidden_states[:-1, :-1].flatten(1).to(self.model.fc.weight.dtype)
        ids = input_ids[1:].to(self.device)
        seq = ids.shape[0]
        out = self.model(hidden_states=aux[None], input_ids=ids[None],
                         document_ids=torch.zeros(1, seq, dtype=torch.long, device=self.device), ttt_steps=k)
        drafts = [[0, *(step[0] + self.d2t[step[0]]).tolist()] for step in out]  # position 0 drafts nothing
        final = hidden_states[:, -1].float()
        targets = []
        for start in range(0, final.shape[0], HEAD_CHUNK):
            part = final[start:start + HEAD_CHUNK]
            normed = part * torch.rsqrt(part.pow(2).mean(-1, keepdim=True) + self.eps) * self.norm_weight.float()
            targets += (normed @ self.head.float().T).argmax(-1).tolist()
        return drafts, targets

    def predict(self, rows: list[tuple[torch.Tensor, list[int], torch.Tensor]], k: int, window: int | None = None,
                first_turn_only: bool = False) -> tuple[Walk, list[Walk]]:
        """The walk over ``rows`` (``(input_ids, loss_mask, hidden_states)``), in total and per row; ``window``:
        at most that many tokens of each turn (what the export gate serves of it), and ``first_turn_only``: the
        first turn of each row (what the gate serves)."""
        total, per_row = Walk(k), []
        for ids, mask, hidden in rows:
            drafts, targets = self.chains(ids, hidden, k)
            row = Walk(k)
            for first, last in turns(mask)[:1] if first_turn_only else turns(mask):
                row.add(walk(drafts, targets, first, min(last, first + window - 1) if window else last))
            total.add(row)
            per_row.append(row)
        return total, per_row


def validation_rows(merged: Path, stores: dict, limit: int | None = None, skip: set[tuple[str, int]] = frozenset(),
                    split: str | None = None) -> list[tuple[torch.Tensor, list[int], torch.Tensor]]:
    """The held-out rows of the merged table with their stored hidden states (``stores``: each dataset's
    :class:`~draftsmith.hidden_states.store.HiddenStateStore`), in the table's order, at most ``limit``;
    ``skip``: ``(dataset, row)`` whose extraction failed."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from draftsmith.data.merge import VALIDATION

    table = pq.read_table(merged, columns=["dataset", "source_row", "input_ids", "loss_mask", "split"])
    table = table.filter(pc.equal(table.column("split"), split or VALIDATION))
    rows = []
    kept = [e for e in table.to_pylist() if (e["dataset"], e["source_row"]) not in skip]
    for entry in kept[:limit]:
        stored = stores[entry["dataset"]].read(entry["source_row"])
        ids = torch.tensor(entry["input_ids"], dtype=torch.long)
        if not torch.equal(stored["token_ids"].long(), ids):
            raise ValueError(f"{merged}: validation row {entry['dataset']}/{entry['source_row']} does not match its "
                             "stored hidden states (extract them again: ./run.sh redo hidden_states DATASET)")
        rows.append((ids, entry["loss_mask"], stored["hidden_states"]))
    return rows


def stores_of(manifests: list[Path]) -> dict:
    """Each dataset's hidden-state store from its manifest."""
    from draftsmith.hidden_states.store import open_store

    out = {}
    for path in map(Path, manifests):
        manifest = json.loads(path.read_text())
        out[path.parent.name] = open_store(path.parent, manifest["fingerprint"], manifest["layout"])
    return out


# At most this many validation rows are replayed per epoch: the figure settles long before (one row moves it by
# 1/256 of its drafts at most), and a 1T target's whole-vocabulary head costs a matrix product per token.
ROWS = 256


def epoch_figures(replayer: Replay, rows: list, k: int, looping: list[bool]) -> dict:
    """One checkpoint's predicted served figures over the validation ``rows``, with and without the rows whose
    answers loop (``looping``: :func:`draftsmith.data.repetition.repeated_share` at or above
    :data:`~draftsmith.data.repetition.LOOPING`): a loop is the easiest thing to predict, and traffic does not loop."""
    total, per_row = replayer.predict(rows, k)
    plain = Walk(k)
    for row, loops in zip(per_row, looping, strict=True):
        if not loops:
            plain.add(row)
    return {**total.as_dict(), "k": k, "rows": len(rows),
            "without_looping_rows": {**plain.as_dict(), "rows": looping.count(False)}}


def predict_epochs(validation: list[dict], checkpoints: dict[int, Path], rows: list, target_dir: Path, k: int,
                   device: str) -> None:
    """Each validated epoch's predicted served figures (:func:`epoch_figures`), added to its entry as
    ``predicted_served``: what :func:`draftsmith.training.train.choose_checkpoint` chooses by."""
    from draftsmith.data.repetition import LOOPING, answer_tokens, repeated_share

    looping = [repeated_share(answer_tokens(ids.tolist(), mask)) >= LOOPING for ids, mask, _ in rows]
    for entry in validation:
        if entry.get("epoch") in checkpoints and rows:
            entry["predicted_served"] = epoch_figures(Replay(checkpoints[entry["epoch"]], target_dir, device), rows,
                                                      k, looping)
