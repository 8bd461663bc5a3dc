"""How much memory a training group needs, known before it runs.

    peak = weights, gradients and AdamW moments (16 bytes per parameter, fp32)
         + the activations autograd saves for the backward of the longest training step
         + a margin for the backward's transients and the allocator (ACTIVATION_MARGIN)
         + on CUDA, the context and cuBLAS/cuDNN workspaces (CUDA_FIXED)

The activations are not guessed from a formula: `saved_bytes_per_item` runs the model's real forward on the
CPU for one member on two and on four items of the longest training sequence, under the dtype policy the
device trains with (fp32 on the CPU, bf16 autocast on CUDA), and adds up what autograd saves (each storage
once). What grows with the batch is per item; the rest (under autocast, the weights' bf16 copies, made once
per forward) is per member; both scale exactly with members x batch. With `train.checkpoint = "layer"`
only each layer's input is kept per loop step, plus one layer's activations, recomputed in the backward.
The count matches what an H200 measured to 1% (ACTIVATION_MARGIN); dev/gpu-check.sh re-measures it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from functools import cache

import torch

from engine.core.presets import RunConfig
from engine.core.tasks import sample  # bound at import: the estimate's two items are not training draws

GIB = 2**30
CUDA_FIXED = 1.5 * GIB  # CUDA context, cuBLAS and cuDNN workspaces
# The backward's transients over the saved activations. Without it the estimate is 4.54 + 55.7 GiB = 64.7 GB for
# the `paper` parity group of 16 (eager) and 58.0 GB for 4 chain seeds, where an H200 measured 64.8 GB and 58.5 GB
# (torch.cuda.max_memory_allocated, torch 2.11; issue 29): 0.2% and 1% more. dev/gpu-check.sh re-measures it.
ACTIVATION_MARGIN = 1.05


@dataclass(frozen=True)
class MemoryEstimate:
    members: int
    state_bytes: int  # weights + gradients + AdamW moments
    activation_bytes: int  # saved for the backward of the longest training step
    fixed_bytes: int
    checkpoint: str

    @property
    def peak_bytes(self) -> int:
        return int(self.state_bytes + ACTIVATION_MARGIN * self.activation_bytes + self.fixed_bytes)

    def sentence(self, device: str) -> str:
        how = ", activations checkpointed per layer" if self.checkpoint == "layer" else ""
        return (
            f"estimated peak memory on {device}: {self.peak_bytes / GIB:.1f} GiB for {self.members} seed(s) "
            f"(weights and optimizer {self.state_bytes / GIB:.2f} GiB, activations "
            f"{self.activation_bytes / GIB:.1f} GiB{how})"
        )


@cache
def longest_sequence(cfg: RunConfig) -> int:
    return max(sample(cfg.task, d, 2, torch.Generator().manual_seed(0)).tokens.shape[-1]
               for d in cfg.task.train_difficulties)  # fmt: skip


def _saved_bytes(cfg: RunConfig, kind: str, items: int) -> int:
    """Bytes autograd saves in one training forward of one member on `items` items of the longest training sequence,
    each storage counted once, parameters not counted."""
    from engine.core.model import build
    from engine.core.train import loop_schedule

    loops = max(loop_schedule(cfg.train_loops, cfg.train.steps)) if cfg.train.loops else cfg.model.trained_loops
    seq = longest_sequence(cfg)
    model = build(cfg.model, [0])
    difficulty = max(cfg.task.train_difficulties)
    tokens = sample(cfg.task, difficulty, max(items, 2), torch.Generator().manual_seed(0)).tokens[:items, :seq][None]
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = max(seen.get(s.data_ptr(), 0), s.nbytes())
        return t

    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=kind == "cuda")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
        out = model(tokens, loops, all_positions=True, readout_steps="all" if cfg.train.loss_over_steps else "last")
    del out
    return sum(seen.values())


@cache
def saved_bytes_per_item(cfg: RunConfig, kind: str) -> tuple[int, int, int]:
    """(saved bytes per item of one member through all its training loop steps, saved bytes per member whatever the
    batch (under autocast: the weights' bf16 copies, made once per forward), bytes of the state that enters one loop
    step per item), counted on the CPU under `kind`'s dtype policy (`cpu`: fp32, `cuda`: bf16 autocast), from two
    batch sizes: what grows with the batch is per item, the rest per member."""
    two, four = _saved_bytes(cfg, kind, 2), _saved_bytes(cfg, kind, 4)
    per_item = (four - two) // 2
    state = longest_sequence(cfg) * cfg.model.d_model * (2 if kind == "cuda" else 4)
    return per_item, max(0, two - 2 * per_item), state


def estimate(cfg: RunConfig, members: int, device: str) -> MemoryEstimate:
    """The peak memory of training `members` seeds of `cfg` on `device` ("cpu" or "cuda")."""
    kind = "cuda" if device.startswith("cuda") else "cpu"
    per_item, per_member, state_per_item = saved_bytes_per_item(replace(cfg, max_eval_loops=1), kind)
    items = members * cfg.train.batch_size
    activations = per_item * items + per_member * members
    checkpoint = getattr(cfg.train, "checkpoint", "none")
    if checkpoint == "layer":  # each layer's input at every step, and one layer's activations recomputed at a time
        calls = cfg.model.layers_per_block * cfg.model.trained_loops
        activations = items * (calls * state_per_item + per_item // calls) + per_member * members
    return MemoryEstimate(
        members=members,
        state_bytes=16 * cfg.model.n_params * members,
        activation_bytes=int(activations),
        fixed_bytes=int(CUDA_FIXED if kind == "cuda" else 0),
        checkpoint=checkpoint,
    )


def available(device: str) -> int:
    """Bytes this device can give a training: a GPU's total memory, or the machine's RAM
    ($LOOPSCOPE_MEMORY_GB overrides both, e.g. to plan for an 80 GB GPU on a larger one)."""
    if os.environ.get("LOOPSCOPE_MEMORY_GB"):
        return int(float(os.environ["LOOPSCOPE_MEMORY_GB"]) * 1e9)
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 2**63


def check_fits(cfg: RunConfig, members: int, device: str) -> MemoryEstimate:
    """The estimate, or ValueError with one sentence if it exceeds what the device has (before any allocation)."""
    est = estimate(cfg, members, device)
    have = available(device)
    if est.peak_bytes > have:
        raise ValueError(
            f"a group of {members} seed(s) needs about {est.peak_bytes / GIB:.1f} GiB on {device} and "
            f"{have / GIB:.1f} GiB are there; use a smaller train.group_size, train.batch_size or model, or "
            f'train.checkpoint "layer" (activations recomputed per layer).'
        )
    return est
