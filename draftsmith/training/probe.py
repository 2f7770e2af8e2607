"""Before training: which loss implementation and whether torch.compile work with the torch found here.

speculators computes its loss with fused Triton kernels inside its ``torch.compile``d forward. Both
depend on the installed torch, Triton and driver, which differ between clusters, containers and
vLLM's pins: on the lent H200 (torch 2.11) dynamo failed on the fused loss's autotuner in the first
step (issue 37). A probe runs the configured loss forward and backward on a tiny batch on the job's
device, in a process of its own (a kernel that faults can poison a CUDA context), compiled when the
trainer will compile, and compares it with the eager loss. The compile probe also runs speculators'
draft attention (FlexAttention with a block mask) compiled, forward and backward, against sdpa: the
trainer's compiled forward needs both. ``auto`` settings then take what worked, and the choice and its reason go to the
log, the training summary, the report and the model card. Which device probes at all, and which
attention an uncompiled trainer gets, is :mod:`draftsmith.core.platform`'s decision.

    python -m draftsmith.training.probe LOSS_FN IMPLEMENTATION on|off DEVICE attention|loss   # 0: it works
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from draftsmith.core import platform
from draftsmith.training import families

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 600  # a first Triton compile and autotune take seconds to a few minutes


@dataclass
class Choice:
    """How the trainer computes: the loss implementation, whether speculators compiles, and why."""

    loss_implementation: str
    compile: bool
    reason: str

    def as_dict(self) -> dict:
        return asdict(self)


def run_probe(loss_fn: str, implementation: str, compile_: bool, device: str, attention: bool = False) -> None:
    """The loss of ``implementation`` forward and backward on a tiny batch; raises when it fails or
    disagrees with the eager loss."""
    import torch
    from speculators.losses.utils import resolve_loss_config

    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 64, 512, generator=generator).to(device, torch.bfloat16).requires_grad_()
    targets = torch.randn(1, 64, 512, generator=generator).to(device, torch.bfloat16)

    def loss_of(config, values):
        return sum(weight * fn(values, targets).float().mean() for fn, weight in config.values())

    step = torch.compile(loss_of) if compile_ else loss_of
    loss = step(resolve_loss_config(loss_fn, implementation), logits)
    loss.backward()
    reference = loss_of(resolve_loss_config(loss_fn, "eager"), logits.detach())
    if not (torch.isfinite(loss) and torch.isfinite(logits.grad).all()):
        raise FloatingPointError(f"the {implementation} loss gave non-finite values")
    if not torch.allclose(loss.float(), reference.float(), rtol=0.05, atol=1e-3):
        raise ArithmeticError(f"the {implementation} loss gave {loss.item():.5f}, the eager one "
                              f"{reference.item():.5f}")
    if attention:
        run_attention_probe(device)


def run_attention_probe(device: str) -> None:
    """speculators' draft attention as the compiled trainer runs it: FlexAttention with a causal block
    mask, compiled, forward and backward; raises when it fails or disagrees with sdpa."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 256, 64, generator=generator).to(device, torch.bfloat16).requires_grad_()
               for _ in range(3))
    mask = create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, None, None, 256, 256, device=device)
    out = torch.compile(flex_attention)(q, k, v, block_mask=mask)
    out.float().square().mean().backward()
    reference = torch.nn.functional.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), is_causal=True)
    if not all(torch.isfinite(t.grad).all() for t in (q, k, v)):
        raise FloatingPointError("compiled FlexAttention gave non-finite gradients")
    if not torch.allclose(out.detach().float(), reference.float(), rtol=0.05, atol=0.02):
        raise ArithmeticError("compiled FlexAttention disagrees with sdpa")


