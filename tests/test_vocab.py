import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from draftsmith.data import vocab


def test_vocabulary_counts_supervised_tokens_of_the_training_split_only(tmp_path):
    rows = [{"input_ids": [1, 5, 5, 7], "loss_mask": [0, 1, 1, 1], "split": "train"},  # 5 twice, 7 once
            {"input_ids": [9, 9, 9, 3], "loss_mask": [1, 1, 1, 1], "split": "validation"}]  # must not count
    table = tmp_path / "merged.parquet"
    pq.write_table(pa.Table.from_pylist(rows), table)
    assert vocab.token_frequencies(table) == {5: 2, 7: 1}
    stats = vocab.build(table, draft_vocab_size=4, target_vocab_size=16, d2t_out=tmp_path / "d2t.npy",
                        t2d_out=tmp_path / "t2d.npy", stats_out=tmp_path / "stats.json")
    d2t, t2d = np.load(tmp_path / "d2t.npy"), np.load(tmp_path / "t2d.npy")
    selected = sorted(np.nonzero(t2d)[0].tolist())
    assert {5, 7} <= set(selected) and 9 not in selected and len(selected) == 4
    assert (np.arange(4) + d2t).tolist() == selected  # target id = draft id + d2t[draft id]
    assert stats["filled_without_data"] == 2 and stats["coverage"] == 1.0
    assert json.loads((tmp_path / "stats.json").read_text()) == stats
