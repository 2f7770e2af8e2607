"""What a server would accept from a drafter, predicted without a server: the drafter replayed on the
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

A block family (DFlash, DSpark) drafts its whole block in one forward from the last committed token (the
anchor, the block's first slot) and the target's hidden states before it: its drafts come from speculators'
own anchored-block forward with every position a walk drafts from an anchor (:class:`BlockDrafter`).

Exact where the answers are the target's own greedy ones (its token at a position is then the answer's
next token, so teacher forcing feeds the chain what a server would). Each walk counts how far the two agree
(:func:`exactness`: the share of its answer tokens that are the target's argmax), and every figure carries that
label.

Sampled answers are walked as a server sampling the same way walks them: vLLM drafts greedily and verifies with
one-hot draft probabilities, so it accepts a draft with the target's sampled probability of it, goes on with
the draft it accepted, and after a rejection with a token drawn from the target's distribution without the
rejected draft. The stored answer, drawn from that distribution, is one such path: the walk follows its tokens,
and counts at each step the probability the server accepts each draft there (:meth:`TargetHead.chances`, the
expected acceptance where every earlier draft was the answer's token). An estimate still: one sample of the
paths, for serving at the answers' sampling, not at another temperature.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from draftsmith.core import compute, platform

log = logging.getLogger(__name__)

# The argmax over a 1T target's vocabulary (160K) is taken this many positions at a time: 512 x 163,840 logits.
HEAD_CHUNK = 512
# What an epoch's replay reads: at most this many validation rows and answer positions. The figure settles long
# before (2^17 positions are 2^17 draft steps at most), and each epoch reads the rows' hidden states again
# (7.5 GB at Kimi-K2's width for 2^17 positions) rather than holding them (a row of 8,192 tokens is 470 MB).
ROWS = 256
TOKENS = 2**17
# ... but never fewer rows whose answers do not loop than the validation minimum (merge.MIN_VALIDATION_PROMPTS,
# not imported: merge imports pyarrow), whatever TOKENS: at 8,192-token rows 2^17 positions are 16 rows.
MIN_ROWS = 32
# A block family's anchors per forward: its logits are anchors x block x draft vocabulary (256 x 16, speculators'
# default block, x 163,840 in bf16: 1.3 GB where the drafter keeps the target's whole vocabulary; DSpark's
# Markov bias as much again).
ANCHOR_CHUNK = 256


@dataclass
class Walk:
    """A walk's counts: draft steps, drafts accepted at each position, the tokens the walk covered, and of
    those the ones that are the target's own argmax (``agreed`` of ``compared``)."""

    k: int
    steps: int = 0
    accepted: list[float] = field(default_factory=list)
    tokens: int = 0
    agreed: int = 0
    compared: int = 0
    sampled: int = 0  # answer tokens of sampled answers walked (not compared: they are no argmax)
    samplings: list[dict] = field(default_factory=list)
    expected: bool = True  # every sampled step counted its expected acceptance (else whether it matched)

    def __post_init__(self):
        self.accepted = self.accepted or [0] * self.k

    def add(self, other: Walk) -> None:
        self.steps += other.steps
        self.tokens += other.tokens
        self.agreed += other.agreed
        self.compared += other.compared
        self.sampled += other.sampled
        self.samplings += [s for s in other.samplings if s not in self.samplings]
        self.expected = self.expected and other.expected
        self.accepted = [a + b for a, b in zip(self.accepted, other.accepted, strict=True)]

    def as_dict(self) -> dict:
        """The figures the server's counters give: acceptance rate by position, and tokens per target step
        (EAGLE-3 drafts at every step, so τ per draft is the same figure)."""
        steps = self.steps
        return {"drafts": steps, "accepted_tokens": sum(self.accepted), "tokens": self.tokens,
                "accepted_per_position": list(self.accepted),
                "acceptance_rate_per_position": [a / steps for a in self.accepted] if steps else [],
                "tokens_per_step": 1.0 + sum(self.accepted) / steps if steps else None,
                "exactness": exactness(self.agreed, self.compared, self.sampled, self.samplings, self.expected)}


