"""The served acceptance predicted without a server: the drafter replayed on stored hidden states, walked as a
server drafts and verifies, against the target's whole-vocabulary argmax."""

import numpy as np
import pytest
import torch

from draftsmith.training import replay
from tests.test_export import make_block_drafter, make_drafter


@pytest.fixture(scope="module")
def drafter(target_dir, tmp_path_factory):
    return make_drafter(target_dir, tmp_path_factory.mktemp("drafter") / "ckpt")


def test_the_walk_counts_what_a_server_counts():
    """A server drafts from the last committed token, accepts the leading drafts that are the target's tokens,
    commits those and the target's own next one, and drafts again from there: a draft step counts only after
    every earlier one of its step was accepted, and a position inside an accepted run is never a draft start."""
    targets = list(range(100, 120))  # the target's token after each position
    # a perfect drafter (its s-th draft from i is the target's token after i + s) ...
    drafts = [[targets[i + s] if i + s < len(targets) else -1 for i in range(20)] for s in range(3)]
    drafts[1][6] = -1  # ... whose second draft from position 6 is wrong
    out = replay.walk(drafts, targets, first=2, last=12)
    # from 2: 3 accepted -> 6; from 6: first accepted, second wrong -> 8; from 8: 3 -> 12 (the last)
    assert out.steps == 3 and out.accepted == [3, 2, 2] and out.tokens == 11
    figures = out.as_dict()
    assert figures["acceptance_rate_per_position"] == [1.0, 2 / 3, 2 / 3]
    assert figures["tokens_per_step"] == pytest.approx(1 + 7 / 3)
    # a draft past the last token served (the gate's window) is not accepted
    assert replay.walk(drafts, targets, first=2, last=4).accepted == [1, 1, 0]
    nothing = replay.walk([[-1] * 20] * 3, targets, first=2, last=12)
    assert nothing.steps == 10 and nothing.accepted == [0, 0, 0]


def test_answer_turns_are_the_supervised_runs_of_a_row():
    assert replay.turns([0, 0, 1, 1, 1, 0, 0, 1, 1]) == [(2, 4), (7, 8)]
    assert replay.turns([0, 0]) == []


def test_a_drafter_replayed_drafts_what_a_server_drafts_from_each_committed_prefix(drafter, target_dir, monkeypatch):
    """The replay drafts from every position in one forward; a server drafts from the last committed token with
    the target's states of every position before it. Each first draft must be the server's, computed here a
    prefix at a time (the drafter's own forward on the tokens up to the committed one and the states before
    it), and the walk must accept it where the target's token, built from those server drafts, agrees."""
    from draftsmith.core import compute

    monkeypatch.setattr(compute, "choose", lambda *args, **kwargs: compute.Choice("float32", "exact comparisons"))
    replayed = replay.load_drafter(drafter, target_dir)
    torch.manual_seed(0)
    with torch.no_grad():  # a fresh drafter drafts one token whatever it reads; these weights make it read
        for name, weight in replayed.model.named_parameters():
            if name.startswith(("layers", "fc")):
                weight.normal_(0, 0.2)
    ids = torch.randint(0, 1000, (40,))
    hidden = torch.randn(40, 4, 576, dtype=torch.bfloat16)  # the three aux layers, then the final one
    aux = hidden[:, :-1].flatten(1).float()

    def served(at: int) -> int:  # a server's first draft with the token at `at` the last committed one
        with replay._uncompiled(), torch.no_grad():
            out = replayed.model(hidden_states=aux[None, :at], input_ids=ids[None, 1:at + 1],
                                 document_ids=torch.zeros(1, at, dtype=torch.long), ttt_steps=1)
        token = int(out[0][0, -1])
        return token + int(replayed.d2t[token])

    server = [served(at) for at in range(1, 40)]
    drafts = replayed.chains(ids, hidden, 3, [1] * 40)
    assert len(drafts) == 3 and all(len(d) == 40 for d in drafts) and len(set(server)) > 2
    assert drafts[0][1:] == server
    # the target's token after each position: the server's draft at even positions, another token at odd ones
    targets = [0, *(server[at - 1] + at % 2 for at in range(1, 40))]
    walked = replay.walk(drafts[:1], targets, 5, 30)  # from 5 rejected, then from 6, 8, ..., 28 accepted
    assert (walked.steps, walked.accepted) == (13, [12])


