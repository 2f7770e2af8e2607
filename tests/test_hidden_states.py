import json
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from draftsmith.config.layers import aux_layer_problem, choose_aux_layers, default_aux_layers
from draftsmith.hidden_states import extract as hs
from draftsmith.hidden_states.store import (
    ShardStore,
    ShardTransfer,
    fingerprint,
    open_store,
    shard_checksum,
    write_locations,
)
from draftsmith.ops.plan import bytes_per_token
from tests.conftest import REPO

ROWS = [[1, 504, 3300, 28, 2], [1, 9, 10]]
FP = fingerprint({"config": "c", "weights": "w"}, [2, 15, 27], 30, "vllm")


@pytest.fixture()
def table(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist([{"input_ids": ids} for ids in ROWS]), path)
    return path


def states(ids, hidden=8, value=0.0):
    return torch.full((len(ids), 4, hidden), value, dtype=torch.bfloat16), torch.tensor(ids)


def test_transformers_backend_writes_the_layout_speculators_reads(target_dir, table, tmp_path):
    from transformers import AutoModelForCausalLM

    store = open_store(tmp_path / "hs", FP, "per_row")
    rows = hs.read_rows(table)
    assert store.done(rows) == set()
    aux = default_aux_layers(30)
    assert aux == [2, 15, 27]
    with store.writer() as writer:
        hs.extract_transformers(str(target_dir), list(enumerate(rows)), writer, aux, threads=1)
    data = store.read(0)
    assert data["hidden_states"].shape == (5, 4, 576) and data["hidden_states"].dtype == torch.bfloat16
    assert data["token_ids"].tolist() == [1, 504, 3300, 28, 2]
    # The last slot is the final decoder layer's output *before* the final norm.
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.bfloat16).eval()
    with torch.inference_mode():
        out = model.model(input_ids=data["token_ids"][None], output_hidden_states=True)
        normed = model.model.norm(data["hidden_states"][:, 3][None])
    assert torch.allclose(normed.float(), out.hidden_states[-1].float(), atol=0.1, rtol=0.05)
    assert torch.equal(data["hidden_states"][:, 1], out.hidden_states[15][0])
    manifest = hs.write_manifest(store, rows, tmp_path / "m.json", {}, backend="transformers", aux_layers=aux)
    assert manifest["rows"] == 2 and manifest["tokens"] == 8 and manifest["files"] == 2



def test_the_transformers_backend_computes_on_the_jobs_accelerator(target_dir, monkeypatch):
    """On a GPU machine the model and every row go to the GPU (the job's device): before, it computed
    on the CPU beside an idle GPU. Shown with torch's meta device standing in for the accelerator."""
    from transformers import masking_utils

    from draftsmith.core import compute

    monkeypatch.setattr(compute, "device", lambda: "meta")
    # Without a KV cache, transformers reads the position ids for packed sequences (one value per batch:
    # a sync on a GPU); the meta device has no values to read. Right-padded rows are never packed.
    monkeypatch.setattr(masking_utils, "find_packed_sequence_indices", lambda position_ids: None)
    seen = []

    class Recorder:
        def write(self, row, hidden_states, token_ids):
            seen.append((row, hidden_states.device.type, tuple(hidden_states.shape), token_ids.device.type))

    hs.extract_transformers(str(target_dir), list(enumerate(ROWS)), Recorder(), [1, 2, 3], threads=1)
    assert seen == [(0, "meta", (5, 4, 576), "cpu"), (1, "meta", (3, 4, 576), "cpu")]

def test_extraction_keeps_only_the_stored_layers_of_a_batch(target_dir, monkeypatch):
    """output_hidden_states kept every layer's output of a batch until the pass ended: ~6.7 GiB for a
    61-layer, 7,168-wide target at batch_tokens 8,192. The stored layers are copied out by hooks into
    one buffer instead, and the code's own accounting says what that buffer takes. Nor is a KV cache
    built: the model's default use_cache kept every layer's keys and values of the batch (~1.1 GiB at
    36 layers x 8 KV heads x 128 at 8,192 tokens, tens of GiB for DeepSeek-V3's 128 heads)."""
    from transformers import AutoModelForCausalLM

    load, asked, caches = AutoModelForCausalLM.from_pretrained, [], []

    def loaded(*args, **kwargs):
        model = load(*args, **kwargs)
        forward = model.model.forward

        def recorded(*a, **kw):
            asked.append(kw.get("output_hidden_states"))
            out = forward(*a, **kw)
            caches.append(out.past_key_values)
            return out
        model.model.forward = recorded
        return model

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", loaded)

    class Keep:
        def write(self, row, hidden_states, token_ids):
            assert hidden_states.shape == (len(ROWS[row]), 4, 576)

    hs.extract_transformers(str(target_dir), list(enumerate(ROWS)), Keep(), [2, 15, 27], threads=1)
    assert asked and not any(asked)
    assert caches == [None] * len(asked)
    assert hs.batch_states_bytes(8192, 7168, 4) / 2**30 == pytest.approx(0.4375)