def exactness(agreed: int, compared: int, sampled: int = 0, samplings: list[dict] = (), expected: bool = True) -> dict:
    """A predicted figure's label: ``exact`` where every answer token walked is a greedy answer's and the
    target's argmax (a server would write the same tokens, so teacher forcing feeds the drafter what it would),
    else ``estimate``, with the share of greedy answers' tokens that agree (``agreement``: near-ties, another
    engine's answers) and, where answers were sampled, their tokens walked and how they were sampled
    (``sampled``: one path of a server sampling alike, counted by expected acceptance where ``expected``)."""
    label = {"basis": "exact" if compared and agreed == compared and not sampled else "estimate",
             "agreement": round(agreed / compared, 4) if compared else None, "positions": compared}
    if sampled:
        label["sampled"] = {"positions": sampled, "sampling": list(samplings), "expected": expected}
    return label


def agreement(input_ids: list[int], targets: list[int], first: int, last: int) -> tuple[int, int]:
    """How many of the answer tokens at ``first`` to ``last`` are the target's argmax after the position before
    them (the first one's from the prompt's prefill), and of how many."""
    compared = range(max(first, 1), last + 1)
    return sum(input_ids[p] == targets[p - 1] for p in compared), len(compared)


def walk(drafts: list[list[int]], targets: list[int], first: int, last: int, end: int | None = None,
         chances: list[list[float]] | None = None) -> Walk:
    """The draft-and-verify walk over one answer turn generated from position ``first`` to ``last`` of its
    row. ``drafts[s][i]``: the drafter's ``s``-th draft from the token at ``i`` (its chain's prediction of the
    token at ``i + s + 1``); ``targets[j]``: the token after position ``j`` on the walk's path (the target's
    argmax for a greedy server; a sampled answer's own token). The first answer token comes from the prompt's
    prefill; each step drafts from the last committed token, accepts the leading drafts equal to the path's
    tokens, and commits those and the path's next token. ``chances[s][i]``: the probability a sampling server
    accepts draft ``s`` from ``i`` once the drafts before it were (sampled answers): counted instead of the
    match, the step's expected acceptance. ``end``: the answer's real last position when ``last`` cuts it (a
    window of it served): vLLM counts a draft past ``max_tokens`` that the target accepts before it truncates
    the answer, so a draft is judged up to ``end``."""
    k, end = len(drafts), last if end is None else end
    out = Walk(k, tokens=last - first + 1)
    at = first  # the last committed token
    while at < last:
        out.steps += 1
        accepted = 0
        while accepted < k and at + accepted + 1 <= end:
            matched = drafts[accepted][at] == targets[at + accepted]
            out.accepted[accepted] += matched if chances is None else chances[accepted][at]
            if not matched:
                break
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


def compute_dtype() -> torch.dtype:
    """What the replay computes in: the machine's compute dtype (compute.choose), not the checkpoint's. A bf16
    checkpoint on a CPU without native bf16 (AVX2 only) would take 7x as long through the target's head."""
    return getattr(torch, compute.choose("auto").dtype)


