"""vLLM's CPU build samples a drafter's tokens at T > 0 with each request's temperature
(draftsmith/generation/vllm_fixes.py), in vLLM's own code, reached through the installed entry point."""

import json
import subprocess
import sys

import pytest

# What vLLM's CPU worker runs before it verifies drafts: the C++ stand-ins for its Triton kernels, then
# the rejection sampler's scaling of the target's logits; once as vLLM ships, once after its general
# plugins (draftsmith's among them) loaded.
PROBE = r"""
import json, types, torch
from vllm.platforms import current_platform
from vllm.plugins import load_general_plugins
from vllm.v1.sample import rejection_sampler
current_platform.register_triton_kernel_overrides()
logits = torch.randn(6, 32)
meta = types.SimpleNamespace(all_greedy=False, temperature=torch.tensor([0.7, 0.0, 2.0]), top_k=None, top_p=None)
ends = torch.tensor([2, 4, 6], dtype=torch.int32)  # each request's draft tokens end here
want = logits / torch.tensor([0.7, 0.7, 1.0, 1.0, 2.0, 2.0]).unsqueeze(-1)  # a greedy request's 0 reads as 1
def right():
    scaled = rejection_sampler.apply_sampling_constraints(logits.clone(), ends, meta)
    return bool(torch.allclose(scaled, want))
shipped = right()
load_general_plugins()
print(json.dumps({"vllm": shipped, "with_plugins": right()}))
"""


@pytest.fixture(scope="module")
def scaled_right() -> dict[str, bool]:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_drafts_at_t_above_0_are_verified_against_the_tempered_target(scaled_right):
    assert scaled_right["with_plugins"]


def test_vllm_cpu_build_still_needs_the_fix(scaled_right):
    """vllm#55005: without the fix, the target's logits are divided by uninitialised memory. When this
    fails, the pinned vLLM samples correctly on its own: drop the fix and its entry point."""
    assert not scaled_right["vllm"]


def test_each_requests_top_k_and_top_p_cover_its_draft_tokens():
    """The same expansion carries top-k (int32) and top-p: vLLM's CPU stand-in dropped those too."""
    import torch

    from draftsmith.generation.vllm_fixes import expand_batch_to_tokens

    ends = torch.tensor([1, 4, 6], dtype=torch.int32)
    top_k = expand_batch_to_tokens(torch.tensor([5, 0, 7], dtype=torch.int32), ends, 6)
    assert top_k.dtype == torch.int32 and top_k.tolist() == [5, 0, 0, 0, 7, 7]
    top_p = expand_batch_to_tokens(torch.tensor([0.9, 1.0, 0.5]), ends, 6)
    assert top_p.tolist() == pytest.approx([0.9, 1.0, 1.0, 1.0, 0.5, 0.5])


# DFlash's drafter normalises every draft layer's context keys in one grouped call, through vLLM's own
# method, once as vLLM ships and once after its general plugins loaded.
DFLASH_PROBE = r"""
import json, types, torch
from vllm.model_executor.models.qwen3_dflash import DFlashQwen3Model
from vllm.plugins import load_general_plugins
keys = torch.randn(2, 5, 2, 16)  # [layers, context tokens, kv heads, head_dim]
weights = torch.stack([torch.ones(16), 2 * torch.ones(16)])  # layer 1 scales by 2
drafter = types.SimpleNamespace(_k_norm_weights=weights, _rms_norm_eps=1e-6)
want = keys * torch.rsqrt(keys.pow(2).mean(-1, keepdim=True) + 1e-6) * weights[:, None, None, :]
def right():
    got = DFlashQwen3Model._normalize_context_k(drafter, keys)
    return [bool(torch.allclose(got[i], want[i], atol=1e-5)) for i in range(2)]
shipped = right()
load_general_plugins()
print(json.dumps({"vllm": shipped, "with_plugins": right()}))
"""


@pytest.fixture(scope="module")
def dflash_keys_right() -> dict[str, list[bool]]:
    done = subprocess.run([sys.executable, "-c", DFLASH_PROBE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_each_dflash_layer_normalises_its_context_keys_with_its_own_weight(dflash_keys_right):
    assert dflash_keys_right["with_plugins"] == [True, True]


def test_vllm_cpu_build_still_needs_the_dflash_fix(dflash_keys_right):
    """Layer 0's weight reaches every layer as vLLM 0.32 ships on CPUs. When this fails, the pinned vLLM
    normalises per layer on its own: drop :func:`normalize_context_k`."""
    assert dflash_keys_right["vllm"] == [True, False]


# A vLLM that moved a module or inlined a call: the plugin loads into every vLLM process (the target-alone
# servers too), so it must neither fail them nor claim a mend that no longer acts.
GUARD_PROBE = r"""
import json
from vllm.model_executor.models import qwen3_dflash
from vllm.v1.sample import rejection_sampler
from draftsmith.generation import vllm_fixes

def precompute_and_store_context_kv(self, context_states, context_positions, context_slot_mapping=None):
    return None  # a release that normalises the keys inline

qwen3_dflash.DFlashQwen3Model.precompute_and_store_context_kv = precompute_and_store_context_kv
moved = vllm_fixes.Mend("a mend of a moved module", "vllm.model_executor.models.qwen3_dflash_moved", None,
                        "expand", "caller", print)
vllm_fixes.MENDS = (*vllm_fixes.MENDS, moved)
unmended = vllm_fixes.unmended()
vllm_fixes.register()
print(json.dumps({"unmended": unmended,
                  "sampling": rejection_sampler.expand_batch_to_tokens is vllm_fixes.expand_batch_to_tokens,
                  "dflash": qwen3_dflash.DFlashQwen3Model._normalize_context_k is vllm_fixes.normalize_context_k}))
"""


def test_a_mend_vllm_no_longer_takes_is_named_and_the_others_still_apply(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(GUARD_PROBE)
    done = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["sampling"] and not seen["dflash"]
    reasons = seen["unmended"]
    assert set(reasons) == {"DFlash context keys normalised per layer (as vllm#56431 for XPU)",
                            "a mend of a moved module"}
    assert "no longer calls _normalize_context_k" in reasons["DFlash context keys normalised per layer "
                                                           "(as vllm#56431 for XPU)"]
    assert "ModuleNotFoundError" in reasons["a mend of a moved module"]
    assert "not applied: DFlash context keys" in done.stderr


def test_a_dflash_drafter_is_not_served_on_a_cpu_whose_vllm_no_longer_takes_the_mend(monkeypatch):
    """Served anyway, a multi-layer DFlash drafter would draft from wrongly normalised keys: the greedy
    answers stay the target's (verification), so nothing downstream would notice."""
    from draftsmith.generation import vllm_fixes

    two = {"transformer_layer_config": {"num_hidden_layers": 2}}
    monkeypatch.setattr(vllm_fixes, "unmended", lambda: {vllm_fixes.DFLASH_KEYS: "vllm...qwen3_dflash changed"})
    assert "not served here" in vllm_fixes.unserved_here("dflash", two, on_gpus=False)
    assert vllm_fixes.unserved_here("dflash", two, on_gpus=True) is None  # a GPU kernel normalises per layer
    assert vllm_fixes.unserved_here("dflash", {"transformer_layer_config": {"num_hidden_layers": 1}}, False) is None
    assert vllm_fixes.unserved_here("eagle3", two, False) is None
    monkeypatch.setattr(vllm_fixes, "unmended", dict)
    assert vllm_fixes.unserved_here("dflash", two, False) is None