@pytest.mark.parametrize("layout", ["per_row", "shards"])
def test_rows_are_reused_only_with_the_same_token_ids_and_fingerprint(layout, tmp_path):
    store = open_store(tmp_path / "hs", FP, layout, shard_mb=1)
    with store.writer() as writer:
        writer.write(0, *states(ROWS[0]))
    assert store.done(ROWS) == {0}
    assert store.done([[1, 2, 3, 4, 5], ROWS[1]]) == set()  # a stale row: its tokens changed
    other = fingerprint({"config": "c", "weights": "w"}, [3, 14, 26], 30, "vllm")  # aux_layers changed
    assert open_store(tmp_path / "hs", other, layout).done(ROWS) == set()
    for backend_or_target in (fingerprint({"config": "c", "weights": "w"}, [2, 15, 27], 30, "transformers"),
                              fingerprint({"config": "c", "weights": "other"}, [2, 15, 27], 30, "vllm")):
        assert open_store(tmp_path / "hs", backend_or_target, layout).done(ROWS) == set()
    # Re-extraction with new settings deletes what can never be used again, and redoes every row.
    changed = open_store(tmp_path / "hs", other, layout)
    assert changed.purge_stale() > 0
    assert open_store(tmp_path / "hs", FP, layout).done(ROWS) == set()
    with pytest.raises(RuntimeError, match="2 rows have no valid hidden states"):
        hs.write_manifest(changed, ROWS, tmp_path / "m.json", {})
    # Rows that failed every attempt are the only ones a manifest may leave out.
    assert hs.write_manifest(changed, ROWS, tmp_path / "m.json", {0: "x", 1: "y"})["failed_rows"] == [0, 1]