class TargetHead:
    """The target's final norm and whole-vocabulary LM head: its token after each position of a row, from the
    stored final hidden states (taken before the norm)."""

    def __init__(self, target_dir: Path, device: str = "cpu"):
        from speculators.utils.loading import load_model_layers
        from transformers import AutoConfig

        weights = load_model_layers(["lm_head.weight", "embed_tokens.weight", "model.norm.weight"], str(target_dir))
        self.head = weights.get("lm_head.weight", weights["embed_tokens.weight"]).to(device, compute_dtype())
        self.norm = weights["model.norm.weight"].to(device)
        config = AutoConfig.from_pretrained(target_dir)
        self.eps = getattr(getattr(config, "text_config", config), "rms_norm_eps", 1e-6)
        self.device = device

    def logits(self, final: torch.Tensor) -> Iterator[tuple[int, torch.Tensor]]:
        """The target's logits after each position, ``HEAD_CHUNK`` positions at a time: ``(first, logits)``."""
        for start in range(0, final.shape[0], HEAD_CHUNK):
            part = final[start:start + HEAD_CHUNK].to(self.device).float()
            normed = part * torch.rsqrt(part.pow(2).mean(-1, keepdim=True) + self.eps) * self.norm.float()
            yield start, normed.to(self.head.dtype) @ self.head.T

    @torch.no_grad()
    def tokens(self, final: torch.Tensor) -> list[int]:
        return [token for _, logits in self.logits(final) for token in logits.argmax(-1).tolist()]

    @torch.no_grad()
    def chances(self, final: torch.Tensor, drafts: list[list[int]], sampling: dict) -> list[list[float]]:
        """``chances[s][p]``: the probability a server sampling at ``sampling`` accepts the draft ``drafts[s][p]``
        (the token after position ``p + s``) once the drafts before it were: the target's probability of it
        after temperature, top-k and top-p, as vLLM's rejection sampler computes it (drafts greedy, their
        probabilities one-hot); 0 where nothing was drafted (-1)."""
        table = torch.tensor(drafts, dtype=torch.long)
        k, seq = table.shape
        out = torch.zeros(k, seq)
        for start, logits in self.logits(final):
            probabilities = served_probabilities(logits, sampling)
            after = torch.arange(start, start + logits.shape[0])  # the positions these distributions follow
            for s in range(k):
                at = after[after >= s] - s  # the drafts of slot s whose token follows these positions
                rows, tokens = (at + s - start).to(self.device), table[s, at].to(self.device)
                drafted = tokens >= 0
                values = torch.zeros(len(at), device=self.device)
                values[drafted] = probabilities[rows[drafted], tokens[drafted]]
                out[s, at] = values.cpu()
        return out.tolist()


# What vLLM's rejection sampler applies to the target's logits (V1's apply_sampling_constraints). min-p it applies
# or not by model runner (V2, a GPU's default, does; V1 does not), penalties from each request's history: a
# sampling with either is walked by its matches alone (still one path of that server, unbiased).
VERIFIED_SAMPLING = {"temperature", "top_k", "top_p"}


def expected_acceptance_computable(sampling: dict | None) -> bool:
    """Whether the replay computes the server's acceptance probabilities for answers sampled this way."""
    return bool(sampling) and set(sampling) <= VERIFIED_SAMPLING


def served_probabilities(logits: torch.Tensor, sampling: dict) -> torch.Tensor:
    """The target's distribution a sampling server verifies drafts against: logits over the temperature, then
    top-k, then top-p (vLLM's order and rule: the smallest tokens whose mass is at most ``1 - top_p`` masked,
    the most likely kept)."""
    logits = logits.float() / sampling["temperature"]
    top_k, top_p = sampling.get("top_k"), sampling.get("top_p")
    if top_k is not None and 0 < top_k < logits.shape[-1]:
        logits = logits.masked_fill(logits < logits.topk(top_k, dim=-1).values[:, -1:], float("-inf"))
    if top_p is not None and top_p < 1:
        ordered, order = logits.sort(dim=-1)
        cut = ordered.softmax(-1).cumsum(-1) <= 1 - top_p
        cut[:, -1] = False
        logits = logits.scatter(-1, order, ordered.masked_fill(cut, float("-inf")))
    return logits.softmax(-1)


GREEDY = {"temperature": 0.0}  # a continuation's sampling where it must be the target's own answer


def sampled(sampling: dict | None) -> bool:
    """Whether answers generated at ``sampling`` were sampled (a temperature above 0), not greedy."""
    return bool(sampling) and sampling.get("temperature", 0) > 0


def load_drafter(checkpoint: Path, target_dir: Path, device: str = "cpu") -> Drafter | BlockDrafter:
    """A checkpoint's drafter for the replay, by the family its config names."""
    from draftsmith.training.families import DEFAULT_FAMILY

    family = json.loads((checkpoint / "config.json").read_text()).get("speculators_model_type", DEFAULT_FAMILY)
    if family == DEFAULT_FAMILY:
        return Drafter(checkpoint, target_dir, device)
    return BlockDrafter(checkpoint, family, target_dir, device)