@pytest.mark.parametrize(("family", "k"), [("dflash", 7), ("dspark", 8)])  # block 8: DSpark drafts its anchor's slot
def test_a_block_drafter_drafts_from_what_a_server_has_at_its_anchor(target_dir, tmp_path, family, k, monkeypatch):
    """A block family drafts its block from the last committed token (the anchor) and the target's hidden states
    before it; DSpark's Markov head biases each slot by the token before it (the drafted one, which the answer's
    is wherever the earlier drafts were accepted). The replay drafts from every walked position at once
    (speculators' anchored-block forward, a chunk of anchors at a time): each block must read the states before
    its anchor and none from it on, DFlash's no token after its anchor, and must not depend on which other
    anchors share its forward; its drafts are the draft vocabulary's tokens, in the target's numbering."""
    from draftsmith.core import compute

    # in fp32: in bf16 a forward's shape (which anchors share it) moves a logit's last bits, and a near-tie flips
    monkeypatch.setattr(compute, "choose", lambda *args, **kwargs: compute.Choice("float32", "exact comparisons"))
    drafter = replay.load_drafter(make_block_drafter(target_dir, tmp_path / family, family), target_dir)
    assert drafter.per_step == k
    torch.manual_seed(0)
    with torch.no_grad():  # a fresh drafter drafts one token whatever it reads; these weights make it read
        for name, weight in drafter.model.named_parameters():
            if name.startswith(("layers", "fc")):
                weight.normal_(0, 0.2)
            elif name.startswith("markov_head"):
                weight.normal_(0, 1.0)
    ids = torch.randint(0, 1000, (40,))
    hidden = torch.randn(40, 4, 576, dtype=torch.bfloat16)
    walked = [0] * 10 + [1] * 30  # a prompt of 10, an answer of 30
    drafts = drafter.chains(ids, hidden, k, walked)
    assert len(drafts) == k and all(d[:10] == [-1] * 10 for d in drafts)
    in_draft_vocabulary = set(np.flatnonzero(np.load(tmp_path / "t2d.npy")).tolist())
    assert {d[p] for d in drafts for p in range(10, 40)} <= in_draft_vocabulary
    assert all(len(set(d[10:])) > 2 for d in drafts)  # what each block drafts depends on what it reads

    anchor = 23
    def block(inputs, states):
        return [d[anchor] for d in drafter.chains(inputs, states, k, walked)]

    later, earlier, tokens = hidden.clone(), hidden.clone(), ids.clone()
    later[anchor:] = torch.randn(40 - anchor, 4, 576, dtype=torch.bfloat16)
    earlier[:anchor] = torch.randn(anchor, 4, 576, dtype=torch.bfloat16)
    tokens[anchor + 1] = (ids[anchor + 1] + 1) % 1000
    served = [d[anchor] for d in drafts]
    assert block(ids, later) == served  # the anchor's own state and later ones: not yet computed by a server
    assert block(ids, earlier) != served  # the states before the anchor: read
    if family == "dflash":
        assert block(tokens, hidden) == served  # the block's other slots are mask tokens
    else:  # the token after the anchor biases the slot that drafts the one after it, and no other slot
        changed = block(tokens, hidden)
        assert changed[1] != served[1] and changed[:1] + changed[2:] == served[:1] + served[2:]
    monkeypatch.setattr(replay, "ANCHOR_CHUNK", 3)
    assert drafter.chains(ids, hidden, k, walked) == drafts
    alone = drafter.chains(ids, hidden, k, [int(p in (10, 39)) for p in range(40)])  # the first and last alone
    assert [[d[p] for p in (10, 39)] for d in alone] == [[d[p] for p in (10, 39)] for d in drafts]


