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


def test_a_drafter_replayed_is_accepted_where_the_target_agrees_with_it(drafter, target_dir):
    """The replay runs speculators' own forward on a real checkpoint and the target's whole-vocabulary head."""
    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (40,))
    hidden = torch.randn(40, 4, 576, dtype=torch.bfloat16)  # the three aux layers, then the final one
    drafts = replay.load_drafter(drafter, target_dir).chains(ids, hidden, 3, [1] * 40)
    targets = replay.TargetHead(target_dir).tokens(hidden[:, -1])
    assert len(drafts) == 3 and all(len(d) == 40 for d in drafts) and len(targets) == 40
    assert all(0 <= t < 49152 for t in targets)
    perfect = [drafts[0][i] if i > 0 else 0 for i in range(40)]  # the target agreeing with every first draft
    first_only = replay.walk(drafts, [perfect[i] if i + 1 < 40 else 0 for i in range(40)], 5, 30)
    assert first_only.accepted[0] == first_only.steps


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
    replay.predict_epochs(validation, {0: tmp_path}, tmp_path / "merged.parquet", {}, set(), tmp_path, None, "cpu")
    assert "predicted_served" not in validation[0] and validation[0]["predicted_served_failed"]
    assert replay.at_gate(tmp_path, tmp_path / "merged.parquet", {}, set(), tmp_path, 8, 3, 64, "cpu") is None
    assert "could not be computed" in caplog.text


def test_the_replay_computes_in_the_machines_dtype_not_the_checkpoints(drafter, target_dir, monkeypatch):
    """A bf16 checkpoint and target on a CPU without native bf16 (AVX2 only) replay in fp32, 7x faster there."""
    from draftsmith.core import compute

    monkeypatch.setattr(compute, "choose", lambda *args, **kwargs: compute.Choice("float32", "AVX2 only"))
    assert replay.TargetHead(target_dir).head.dtype == torch.float32
    assert replay.load_drafter(drafter, target_dir).model.fc.weight.dtype == torch.float32