class Drafter:
    """An EAGLE-3 checkpoint as speculators builds it, uncompiled (this forward runs once), on ``device``."""

    def __init__(self, checkpoint: Path, target_dir: Path, device: str = "cpu"):
        from speculators.models.eagle3.core import Eagle3DraftModel

        config = Eagle3DraftModel.config_class.from_pretrained(checkpoint)
        config.transformer_layer_config._attn_implementation = platform.draft_attention(device, compiled=False)
        config.speculators_config.verifier.name_or_path = str(target_dir)  # the prepared target, wherever it is
        model = Eagle3DraftModel.from_pretrained(checkpoint, config=config)
        model.load_verifier_weights()  # the target's embeddings, which the checkpoint does not carry
        self.model = model.to(device, compute_dtype()).eval()
        self.device = device
        # draft token d is target token d + d2t[d]; speculators keeps no map when both vocabularies are one
        self.d2t = model.d2t.to(device) if model.d2t is not None else None

    @torch.no_grad()
    def chains(self, input_ids: torch.Tensor, stored: torch.Tensor, k: int, walked: list[int]) -> list[list[int]]:
        """For one row, the drafts from every position (``drafts[s][p]``, target vocabulary) of its ``input_ids``
        ``[seq]`` with its stored hidden states ``stored`` ``[seq, aux layers + final, hidden]`` (one forward
        drafts from every position, walked or not). Aligned as speculators trains (``shift_batch``): the
        chain from the token at ``p`` reads the aux states at ``p - 1`` and that token."""
        ids = input_ids[1:].to(self.device)
        states = stored[:-1, :-1].flatten(1).to(self.device, self.model.fc.weight.dtype)
        with _uncompiled():
            out = self.model(hidden_states=states[None], input_ids=ids[None],
                             document_ids=torch.zeros(1, ids.shape[0], dtype=torch.long, device=self.device),
                             ttt_steps=k)
        return [[0, *(step[0] + (self.d2t[step[0]] if self.d2t is not None else 0)).tolist()] for step in out]