@pytest.mark.parametrize(("family", "k"), [("dflash", 7), ("dspark", 8)])
def test_each_block_slot_is_judged_against_the_token_speculators_trains_it_on(target_dir, tmp_path, family, k,
                                                                               monkeypatch):
    """speculators trains a block's slot against the target's token from one final state (DFlash: the one before
    the slot, its anchor's slot untrained; DSpark, sampling from the anchor: the slot's own). The walk judges
    ``drafts[s][anchor]`` against the target's token after ``anchor + s``. Here each final state names its
    position and the drafter's logits are speculators' own training targets: every draft must name the position
    the walk judges it at, so a slot mapping off by one fails."""
    drafter = replay.load_drafter(make_block_drafter(target_dir, tmp_path / family, family), target_dir)
    drafter.d2t = None  # the drafts are then the positions the targets were read from
    seq = 40
    ids = torch.randint(0, 1000, (seq,))
    hidden = torch.randn(seq, 4, 576, dtype=torch.bfloat16)
    hidden[:, -1] = 0
    hidden[torch.arange(seq), -1, torch.arange(seq)] = 1  # the final state at p: one-hot at p

    def training_targets(aux, ids_, mask, final, documents, anchors):
        _, _, targets, _, _ = drafter.model._backbone_forward(aux, ids_, mask, final, documents, max_anchors=anchors)
        return targets.view(anchors, drafter.block, -1).abs()  # the target's norm may flip a sign

    monkeypatch.setattr(drafter, "_block_logits", training_targets)
    drafts = drafter.chains(ids, hidden, k, [0] * 10 + [1] * 30)
    judged = [(s, anchor) for s in range(k) for anchor in range(10, seq) if anchor + s < seq]
    assert [drafts[s][anchor] for s, anchor in judged] == [anchor + s for s, anchor in judged]


def test_the_exported_checkpoint_is_the_one_a_server_would_accept_most_from(tmp_path):
    """The simulated τ that chose the checkpoint rewarded loops and counted tokens no server can accept; where
    every validated epoch has a predicted served figure, it chooses."""
    from draftsmith.training import train as tr

    for epoch in (0, 1):
        (tmp_path / str(epoch)).mkdir()
        (tmp_path / str(epoch) / "model.safetensors").write_bytes(b"")
    validation = [{"epoch": 0, "full_acc_0_epoch": 0.30, "full_acc_1_epoch": 0.20,
                   "predicted_served": {"tokens_per_step": 1.31, "rows": 20}},
                  {"epoch": 1, "full_acc_0_epoch": 0.31, "full_acc_1_epoch": 0.25,
                   "predicted_served": {"tokens_per_step": 1.28, "rows": 20}}]
    path, choice = tr.choose_checkpoint(tmp_path, validation)
    assert path.name == "0" and choice["predicted_served_tau"] == 1.31
    assert "predicted served τ 1.310" in choice["reason"]
    assert tr.choose_checkpoint(tmp_path, [{k: v for k, v in e.items() if k != "predicted_served"}
                                           for e in validation])[0].name == "1"  # simulated τ: 1.56 against 1.50