def probe(loss_fn: str, implementation: str, compile_: bool, device: str, attention: bool = False,
          timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Run :func:`run_probe` in a process of its own; ``None`` when it worked, else what went wrong."""
    try:
        proc = subprocess.run(command(loss_fn, implementation, compile_, device, attention), capture_output=True,
                              text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"no result within {timeout_s:.0f} s"
    if proc.returncode == 0:
        return None
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    return lines[-1] if lines else f"exit code {proc.returncode}"


def command(loss_fn: str, implementation: str, compile_: bool, device: str, attention: bool = False) -> list[str]:
    """The probe's process (``loss_fn`` by name: a family's loss left to speculators' recipe is resolved
    first, :func:`draftsmith.training.families.loss_fn`)."""
    return [sys.executable, "-m", "draftsmith.training.probe", loss_fn, implementation, "on" if compile_ else "off",
            device, "attention" if attention else "loss"]


def compile_setting(value: str | bool) -> str:
    """``train.compile`` as auto, on or off: YAML reads an unquoted on/off as true/false."""
    return {True: "on", False: "off"}.get(value, value)


def forced_on_gpu(train: dict) -> list[str]:
    """The ``train`` settings that need the trainer on a CUDA GPU (the preflight refuses them without one)."""
    return [f"train.{key}: {value}" for key, value in (("loss_implementation", train["loss_implementation"]),
                                                       ("compile", compile_setting(train["compile"])))
            if value in ("fused", "on")]


def choose(train: dict, family: dict, device: str) -> Choice:
    """The trainer's loss implementation and compilation, from the config's ``train`` settings
    (``loss_implementation``: auto, fused, eager; ``compile``: auto, on, off) and, for ``auto``, the
    probes on ``device`` with the loss ``family`` (one family's settings) trains with.

    speculators compiles only on CUDA and its fused losses are Triton GPU kernels: without an
    accelerator both ``auto`` settings resolve to eager, uncompiled, with no probe."""
    loss_setting, compile_mode = train["loss_implementation"], compile_setting(train["compile"])
    loss_fn = families.loss_fn(family)
    if not platform.probes_trainer(device):
        if forced_on_gpu(train):
            raise ValueError(f"{' and '.join(forced_on_gpu(train))} need a CUDA GPU (Triton kernels; speculators "
                             "compiles only there); this job has none")
        return Choice("eager", False, "no CUDA device: the fused loss is a Triton GPU kernel, and "
                                      "speculators compiles only on CUDA")
    reasons = []
    compile_ = compile_mode != "off"
    if compile_mode == "auto":
        started = time.monotonic()
        failure = probe(loss_fn, "eager", True, device, attention=True)  # the compiled forward needs both
        compile_ = failure is None
        reasons.append(f"torch.compile {'works' if compile_ else 'failed its probe: ' + failure} "
                       f"({time.monotonic() - started:.0f} s)")
    else:
        reasons.append(f"torch.compile {compile_mode} (set in the config)")
    implementation = loss_setting
    if loss_setting == "auto":
        started = time.monotonic()
        failure = probe(loss_fn, "fused", compile_, device)
        implementation = "fused" if failure is None else "eager"
        where = "compiled" if compile_ else "uncompiled"
        reasons.append(f"the fused loss {'works ' + where if failure is None else 'failed its probe ' + where}"
                       f"{'' if failure is None else ': ' + failure}, so {implementation} "
                       f"({time.monotonic() - started:.0f} s)")
    else:
        reasons.append(f"{loss_setting} loss (set in the config)")
    choice = Choice(implementation, compile_, "; ".join(reasons))
    (log.info if "failed" not in choice.reason else log.warning)("trainer: %s", choice.reason)
    return choice


if __name__ == "__main__":
    loss_fn_, implementation_, compile_arg, device_, what = sys.argv[1:6]
    try:
        run_probe(loss_fn_, implementation_, compile_arg == "on", device_, attention=what == "attention")
    except Exception as err:  # the one line probe() reports; the traceback stays out of the job's log
        print(f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}",
              file=sys.stderr)
        sys.exit(1)