class BlockDrafter:
    """A DFlash or DSpark checkpoint as speculators builds it, on ``device``: a block of drafts from each anchor,
    as a server drafts it from the last committed token (the anchor) and the target's hidden states before it.
    DSpark's Markov head biases each slot by the token before it (teacher-forced, as the chain is); its
    confidence head, which an engine may use to cut a block short, is not applied."""

    def __init__(self, checkpoint: Path, family: str, target_dir: Path, device: str = "cpu"):
        if family == "dspark":
            from speculators.models.dspark.core import DSparkDraftModel as model_class
        else:
            from speculators.models.dflash.core import DFlashDraftModel as model_class
        model_config = model_class.config_class.from_pretrained(checkpoint)
        model_config.transformer_layer_config._attn_implementation = platform.draft_attention(device, compiled=False)
        model_config.speculators_config.verifier.name_or_path = str(target_dir)
        model = model_class.from_pretrained(checkpoint, config=model_config)
        model.load_verifier_weights()
        # _backbone_forward also scores the verifier's logits for training's loss; the replay reads none of them
        model.verifier_lm_head = torch.nn.Identity()
        self.model = model.to(device, compute_dtype()).eval()
        self.device = device
        self.block = model.block_size
        # slot s of a block predicts the token s (sampling from the anchor: s + 1) after its anchor; read from
        # the model's config, whose defaults its forward reads too (families.num_speculative_tokens for vLLM)
        self.first_slot = 0 if model.config.sample_from_anchor else 1
        self.per_step = self.block - self.first_slot
        self.d2t = model.d2t.to(device) if model.d2t is not None else None

    @torch.no_grad()
    def chains(self, input_ids: torch.Tensor, stored: torch.Tensor, k: int, walked: list[int]) -> list[list[int]]:
        """For one row, the block drafted from each position a walk drafts from (``walked``; ``drafts[s][p]``,
        target vocabulary; -1 elsewhere), ``ANCHOR_CHUNK`` anchors per forward. speculators leaves the last ``block``
        positions out of its anchors: the row is padded by a block, which no anchor sees (they see the
        positions before them)."""
        seq, pad = input_ids.shape[0], self.block
        dtype = self.model.fc.weight.dtype
        ids = torch.cat([input_ids, input_ids.new_full((pad,), self.model.mask_token_id)]).to(self.device)[None]
        padded = torch.cat([stored, stored.new_zeros((pad, *stored.shape[1:]))]).to(self.device, dtype)
        aux, final = padded[:, :-1].flatten(1)[None], padded[:, -1][None]
        documents = torch.zeros(1, seq + pad, dtype=torch.long, device=self.device)
        anchors = [p for p, drafts_here in enumerate(walked) if drafts_here]
        drafts = [[-1] * seq for _ in range(k)]
        for start in range(0, len(anchors), ANCHOR_CHUNK):
            chunk = anchors[start:start + ANCHOR_CHUNK]
            mask = torch.zeros(1, seq + pad, dtype=torch.long, device=self.device)
            mask[0, chunk] = 1
            with _uncompiled():
                slots = self._block_logits(aux, ids, mask, final, documents, len(chunk)).argmax(-1)
            slots = slots + self.d2t[slots] if self.d2t is not None else slots
            for s in range(k):
                for anchor, token in zip(chunk, slots[:, self.first_slot + s].tolist(), strict=True):
                    drafts[s][anchor] = token
        return drafts

    def _block_logits(self, aux, ids, mask, final, documents, anchors: int) -> torch.Tensor:
        """The draft logits ``[anchors, block, draft vocabulary]`` from the anchors ``mask`` marks (speculators
        takes every one it marks, in order, when asked for exactly that many), with DSpark's Markov bias."""
        hidden, logits, _, _, indices = self.model._backbone_forward(
            aux, ids, mask, final, documents, max_anchors=anchors)
        logits = logits.view(anchors, self.block, -1)
        markov = getattr(self.model, "markov_head", None)
        if markov is not None:
            block_tokens = ids[0, indices].view(anchors, self.block)
            previous = block_tokens if self.model.config.sample_from_anchor else \
                torch.cat([block_tokens[:, :1], block_tokens[:, :-1]], dim=1)
            logits = logits + markov.block_bias(prev_token_ids=previous,
                                                hidden_states=hidden.view(anchors, self.block, -1))
        return logits


@contextlib.contextmanager
def _uncompiled() -> Iterator[None]:
    """speculators compiles its forward where CUDA is (``conditional_torch_compile``): a one-off replay would pay
    the compilation, and fail where the trainer's probe found it fails."""
    import torch._dynamo

    with torch._dynamo.config.patch(disable=True):
        yield


@dataclass
class Row:
    """A held-out row: its tokens, its mask, and the target's token after each position (computed once)."""

    key: tuple[str, int]
    input_ids: torch.Tensor
    loss_mask: list[int]
    targets: list[int]
    looping: bool = False
    sampling: dict | None = None  # how its answers were sampled, where they were (:func:`sampled`)


def read_rows(merged: Path, stores: dict, head: TargetHead, skip: set[tuple[str, int]] = frozenset(),
              limit: int = ROWS, tokens: int = TOKENS, minimum: int = MIN_ROWS,
              samplings: dict[str, dict | None] | None = None) -> list[Row]:
    """The held-out rows of the merged table, in its order, with the target's tokens computed from their stored
    hidden states (``stores``: each dataset's :class:`~draftsmith.hidden_states.store.HiddenStateStore`):
    at most ``limit`` rows and ``tokens`` positions, prompts included, but read on past ``tokens`` until
    ``minimum`` of them do not loop (long rows: the checkpoint is chosen on those); ``skip``: ``(dataset,
    row)`` whose extraction failed; ``samplings``: each dataset's answers' sampling
    (:func:`draftsmith.generation.generate.answer_sampling`)."""
    from draftsmith.data.repetition import is_looping

    out, held, plain = [], 0, 0
    for entry in held_out(merged, skip, limit):
        if len(out) == limit or (held >= tokens and plain >= minimum):
            break
        stored = read_states(stores, entry)
        loops = is_looping(entry["input_ids"], entry["loss_mask"])
        sampling = (samplings or {}).get(entry["dataset"])
        out.append(Row((entry["dataset"], entry["source_row"]), torch.tensor(entry["input_ids"], dtype=torch.long),
                       entry["loss_mask"], head.tokens(stored[:, -1]), loops, sampling if sampled(sampling) else None))
        held += len(entry["input_ids"])
        plain += not loops
    return out