def test_the_validation_rows_are_read_from_the_groups_that_hold_them(tmp_path):
    """A user's merged table holds billions of tokens: the validation rows, written after every training row,
    are read from the row groups whose statistics say they may hold them, in order, but the rows skipped."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from draftsmith.data import merge

    n_train, n_val = 10, 5
    table = pa.table({"dataset": ["d"] * (n_train + n_val), "source_row": list(range(n_train + n_val)),
                      "input_ids": [[i, i + 1] for i in range(n_train + n_val)],
                      "loss_mask": [[0, 1]] * (n_train + n_val),
                      "split": [merge.TRAIN] * n_train + [merge.VALIDATION] * n_val})
    pq.write_table(table, tmp_path / "merged.parquet", row_group_size=4)
    groups = replay.validation_groups(pq.ParquetFile(tmp_path / "merged.parquet"))
    assert groups == [2, 3]  # rows 8-11 and 12-14; rows 0-7 are training rows only
    rows = replay.held_out(tmp_path / "merged.parquet", skip={("d", 11)}, limit=3)
    assert [r["source_row"] for r in rows] == [10, 12, 13]


def test_a_replay_that_fails_leaves_the_epochs_to_the_simulated_tau_and_the_gate_to_validation(tmp_path, caplog):
    """A replay that cannot run (here: no target weights, no table) never fails the training or export job."""
    validation = [{"epoch": 0, "full_acc_0_epoch": 0.3}]
    replay.predict_epochs(validation, {0: tmp_path}, tmp_path / "merged.parquet", {}, set(), tmp_path, [3], "cpu")
    assert "predicted_served" not in validation[0] and validation[0]["predicted_served_failed"]
    predicted, why_not = replay.at_gate(tmp_path, tmp_path / "merged.parquet", {}, set(), tmp_path, 8, 3, 64, "cpu")
    assert predicted is None and why_not.startswith("the replay failed (")
    assert "could not be computed" in caplog.text


def test_the_replay_computes_in_the_machines_dtype_not_the_checkpoints(drafter, target_dir, monkeypatch):
    """A bf16 checkpoint and target on a CPU without native bf16 (AVX2 only) replay in fp32, 7x faster there."""
    from draftsmith.core import compute

    monkeypatch.setattr(compute, "choose", lambda *args, **kwargs: compute.Choice("float32", "AVX2 only"))
    assert replay.TargetHead(target_dir).head.dtype == torch.float32
    assert replay.load_drafter(drafter, target_dir).model.fc.weight.dtype == torch.float32


class FakeStore:
    """A dataset's stored hidden states: each row's tokens and, as its final state, the target's greedy token after
    each position (what :class:`FakeHead` reads back)."""

    def __init__(self, rows: dict[int, tuple[list[int], list[int]]]):
        self.rows = rows

    def read(self, row: int) -> dict:
        ids, targets = self.rows[row]
        final = torch.tensor(targets, dtype=torch.float32)[:, None, None]
        return {"token_ids": torch.tensor(ids), "hidden_states": torch.cat([torch.zeros_like(final), final], dim=1)}


class FakeHead:
    def tokens(self, final: torch.Tensor) -> list[int]:
        return final[:, 0].long().tolist()


class FakeDrafter:
    """Drafts the target's own tokens (its ``s``-th draft from ``p``: the target's token after ``p + s``) but its
    second draft from every third position; records the chain length it was asked for."""

    def __init__(self):
        self.asked: list[int] = []

    def chains(self, input_ids, stored, k, walked):
        self.asked.append(k)
        targets, seq = stored[:, -1, 0].long().tolist(), len(input_ids)
        return [[targets[p + s] if p + s < seq and not (s == 1 and p % 3 == 0) else -1 for p in range(seq)]
                for s in range(k)]


def greedy_row(seed: int, prompt: int = 4, answer: int = 20) -> tuple[list[int], list[int], list[int]]:
    """A row whose answer is the target's greedy one: ``(ids, loss mask, the target's token after each)``."""
    ids = torch.randint(0, 1000, (prompt + answer,), generator=torch.Generator().manual_seed(seed)).tolist()
    return ids, [0] * prompt + [1] * answer, [*ids[1:], 0]


def fake_rows(rows: list[tuple[list[int], list[int], list[int]]]) -> tuple[list[replay.Row], dict]:
    store = FakeStore({i: (ids, targets) for i, (ids, _, targets) in enumerate(rows)})
    return [replay.Row(("d", i), torch.tensor(ids), mask, targets) for i, (ids, mask, targets) in enumerate(rows)], \
        {"d": store}


def test_each_predicted_figure_is_exact_on_greedy_answers_and_an_estimate_with_its_agreement_on_sampled_ones():
    """The replay teacher-forces and walks the stored answer: a server's only where each stored token is the
    target's argmax. Every walk records that share and labels its figures by it."""
    greedy, stores = fake_rows([greedy_row(0), greedy_row(1)])
    total, _ = replay.predict(FakeDrafter(), greedy, stores, [3])[3]
    assert total.as_dict()["exactness"] == {"basis": "exact", "agreement": 1.0, "positions": 40}
    ids, mask, targets = greedy_row(2)
    ids[10] = (targets[9] + 1) % 1000  # a sampled token: not the target's argmax after position 9
    sampled, stores = fake_rows([greedy_row(0), (ids, mask, targets)])
    total, _ = replay.predict(FakeDrafter(), sampled, stores, [3])[3]
    assert total.as_dict()["exactness"] == {"basis": "estimate", "agreement": round(39 / 40, 4), "positions": 40}
    # the gate's window: only the tokens it serves are compared
    window, _ = replay.predict(FakeDrafter(), sampled, stores, [3], window=6, first_turn_only=True)[3]
    assert window.as_dict()["exactness"]["positions"] == 12 and window.as_dict()["exactness"]["basis"] == "exact"


