import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file, save_file

from draftsmith import hidden_states as hs


@pytest.fixture()
def table(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pylist([{"input_ids": [1, 504, 3300, 28, 2]}, {"input_ids": [1, 9, 10]}]), path)
    return path


def test_transformers_backend_writes_speculators_layout(target_dir, table, tmp_path):
    from transformers import AutoModelForCausalLM

    folder = tmp_path / "hs"
    folder.mkdir()
    todo, total = hs.rows_to_extract(table, folder)
    assert total == 2 and [r for r, _ in todo] == [0, 1]
    aux = hs.default_aux_layers(30)
    assert aux == [2, 15, 27]
    hs.extract_transformers(str(target_dir), todo, folder, aux, threads=1)
    data = load_file(folder / "hs_0.safetensors")
    assert data["hidden_states"].shape == (5, 4, 576) and data["hidden_states"].dtype == torch.bfloat16
    assert data["token_ids"].tolist() == [1, 504, 3300, 28, 2]
    # The last slot is the final decoder layer's output *before* the final norm.
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.bfloat16).eval()
    with torch.inference_mode():
        out = model.model(input_ids=data["token_ids"][None], output_hidden_states=True)
        normed = model.model.norm(data["hidden_states"][:, 3][None])
    assert torch.allclose(normed.float(), out.hidden_states[-1].float(), atol=0.1, rtol=0.05)
    assert torch.equal(data["hidden_states"][:, 1], out.hidden_states[15][0])
    manifest = hs.write_manifest(folder, tmp_path / "m.json", "transformers", aux, 30, 576, table)
    assert manifest["rows"] == 2 and manifest["tokens"] == 8


def test_resume_keeps_only_valid_matching_files(table, tmp_path):
    folder = tmp_path / "hs"
    folder.mkdir()
    good = {"hidden_states": torch.zeros(5, 4, 8, dtype=torch.bfloat16),
            "token_ids": torch.tensor([1, 504, 3300, 28, 2])}
    save_file(good, folder / "hs_0.safetensors")
    assert [r for r, _ in hs.rows_to_extract(table, folder)[0]] == [1]
    (folder / "hs_0.safetensors").write_bytes((folder / "hs_0.safetensors").read_bytes()[:40])  # cut by a kill
    assert [r for r, _ in hs.rows_to_extract(table, folder)[0]] == [0, 1]
    save_file({**good, "token_ids": torch.tensor([1, 2, 3, 4, 5])}, folder / "hs_0.safetensors")  # stale row
    assert [r for r, _ in hs.rows_to_extract(table, folder)[0]] == [0, 1]
    with pytest.raises(RuntimeError, match="2 rows have no valid hidden states"):
        hs.write_manifest(folder, tmp_path / "m.json", "vllm", [2, 15, 27], 30, 8, table)


def test_disk_estimate_refuses_before_work(tmp_path):
    need = hs.estimate_bytes(total_tokens=10**12, num_slots=4, hidden_size=7168)
    with pytest.raises(OSError, match="hidden states need about .* GiB but only"):
        hs.check_disk(tmp_path, need)
    hs.check_disk(tmp_path, hs.estimate_bytes(100, 4, 576))


def test_vllm_server_flags_name_the_cpu_connector(tmp_path):
    flags = hs.vllm_server_configs([2, 15, 27], 30, tmp_path)
    assert flags["speculative_config"]["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == \
        [2, 15, 27, 30]
    assert flags["kv_transfer_config"]["kv_connector_module_path"] == "draftsmith.hs_connector"