def held_out(merged: Path, skip: set[tuple[str, int]] = frozenset(), limit: int = ROWS) -> list[dict]:
    """The merged table's first ``limit`` validation rows, in its order, but those in ``skip``: read a batch at a
    time and no further than they reach (a user's table holds billions of tokens)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from draftsmith.data.merge import VALIDATION

    table = pq.ParquetFile(merged)
    out: list[dict] = []
    for batch in table.iter_batches(batch_size=4096, row_groups=validation_groups(table),
                                    columns=["dataset", "source_row", "input_ids", "loss_mask", "split"]):
        held = batch.filter(pc.equal(batch.column("split"), VALIDATION)).to_pylist()
        out += [e for e in held if (e["dataset"], e["source_row"]) not in skip]
        if len(out) >= limit:
            break
    return out[:limit]


def validation_groups(table) -> list[int]:
    """The row groups of the merged table (a ``pyarrow.parquet.ParquetFile``) that may hold validation rows:
    merge writes them after every training row, so the groups before are skipped by their statistics."""
    from draftsmith.data.merge import TRAIN

    column = table.schema_arrow.get_field_index("split")
    groups = []
    for i in range(table.metadata.num_row_groups):
        stats = table.metadata.row_group(i).column(column).statistics
        if not (stats is not None and stats.has_min_max and stats.min == stats.max == TRAIN):
            groups.append(i)
    return groups


def read_states(stores: dict, entry: dict) -> torch.Tensor:
    """A row's stored hidden states ``[seq, layers, hidden]``, checked against its tokens."""
    stored = stores[entry["dataset"]].read(entry["source_row"])
    if stored["token_ids"].tolist() != entry["input_ids"]:
        raise ValueError(f"validation row {entry['dataset']}/{entry['source_row']} does not match its stored hidden "
                         "states (extract them again: ./run.sh redo hidden_states DATASET)")
    return stored["hidden_states"]


def predict(drafter: Drafter | BlockDrafter, rows: list[Row], stores: dict, ks: list[int],
            window: int | None = None, first_turn_only: bool = False,
            head: TargetHead | None = None) -> dict[int, tuple[Walk, list[Walk]]]:
    """The walks over ``rows`` at each draft length of ``ks``, in total and per row (their hidden states read
    again, one row at a time). The drafter drafts once, at the longest; the walk at each ``k`` is its own,
    over the first ``k`` drafts of each step (as a server drafting ``k`` steps from where the last ended: a
    shorter walk's steps start elsewhere, so its figures are not the longer walk's counts cut short).
    ``window``: at most that many tokens of each turn (what the export gate serves of it), and
    ``first_turn_only``: the first turn of each row (what the gate serves). A sampled answer is walked along its
    own tokens, each step counted by its expected acceptance where ``head`` (the target's) computes it."""
    out = {k: (Walk(k), []) for k in ks}
    for row in rows:
        stored = read_states(stores, {"dataset": row.key[0], "source_row": row.key[1],
                                      "input_ids": row.input_ids.tolist()})
        spans = [(first, min(last, first + window - 1) if window else last, last)
                 for first, last in (turns(row.loss_mask)[:1] if first_turn_only else turns(row.loss_mask))]
        from_here = [0] * len(row.loss_mask)  # where the walks may draft from
        for first, served, _ in spans:
            from_here[first:served] = [1] * (served - first)
        drafts = drafter.chains(row.input_ids, stored, max(ks), from_here)
        tokens = row.input_ids.tolist()
        agreed = [agreement(tokens, row.targets, first, served) for first, served, _ in spans]
        path, chances, label = row.targets, None, {"agreed": sum(a for a, _ in agreed),
                                                   "compared": sum(c for _, c in agreed)}
        if row.sampling:
            path = [*tokens[1:], -1]
            expected = head is not None and expected_acceptance_computable(row.sampling)
            # the last step drafts from before the last served token, its drafts judged past it (up to ``end``)
            upto = max((served for _, served, _ in spans), default=0) + max(ks)
            chances = head.chances(stored[:upto, -1], [d[:upto] for d in drafts], row.sampling) if expected else None
            label = {"sampled": label["compared"], "samplings": [row.sampling], "expected": expected}
        for k, (total, per_row) in out.items():
            walked = Walk(k, **label)
            for first, served, last in spans:
                walked.add(walk(drafts[:k], path, first, served, last, None if chances is None else chances[:k]))
            total.add(walked)
            per_row.append(walked)
    return out