def test_the_checkpoint_is_walked_at_each_served_draft_length_from_one_drafting():
    """Served at k=1 and k=3 (SpecForge's 7 TTT steps served at [1, 3]): the drafter drafts once, at the longest;
    each k is its own walk over its first k drafts (its steps start elsewhere: not the longest walk's counts
    cut short), and the figures that choose the epoch are the longest's, the k the pick serves."""
    rows, stores = fake_rows([greedy_row(0), greedy_row(1)])
    drafter = FakeDrafter()
    figures = replay.epoch_figures(drafter, rows, stores, [1, 3])
    assert drafter.asked == [3, 3]  # once per row, at the longest
    assert figures["k"] == 3 and len(figures["acceptance_rate_per_position"]) == 3
    assert set(figures["by_k"]) == {"1", "3"}
    one = figures["by_k"]["1"]
    assert one["acceptance_rate_per_position"] == [1.0] and one["tokens_per_step"] == 2.0  # every first draft right
    assert one["drafts"] == 20 != figures["drafts"]  # 19 tokens after each prefill, two a step
    assert figures["by_k"]["3"]["tokens_per_step"] == figures["tokens_per_step"]
    assert figures["without_looping_rows"]["rows"] == 2 and figures["exactness"]["basis"] == "exact"


def merged_table(path, rows: list[tuple[list[int], list[int]]], n_train: int = 0):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from draftsmith.data import merge

    pq.write_table(pa.table({"dataset": ["d"] * (n_train + len(rows)),
                             "source_row": list(range(n_train + len(rows))),
                             "input_ids": [[1, 2]] * n_train + [ids for ids, _ in rows],
                             "loss_mask": [[0, 1]] * n_train + [mask for _, mask in rows],
                             "split": [merge.TRAIN] * n_train + [merge.VALIDATION] * len(rows)}), path)
    return path


def test_the_replay_reads_the_validation_minimum_of_rows_that_do_not_loop_at_a_users_length(tmp_path):
    """2^17 positions, prompts included, are 16 rows of 8,192 tokens: half the validation minimum, before the
    looping rows are set aside. The replay reads on until 32 rows that do not loop."""
    from draftsmith.data.merge import MIN_VALIDATION_PROMPTS

    assert replay.MIN_ROWS == MIN_VALIDATION_PROMPTS
    length, generator = 8192, torch.Generator().manual_seed(0)
    mask = [0] * 512 + [1] * (length - 512)
    loop = [*torch.randint(0, 1000, (512,), generator=generator).tolist(), *([5, 6, 7, 8, 9] * 1536)][:length]
    table = [(loop, mask)] * 8 + [(torch.randint(0, 1000, (length,), generator=generator).tolist(), mask)
                                  for _ in range(40)]
    merged = merged_table(tmp_path / "merged.parquet", table)
    stores = {"d": FakeStore({i: (ids, [0] * length) for i, (ids, _) in enumerate(table)})}
    rows = replay.read_rows(merged, stores, FakeHead())
    assert len(rows) == 40 and sum(not r.looping for r in rows) == 32 and all(r.looping for r in rows[:8])
    short = replay.read_rows(merged, stores, FakeHead(), limit=20)  # the row limit still holds
    assert len(short) == 20