def test_a_shard_cut_by_a_kill_is_not_taken_as_done(tmp_path):
    store = ShardStore(tmp_path / "hs", FP, shard_mb=1)
    with store.writer() as writer:
        writer.write(0, *states(ROWS[0]))
    shard = next((tmp_path / "hs" / "shards").glob("shard_*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:100])  # a truncated file: its index entry no longer matches
    assert store.done(ROWS) == set()
    with (tmp_path / "hs" / "index.jsonl").open("a") as fh:
        fh.write('{"shard": "shard_000009.safetensors", "ro')  # an index line cut by a kill
    assert store.entries() == []
    with store.writer() as writer:  # the rerun's shard is indexed on a line of its own, and read
        writer.write(1, *states(ROWS[1]))
    assert store.done(ROWS) == {1}


def test_shards_are_verified_before_training(tmp_path):
    store = ShardStore(tmp_path / "hs", FP, shard_mb=1)
    with store.writer() as writer:
        for i, ids in enumerate(ROWS):
            writer.write(i, *states(ids, value=i))
    store.verify()
    shard = next((tmp_path / "hs" / "shards").glob("shard_*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # same size, one bit of rot
    shard.write_bytes(bytes(data))
    store.verify(full=False)
    with pytest.raises(OSError, match="corrupt"):
        store.verify()


@pytest.mark.parametrize("layout", ["per_row", "shards"])
def test_the_trainer_reads_either_layout_by_merged_position(layout, tmp_path):
    store = open_store(tmp_path / "hs", FP, layout, shard_mb=1)
    with store.writer() as writer:
        for i, ids in enumerate(ROWS):
            writer.write(i, *states(ids, value=i + 1))
    data = tmp_path / "train" / "data"
    data.mkdir(parents=True)
    write_locations(data, store.locations([1, 0, 1]))  # merged order: a resampled row appears twice
    transfer = ShardTransfer(data)
    assert transfer.get_cached(0)["token_ids"].tolist() == ROWS[1]
    assert float(transfer.get_cached(1)["hidden_states"][0, 0, 0]) == 1.0
    assert "/" not in json.loads((data / "hs_locations.json").read_text())[0][0][:1]  # relative, portable
    import pickle

    assert pickle.loads(pickle.dumps(transfer)).get_cached(2)["token_ids"].tolist() == ROWS[1]


def test_a_killed_shard_writer_keeps_every_finished_shard(tmp_path):
    """Killed while its thread streams a shard (rows queued, a .partial file open): the shards in the
    index are kept whole, the partial one is never taken as done and the next run deletes it."""
    script = (f"import torch, os, signal, time, pathlib\nfrom draftsmith.hidden_states.store import ShardStore\n"
              f"store = ShardStore(pathlib.Path({str(tmp_path / 'hs')!r}), {FP!r}, shard_mb=1)\n"
              "w = store.writer()\n"
              "for i in range(40):\n"
              "    w.write(i, torch.zeros(300, 4, 128, dtype=torch.bfloat16), torch.arange(300))\n"
              "    if i == 25:\n"
              "        while not store.index_path.exists():\n"
              "            time.sleep(0.01)\n"
              # the writer's next shard never gets past its fsync: a .partial is surely open at the kill (the
              # index line's fsync goes on, or a writer between a shard's rename and its line would hang there)
              "        fsync = os.fsync\n"
              "        os.fsync = lambda fd: time.sleep(3600) if os.readlink(f'/proc/self/fd/{fd}').endswith("
              "'.partial') else fsync(fd)\n"
              "        def held():  # a .partial still there 0.2 s later: its writer waits in fsync\n"
              "            seen = set(store.folder.glob('shards/*.partial'))\n"
              "            time.sleep(0.2)\n"
              "            return seen & set(store.folder.glob('shards/*.partial'))\n"
              "        while not held():\n"
              "            pass\n"
              "        os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, timeout=120)
    assert proc.returncode == -9
    store = ShardStore(tmp_path / "hs", FP, shard_mb=1)
    done = store.done([list(range(300))] * 40)
    assert done and done == set(range(len(done))) and len(done) < 26  # whole shards only, in order
    store.verify()
    assert list((tmp_path / "hs" / "shards").glob("*.partial"))
    store.purge_stale()
    assert not list((tmp_path / "hs" / "shards").glob("*.partial"))


def test_a_damaged_shard_heals_on_rerun(tmp_path):
    store = ShardStore(tmp_path / "hs", FP, shard_mb=1)
    for row in (0, 1):
        with store.writer() as writer:  # one shard per row
            writer.write(row, *states(ROWS[row]))
    assert store.done(ROWS) == {0, 1}
    first = sorted((tmp_path / "hs" / "shards").glob("shard_*.safetensors"))[0]
    data = bytearray(first.read_bytes())
    data[-1] ^= 0xFF  # a flipped bit: same size, other sha256
    first.write_bytes(bytes(data))
    with pytest.raises(OSError, match=r"corrupt\. Rerun the dataset's hidden_states job"):
        store.verify()
    assert store.drop_damaged() == [first]
    assert store.done(ROWS) == {1}  # only the damaged shard's row is extracted again
    with store.writer() as writer:
        writer.write(0, *states(ROWS[0]))
    store.verify()
    assert store.done(ROWS) == {0, 1}


def test_states_extracted_again_with_other_settings_are_read_as_written(tmp_path):
    """Other aux layers (or backend, or target) re-extract the same rows into shards of the same
    sizes. The old shards' files are purged but their index lines stay: a new shard that took an old
    one's name and size was checked against the old sha256, and training refused the fresh store as
    corrupt (seen in the e2e warm start with the transformers backend)."""
    old = ShardStore(tmp_path / "hs", FP, shard_mb=1)
    with old.writer() as writer:
        writer.write(0, *states(ROWS[0], value=1.0))
    other = fingerprint({"config": "c", "weights": "w"}, [1, 2, 3], 30, "vllm")
    new = ShardStore(tmp_path / "hs", other, shard_mb=1)
    assert new.done(ROWS) == set() and new.purge_stale() > 0
    with new.writer() as writer:
        writer.write(0, *states(ROWS[0], value=2.0))  # same shapes: the shard has the old one's size
    new.verify()
    assert new.describe()["files"] == 1 and new.read(0)["hidden_states"][0, 0, 0] == 2.0


def test_the_last_shard_damaged_heals_on_rerun(tmp_path):
    """The damaged shard is the newest: its rows, extracted again (the same sizes, bits that differ
    a little with the batch), must not be checked against its stale index line, or every rerun
    finds the fresh shard corrupt, deletes it and extracts it again."""
    store = ShardStore(tmp_path / "hs", FP, shard_mb=1)
    for row in (0, 1):
        with store.writer() as writer:
            writer.write(row, *states(ROWS[row]))
    last = sorted((tmp_path / "hs" / "shards").glob("shard_*.safetensors"))[-1]
    data = bytearray(last.read_bytes())
    data[-1] ^= 0xFF
    last.write_bytes(bytes(data))
    assert store.drop_damaged() == [last] and store.done(ROWS) == {0}
    with store.writer() as writer:
        writer.write(1, *states(ROWS[1], value=0.5))  # a batch of other rows: the bits differ a little
    store.verify()
    assert store.done(ROWS) == {0, 1} and store.read(1)["hidden_states"][0, 0, 0] == 0.5


def test_too_many_failed_rows_fail_the_job_and_are_recorded(tmp_path):
    hs.check_failures({3: "TimeoutError: slow"}, 100, 0.01, tmp_path / "f.json")
    assert json.loads((tmp_path / "f.json").read_text()) == {"rows": {"3": "TimeoutError: slow"}}
    with pytest.raises(hs.ExtractionFailed, match=r"2 of 100 rows have no hidden states.*row 3: TimeoutError"):
        hs.check_failures({3: "TimeoutError: slow", 7: "x"}, 100, 0.01, tmp_path / "f.json")


def test_disk_estimate_refuses_before_work(tmp_path):
    need = 10**12 * bytes_per_token(7168, 4)
    with pytest.raises(OSError, match=r"hidden states need about [0-9.]+ TB \([0-9.]+ TiB\) but only"):
        hs.check_disk(tmp_path, need)
    hs.check_disk(tmp_path, 100 * bytes_per_token(576, 4))


def test_vllm_server_flags_name_the_cpu_connector(tmp_path):
    flags = hs.vllm_server_configs([2, 15, 27], 30, tmp_path)
    assert flags["speculative_config"]["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == \
        [2, 15, 27, 30]
    assert flags["kv_transfer_config"]["kv_connector_module_path"] == "draftsmith.hidden_states.connector"


def test_the_layers_are_decided_in_one_place(tmp_path):
    check = tmp_path / "check.json"
    check.write_text(json.dumps({"aux_layers": [1, 10, 20]}))
    assert choose_aux_layers([3, 4, 5], 30, check) == [3, 4, 5]
    assert choose_aux_layers(None, 30, check) == [1, 10, 20]
    assert choose_aux_layers(None, 30, None) == [2, 15, 27]


@pytest.mark.parametrize("num_layers, expected", [(4, [1, 2, 3]), (5, [1, 2, 4]), (6, [1, 3, 5]), (7, [2, 3, 4]),
                                                  (61, [2, 30, 58])])
def test_the_default_layers_are_distinct_target_layers_at_every_depth(num_layers, expected):
    layers = default_aux_layers(num_layers)  # EAGLE-3's [2, N/2, N-3] gave [2, 2, 1] for 4 layers
    assert layers == expected and aux_layer_problem(layers, num_layers) is None


def test_a_target_too_shallow_for_three_layers_is_named():
    with pytest.raises(ValueError, match="the target has 3 layers"):
        default_aux_layers(3)


@pytest.mark.parametrize("layout", ["per_row", "shards"])
def test_states_computed_in_fp32_are_stored_in_bf16(layout, tmp_path):
    store = open_store(tmp_path / "hs", FP, layout, shard_mb=1)
    with store.writer() as writer:
        writer.write(0, torch.full((5, 4, 576), 0.5, dtype=torch.float32), torch.tensor(ROWS[0]))
    assert store.read(0)["hidden_states"].dtype == torch.bfloat16


FP8 = fingerprint({"config": "c", "weights": "w"}, [2, 15, 27], 30, "vllm", "fp8")


def realistic_states(tokens: int, hidden: int = 576, seed: int = 0) -> torch.Tensor:
    """States shaped like a target's: most values small, a few outlier channels much larger."""
    generator = torch.Generator().manual_seed(seed)
    values = torch.randn(tokens, 4, hidden, generator=generator)
    values[..., :4] *= 50  # the massive activations real residual streams carry in a few channels
    return values.to(torch.bfloat16)


def tensor_bytes(path):
    """A safetensors file's bytes less its header (a shard's reserves room for thousands of rows)."""
    with path.open("rb") as fh:
        return path.stat().st_size - 8 - int.from_bytes(fh.read(8), "little")


@pytest.mark.parametrize("layout", ["per_row", "shards"])
def test_fp8_storage_round_trips_within_its_precision_per_token(layout, tmp_path):
    """Quantize, store, read back as the trainer does: every token and layer within fp8's precision
    (3 mantissa bits: relative error ≤ 2^-4 of the row's largest value), at about half the bytes."""
    original = realistic_states(len(ROWS[0]))
    stores = {storage: open_store(tmp_path / storage, FP8 if storage == "fp8" else FP, layout, 1, storage)
              for storage in ("bf16", "fp8")}
    for store in stores.values():
        with store.writer() as writer:
            writer.write(0, original, torch.tensor(ROWS[0]))
    data = tmp_path / "train"
    data.mkdir()
    write_locations(data, stores["fp8"].locations([0]))
    for back in (stores["fp8"].read(0)["hidden_states"], ShardTransfer(data).get_cached(0)["hidden_states"]):
        assert back.dtype == torch.bfloat16 and back.shape == original.shape
        error = (back.float() - original.float()).abs().amax(dim=-1)
        assert (error <= original.float().abs().amax(dim=-1) * 2**-4).all()
    sizes = {s: sum(tensor_bytes(p) for p in store.folder.rglob("*.safetensors")) for s, store in stores.items()}
    assert sizes["fp8"] < 0.56 * sizes["bf16"], sizes  # the scales and token ids weigh in on a 5-token row
    assert stores["bf16"].read(0)["hidden_states"].equal(original)  # bf16 is stored as computed


def test_a_change_of_storage_re_extracts_and_a_damaged_fp8_shard_is_named(tmp_path):
    fp8 = ShardStore(tmp_path / "hs", FP8, shard_mb=1, storage="fp8")
    with fp8.writer() as writer:
        for i, ids in enumerate(ROWS):
            writer.write(i, realistic_states(len(ids), seed=i), torch.tensor(ids))
    assert fp8.done(ROWS) == {0, 1}
    assert ShardStore(tmp_path / "hs", FP, shard_mb=1).done(ROWS) == set()  # bf16 never reads fp8 rows as its own
    assert fingerprint({"config": "c", "weights": "w"}, [2, 15, 27], 30, "vllm", "bf16") == FP  # bf16 stores kept
    fp8.verify()
    shard = next((tmp_path / "hs" / "shards").glob("shard_*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(OSError, match=f"{shard.name}: does not match its index entry"):
        fp8.verify()


def test_a_shard_streams_to_its_file_as_rows_arrive(tmp_path):
    """The writer keeps no shard in memory (issue 37: a whole-shard payload, then sha256 over it, then
    the write, all on the extraction's thread, stored at 0.2x the disk's speed): rows reach the
    shard's temporary file while the shard is still open, and its index line carries xxh3-128."""
    store = ShardStore(tmp_path / "hs", FP, shard_mb=4)
    writer = store.writer()
    for row in range(3):
        writer.write(row, torch.ones(300, 4, 128, dtype=torch.bfloat16), torch.arange(300))
    row_bytes = 300 * 4 * 128 * 2
    deadline = time.monotonic() + 30
    while not (partial := list((tmp_path / "hs" / "shards").glob("*.partial"))) or \
            partial[0].stat().st_size < 3 * row_bytes:
        assert time.monotonic() < deadline, "the open shard's rows never reached its file"
        time.sleep(0.01)
    assert not list((tmp_path / "hs" / "shards").glob("shard_*.safetensors"))  # the shard is not done yet
    writer.close()
    entry = json.loads((tmp_path / "hs" / "index.jsonl").read_text())
    assert set(entry) == {"shard", "rows", "fingerprint", "bytes", "xxh3_128"} and len(entry["rows"]) == 3
    assert shard_checksum(tmp_path / "hs" / "shards" / entry["shard"]) == entry["xxh3_128"]
    store.verify()
    assert store.read(2)["hidden_states"].float().sum() == row_bytes / 2


def test_shards_indexed_with_sha256_stay_readable_and_verified(tmp_path):
    """A store written before xxh3-128 (an index line with sha256) is read, verified and, when a bit
    rots, named as damaged: no store extracted earlier must be extracted again."""
    from safetensors.torch import save_file

    from draftsmith.core.digest import file_sha256

    (tmp_path / "hs" / "shards").mkdir(parents=True)
    shard = tmp_path / "hs" / "shards" / "shard_000000.safetensors"
    save_file({"0.hidden_states": torch.full((5, 4, 8), 2.0, dtype=torch.bfloat16),
               "0.token_ids": torch.tensor(ROWS[0])}, str(shard), metadata={"draftsmith_fingerprint": FP})
    from draftsmith.core.digest import ids_digest

    (tmp_path / "hs" / "index.jsonl").write_text(json.dumps({
        "shard": shard.name, "rows": {"0": ids_digest(ROWS[0])}, "fingerprint": FP,
        "bytes": shard.stat().st_size, "sha256": file_sha256(shard)}) + "\n")
    store = ShardStore(tmp_path / "hs", FP, shard_mb=1)
    assert store.done(ROWS) == {0} and store.read(0)["hidden_states"][0, 0, 0] == 2.0
    store.verify()
    with store.writer() as writer:  # new shards beside it carry xxh3-128
        writer.write(1, *states(ROWS[1]))
    store.verify()
    assert [sorted(k for k in s if k in ("sha256", "xxh3_128")) for s in store.describe()["shards"]] == \
        [["sha256"], ["xxh3_128"]]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert store.damaged() == [shard]


def test_an_index_line_with_no_checksum_names_its_shard_as_damaged(tmp_path):
    store = ShardStore(tmp_path / "hs", FP, shard_mb=1)
    with store.writer() as writer:
        writer.write(0, *states(ROWS[0]))
    index = tmp_path / "hs" / "index.jsonl"
    entry = json.loads(index.read_text())
    del entry["xxh3_128"]
    index.write_text(json.dumps(entry) + "\n")
    with pytest.raises(OSError, match=f"{entry['shard']}: does not match its index entry"):
        store.verify()


def test_a_short_header_write_is_finished_not_taken_as_written(tmp_path, monkeypatch):
    """pwrite, like write, may take part of a buffer: an unchecked return left a shard whose header was
    cut short, of the right size, which verify: size would pass."""
    from draftsmith.hidden_states import store as store_module

    pwrite = store_module.os.pwrite
    monkeypatch.setattr(store_module.os, "pwrite", lambda fd, data, offset: pwrite(fd, data[:100], offset))
    store = ShardStore(tmp_path / "hs", FP, shard_mb=1)
    with store.writer() as writer:
        writer.write(0, *states(ROWS[0], value=3.0))
    store.verify()
    assert store.read(0)["hidden_states"][0, 0, 0] == 3.0


def test_a_failing_shard_write_fails_the_extraction(tmp_path, monkeypatch):
    """The writer's thread hits a full disk: the extraction's next write (or the close) raises it,
    naming the store, and no shard is indexed; nothing is dropped in silence."""
    from draftsmith.hidden_states import store as hs_store

    def disk_full(self, names, tensors):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hs_store._ShardFile, "append", disk_full)
    store = ShardStore(tmp_path / "hs", FP, shard_mb=1)
    with pytest.raises(OSError, match=r"hs: writing a shard failed: .*No space left on device"), \
            store.writer() as writer:
        for row in range(50):
            writer.write(row, *states(ROWS[0]))
    assert store.done(ROWS) == set() and not (tmp_path / "hs" / "index.jsonl").exists()


def test_rows_are_batched_longest_first_within_the_token_budget():
    todo = [(0, [1] * 5), (1, [1] * 9), (2, [1] * 3), (3, [1] * 9), (4, [1] * 30)]
    assert [[row for row, _ in batch] for batch in hs.batches(todo, 20)] == [[4], [1, 3], [0, 2]]
    assert sum(len(batch) for batch in hs.batches(todo, 1)) == 5  # rows longer than the budget go alone


def test_batched_extraction_stores_what_one_row_at_a_time_does(target_dir, tmp_path):
    """Right padding never reaches a row's states (causal attention): batched rows match the same
    rows passed alone, and each keeps its own length."""
    rows = [[1, 504, 3300, 28, 2, 77, 91], [1, 9, 10], [1, 400, 20, 30, 2]]
    stores = {}
    for name, budget in (("alone", 1), ("batched", 64)):
        stores[name] = ShardStore(tmp_path / name, FP, shard_mb=1)
        with stores[name].writer() as writer:
            hs.extract_transformers(str(target_dir), list(enumerate(rows)), writer, [1, 2, 3], threads=1,
                                    dtype="float32", batch_tokens=budget)
    for row, ids in enumerate(rows):
        alone, batched = (stores[n].read(row) for n in ("alone", "batched"))
        assert batched["token_ids"].tolist() == ids and batched["hidden_states"].shape == (len(ids), 4, 576)
        assert torch.allclose(alone["hidden_states"].float(), batched["hidden_states"].float(), atol=0.05, rtol=0.02)