# What each served draft length keeps of its walk (the longest's is the entry itself).
BY_K = ("acceptance_rate_per_position", "tokens_per_step", "drafts", "without_looping_rows")


def epoch_figures(drafter: Drafter | BlockDrafter, rows: list[Row], stores: dict, ks: list[int],
                  head: TargetHead | None = None) -> dict:
    """One checkpoint's predicted served figures over the validation ``rows``, with and without the rows whose
    answers loop (:func:`~draftsmith.data.repetition.is_looping`: a loop is the easiest thing to predict, and
    traffic does not loop): at the longest of the served draft lengths ``ks`` (what the pick serves before
    the grid has run, and what the checkpoint is chosen by), and each length's own under ``by_k``."""
    by_k = {}
    for k, (total, per_row) in predict(drafter, rows, stores, ks, head=head).items():
        plain = Walk(k)
        for walked, row in zip(per_row, rows, strict=True):
            if not row.looping:
                plain.add(walked)
        by_k[k] = {**total.as_dict(), "k": k, "rows": len(rows),
                   "without_looping_rows": {**plain.as_dict(), "rows": sum(not r.looping for r in rows)}}
    chosen = max(ks)
    return {**by_k[chosen], "by_k": {str(k): {key: figures[key] for key in BY_K} for k, figures in by_k.items()}}


def predict_epochs(validation: list[dict], checkpoints: dict[int, Path], merged: Path, stores: dict,
                   skip: set[tuple[str, int]], target_dir: Path, ks: list[int], device: str,
                   samplings: dict[str, dict | None] | None = None) -> None:
    """Each validated epoch's predicted served figures (:func:`epoch_figures`), added to its entry as
    ``predicted_served``: what :func:`draftsmith.training.train.choose_checkpoint` chooses by. ``ks``: the draft
    lengths EAGLE-3 is served at (``evaluation.num_speculative_tokens``; a block family drafts its block);
    ``samplings``: each dataset's answers' sampling (:func:`read_rows`). A
    replay that fails (memory, an unreadable row) or has no rows leaves the epochs without it, saying why
    (``predicted_served_failed``, ``predicted_served_skipped``): the simulated τ chooses then."""
    try:
        rows, head = rows_and_head(merged, stores, skip, target_dir, device, samplings)
        if not rows:
            skipped(validation, NO_ROWS)
            return
        for entry in validation:
            if entry.get("epoch") in checkpoints:
                drafter = load_drafter(checkpoints[entry["epoch"]], target_dir, device)
                entry["predicted_served"] = epoch_figures(
                    drafter, rows, stores, [drafter.per_step] if isinstance(drafter, BlockDrafter) else ks, head)
                del drafter
    except Exception as err:  # memory, a row, another speculators' API: the trained epochs stand
        log.warning("the predicted served acceptance could not be computed (%s: %s); the simulated τ chooses the "
                    "checkpoint", type(err).__name__, err, exc_info=True)
        for entry in validation:
            entry.pop("predicted_served", None)
            entry["predicted_served_failed"] = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}"