def test_a_replay_with_no_rows_or_online_states_says_why_where_the_figure_would_stand(tmp_path, monkeypatch):
    """A replay that did not run is named with its reason: in the epochs' entries, the chosen checkpoint's
    reason, and the gate's."""
    from draftsmith.training import train as tr

    monkeypatch.setattr(replay, "TargetHead", lambda *args: FakeHead())
    merged = merged_table(tmp_path / "merged.parquet", [], n_train=4)  # no validation row
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "model.safetensors").write_bytes(b"")
    validation = [{"epoch": 0, "full_acc_0_epoch": 0.3}]
    replay.predict_epochs(validation, {0: tmp_path / "0"}, merged, {}, set(), tmp_path, [3], "cpu")
    assert validation[0]["predicted_served_skipped"] == replay.NO_ROWS and "predicted_served" not in validation[0]
    _, choice = tr.choose_checkpoint(tmp_path, validation)
    assert choice["predicted_missing"] == replay.NO_ROWS and replay.NO_ROWS in choice["reason"]
    assert replay.at_gate(tmp_path, merged, {}, set(), tmp_path, 8, 3, 64, "cpu") == (None, replay.NO_ROWS)
    online = [{"epoch": 0, "full_acc_0_epoch": 0.3}]
    replay.skipped(online, replay.ONLINE)
    assert "online hidden states" in tr.choose_checkpoint(tmp_path, online)[1]["reason"]


def test_predict_epochs_replays_each_epoch_at_the_served_draft_lengths(tmp_path, monkeypatch):
    """The training job hands the replay evaluation.num_speculative_tokens, not train.ttt_steps."""
    rows = [greedy_row(i) for i in range(3)]
    merged = merged_table(tmp_path / "merged.parquet", [(ids, mask) for ids, mask, _ in rows])
    stores = {"d": FakeStore({i: (ids, targets) for i, (ids, _, targets) in enumerate(rows)})}
    drafter = FakeDrafter()
    monkeypatch.setattr(replay, "TargetHead", lambda *args: FakeHead())
    monkeypatch.setattr(replay, "load_drafter", lambda *args: drafter)
    validation = [{"epoch": 0}, {"epoch": 1}]
    replay.predict_epochs(validation, {0: tmp_path, 1: tmp_path}, merged, stores, set(), tmp_path, [1, 3], "cpu")
    assert drafter.asked == [3] * 6 and all(set(v["predicted_served"]["by_k"]) == {"1", "3"} for v in validation)
    assert validation[0]["predicted_served"]["rows"] == 3


class FixedDrafter:
    """Drafts the same tokens whatever the row holds: ``drafts[s][p]``."""

    def __init__(self, drafts: list[list[int]]):
        self.drafts = drafts

    def chains(self, input_ids, stored, k, walked):
        return [d[:len(input_ids)] for d in self.drafts[:k]]


class ChancesHead:
    """The target's distribution after each position, ``P[q]``, the same whatever came before it."""

    def __init__(self, distributions: list[list[float]]):
        self.distributions = distributions

    def chances(self, final, drafts, sampling):
        return [[self.distributions[p + s][d] if d >= 0 and p + s < len(self.distributions) else 0.0
                 for p, d in enumerate(row)] for s, row in enumerate(drafts)]


def served_sampling(distributions, drafts, first, last, paths, rng) -> list[float]:
    """Acceptance by position of a server sampling from ``distributions`` with greedy drafts, verified as vLLM's
    rejection sampler does with one-hot draft probabilities: a draft accepted with the target's probability of
    it; after a rejection the step ends (its token drawn from the target's distribution without the draft)."""
    k = len(drafts)
    steps, accepted = 0, [0] * k
    for _ in range(paths):
        at = first
        while at < last:
            steps += 1
            n = 0
            while n < k and at + n + 1 <= last and rng.random() < distributions[at + n][drafts[n][at]]:
                accepted[n] += 1
                n += 1
            at += n + 1
    return [a / steps for a in accepted]


def test_a_sampled_answer_walked_as_a_server_sampling_alike_predicts_what_that_server_accepts():
    """Generated at T=0.6, a stored answer is one path of a server sampling alike: the replay walks its tokens and
    counts each step's expected acceptance, and over many answers meets a simulated vLLM rejection sampler. The
    greedy walk the replay made of sampled answers before (drafts against the target's argmax) reads a server
    that does not sample, far from this one."""
    import random

    rng, vocab, prompt, answer, k = random.Random(0), 5, 2, 24, 3
    seq = prompt + answer
    distributions = []
    for _ in range(seq):
        weights = [rng.random() ** 3 for _ in range(vocab)]
        distributions.append([w / sum(weights) for w in weights])
    ranked = [sorted(range(vocab), key=lambda t: -dist[t]) for dist in distributions]
    # the drafter drafts the target's likeliest token, but its second choice from every third position
    drafts = [[ranked[p + s][1 if p % 3 == 0 else 0] if p + s < seq else -1 for p in range(seq)] for s in range(k)]
    first, last = prompt, seq - 1
    served = served_sampling(distributions, drafts, first, last, 20000, rng)

    rows, store = [], {}
    for i in range(2000):
        ids = [0] * prompt + [0] * answer
        for q in range(prompt - 1, seq - 1):  # the token after position q, drawn from the target's distribution
            ids[q + 1] = rng.choices(range(vocab), weights=distributions[q])[0]
        store[i] = (ids, [r[0] for r in ranked])
        rows.append(replay.Row(("d", i), torch.tensor(ids), [0] * prompt + [1] * answer, [r[0] for r in ranked],
                               sampling={"temperature": 0.6}))
    total, _ = replay.predict(FixedDrafter(drafts), rows, {"d": FakeStore(store)}, [k],
                              head=ChancesHead(distributions))[k]
    predicted = total.as_dict()
    assert predicted["acceptance_rate_per_position"] == pytest.approx(served, abs=0.015)
    assert any(a != int(a) for a in total.accepted)  # each step counted by its expected acceptance, not its match
    assert predicted["exactness"] == {"basis": "estimate", "agreement": None, "positions": 0, "sampled": {
        "positions": 2000 * (answer - 0), "sampling": [{"temperature": 0.6}], "expected": True}}
    greedy = replay.walk(drafts, [r[0] for r in ranked], first, last).as_dict()["acceptance_rate_per_position"]
    assert greedy[0] - served[0] > 0.2


def test_a_sampling_the_replay_cannot_compute_is_walked_by_its_matches_and_says_so():
    """Penalties or min-p: vLLM's rejection sampler applies them otherwise than the replay's head could; the walk
    counts the drafts the sampled answer matches (still one path of that server) and the label says so."""
    rows, stores = fake_rows([greedy_row(0)])
    rows[0].sampling = {"temperature": 0.6, "repetition_penalty": 1.1, "min_p": 0.05}
    total, _ = replay.predict(FakeDrafter(), rows, stores, [3], head=ChancesHead([]))[3]
    label = total.as_dict()["exactness"]
    assert label["sampled"]["expected"] is False and label["basis"] == "estimate"
    assert total.accepted[0] == total.steps  # every first draft is the stored token after it: matched, counted whole
    from draftsmith.training.export import basis_text

    assert "T=0.6, min_p 0.05, repetition_penalty 1.1" in basis_text(label)
    assert "by the drafts they match" in basis_text(label)
    # min-p: vLLM's V2 runner (a GPU's) verifies with it, V1 without: walked by its matches, as penalties are
    assert not replay.expected_acceptance_computable({"temperature": 0.6, "top_k": 20, "min_p": 0.05})