def rows_and_head(merged: Path, stores: dict, skip: set[tuple[str, int]], target_dir: Path, device: str,
                  samplings: dict[str, dict | None] | None, **limits) -> tuple[list[Row], TargetHead | None]:
    """The replay's rows (:func:`read_rows`), and the target's head where a sampled answer needs it to count its
    expected acceptance (else freed: a 1T target's head is 2.3 GB)."""
    head = TargetHead(target_dir, device)
    rows = read_rows(merged, stores, head, skip, samplings=samplings, **limits)
    unknown = sorted({row.key[0] for row in rows} - set(samplings or {}))
    if samplings is not None and unknown:  # a dataset renamed since its rows were merged
        log.warning("the validation rows of %s name no dataset of the config: their answers' sampling is unknown, "
                    "and they are walked as greedy ones", ", ".join(unknown))
    return rows, head if any(expected_acceptance_computable(row.sampling) for row in rows) else None


ONLINE = "skipped: online hidden states, none stored to replay on"
NO_ROWS = "skipped: no validation rows with stored hidden states to replay"


def skipped(validation: list[dict], reason: str) -> None:
    """Each epoch's entry saying why it has no predicted served figures (``predicted_served_skipped``)."""
    for entry in validation:
        entry["predicted_served_skipped"] = reason


def at_gate(checkpoint: Path, merged: Path, stores: dict, skip: set[tuple[str, int]], target_dir: Path, rows: int,
            k: int, window: int, device: str,
            samplings: dict[str, dict | None] | None = None) -> tuple[dict | None, str | None]:
    """What the export gate's server should accept: the exported checkpoint replayed on the gate's own rows
    (the first ``rows`` validation rows but ``skip``), first turns and ``window``; else None and why (the
    replay failed, or had no rows). The gate serves each row as its answers were generated (``samplings``):
    greedy ones continued greedily (exact where the stored answers are the target's argmax), sampled ones
    sampled alike (an estimate: one path each, served and replayed). ``per_row``: each row's drafts and
    accepted drafts by position, in the rows' order."""
    try:
        held, head = rows_and_head(merged, stores, skip, target_dir, device, samplings, limit=rows, tokens=2**62)
        if not held:
            return None, NO_ROWS
        walked, per_row = predict(load_drafter(checkpoint, target_dir, device), held, stores, [k], window=window,
                                  first_turn_only=True, head=head)[k]
    except Exception as err:  # as in predict_epochs: the gate judges without it
        log.warning("the gate's predicted acceptance could not be computed (%s: %s); the gate judges the first "
                    "position by validation accuracy", type(err).__name__, err, exc_info=True)
        return None, f"the replay failed ({type(err).__name__}: {(str(err).splitlines() or [''])[0]})"
    # each row's counts too: the gate's band takes rows, not drafts, as its unit (export.rows_band)
    return {**walked.as_dict(), "rows": len(held), "window": window,
            "per_row": [{"drafts": w.steps, "accepted": list(w.accepted)} for w in per_row]}, None


def open_stores(manifests: list[Path], verify: str | None = None) -> tuple[dict, set[tuple[str, int]]]:
    """Each dataset's hidden-state store from its manifest (shards verified: ``verify`` ``"checksum"`` reads them
    whole), and the ``(dataset, row)`` whose extraction failed every attempt."""
    from draftsmith.hidden_states.store import open_store

    stores, failed = {}, set()
    for path in map(Path, manifests):
        manifest = json.loads(path.read_text())
        store = open_store(path.parent, manifest["fingerprint"], manifest["layout"])
        if verify is not None and manifest["layout"] == "shards":
            store.verify(full=verify == "checksum")
        stores[path.parent.name] = store
        failed |= {(path.parent.name, row) for row in manifest.get("failed_rows", [])}
    return stores, failed