def test_the_heads_acceptance_chances_are_vllms_sampling_of_the_targets_logits(monkeypatch):
    """The chance a sampling server accepts a draft: the target's probability of it after temperature, top-k and
    top-p, computed as vLLM's own sampler does (its apply_top_k_top_p, the reference here)."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    generator = torch.Generator().manual_seed(0)
    head = object.__new__(replay.TargetHead)
    head.head, head.norm = torch.randn(50, 16, generator=generator), torch.ones(16)
    head.eps, head.device = 1e-6, "cpu"
    final = torch.randn(20, 16, generator=generator)
    drafts = torch.randint(0, 50, (3, 20), generator=generator).tolist()
    drafts[1][4] = -1  # nothing drafted there
    sampling = {"temperature": 0.7, "top_k": 8, "top_p": 0.8}
    normed = final * torch.rsqrt(final.pow(2).mean(-1, keepdim=True) + 1e-6)
    logits = (normed @ head.head.T) / 0.7
    reference = apply_top_k_top_p_pytorch(logits, torch.full((20,), 8), torch.full((20,), 0.8)).softmax(-1)
    for p in range(0, 20, 2):  # the target's likeliest token drafted first from every other position
        drafts[0][p] = int(reference[p].argmax())
    monkeypatch.setattr(replay, "HEAD_CHUNK", 7)  # chunk edges inside the row: a row of 8K tokens has 16
    chances = head.chances(final, drafts, sampling)
    for s in range(3):
        for p in range(20):
            want = reference[p + s, drafts[s][p]].item() if p + s < 20 and drafts[s][p] >= 0 else 0.0
            assert chances[s][p] == pytest.approx(want, abs=1e-6)
    assert sum(c > 0 for row in chances for c in row) > 10 and sum(c == 0 for c in chances[2]) > 10  # both


def test_the_training_job_and_the_gate_walk_a_sampled_datasets_answers_as_sampled(tmp_path, monkeypatch):
    """The answers' sampling reaches the replay through predict_epochs and at_gate: a dataset generated at T=0.6
    is walked by expected acceptance (the head kept for it) and labelled sampled, a greedy one by the argmax."""
    class Head(FakeHead):
        def chances(self, final, drafts, sampling):
            return [[0.5] * len(row) for row in drafts]

    ids, mask, targets = greedy_row(0)
    merged = merged_table(tmp_path / "merged.parquet", [(ids, mask)])
    stores = {"d": FakeStore({0: (ids, targets)})}
    monkeypatch.setattr(replay, "TargetHead", lambda *args: Head())
    monkeypatch.setattr(replay, "load_drafter", lambda *args: FakeDrafter())
    for sampling, sampled in (({"temperature": 0.6}, True), ({"temperature": 0.0}, False)):
        validation = [{"epoch": 0}]
        replay.predict_epochs(validation, {0: tmp_path}, merged, stores, set(), tmp_path, [3], "cpu", {"d": sampling})
        label = validation[0]["predicted_served"]["exactness"]
        gate, _ = replay.at_gate(tmp_path, merged, stores, set(), tmp_path, 8, 3, 64, "cpu", {"d": sampling})
        assert ("sampled" in label, "sampled" in gate["exactness"]) == (sampled, sampled)
        if sampled:
            assert label["sampled"]["expected"] and gate["exactness"]["sampled"]["expected"]
            assert validation[0]["predicted_served"]["acceptance_rate_per_position"][0] == 0.5
        else:
            assert label["basis"] == "exact"


def test_a_sampled_answers_last_served_step_is_judged_past_the_window_by_the_heads_chances(monkeypatch):
    """The gate serves a window of each answer; its last step's drafts are judged up to the answer's end (vLLM
    counts a draft the target accepts before it truncates). Their chances need the target's distributions past
    the window: the replay reads the head that far, and its walk equals one with every position's chances."""
    generator = torch.Generator().manual_seed(1)
    head = object.__new__(replay.TargetHead)
    head.head, head.norm = torch.randn(6, 8, generator=generator) * 0.3, torch.ones(8)
    head.eps, head.device = 1e-6, "cpu"
    prompt, answer, seq, k = 3, 30, 33, 3
    final = torch.randn(seq, 8, generator=generator)
    ids = torch.randint(0, 6, (seq,), generator=generator).tolist()
    drafts = [[ids[p + s + 1] if p + s + 1 < seq else -1 for p in range(seq)] for s in range(k)]  # all match

    class Drafts:
        def chains(self, input_ids, stored, k, walked):
            return [d[:] for d in drafts[:k]]

    class Store:
        def read(self, row):
            return {"token_ids": torch.tensor(ids), "hidden_states": final[:, None, :]}

    row = replay.Row(("d", 0), torch.tensor(ids), [0] * prompt + [1] * answer, [*ids[1:], 0],
                     sampling={"temperature": 0.8})
    window = 7
    total, _ = replay.predict(Drafts(), [row], {"d": Store()}, [k], window=window, first_turn_only=True,
                              head=head)[k]
    full = head.chances(final, drafts, row.sampling)
    want = replay.walk(drafts, [*ids[1:], -1], prompt, prompt + window - 1, seq - 1, full)
    assert total.accepted == pytest.approx(want.accepted) and total.steps == want.steps
    assert want.accepted[k - 1] > 0  # the last step's later drafts, past the window, counted
