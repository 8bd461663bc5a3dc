"""How much memory a training group needs, known before it runs.

    peak = weights, gradients and AdamW moments (16 bytes per parameter, fp32; on the CPU 8 more for AdamW's
           temporaries and 16 more for a checkpointed training's saves and resume)
         + the activations autograd saves for the backward of the longest training step
         + a margin for the backward's transients and the allocator (ACTIVATION_MARGIN)
         + on CUDA, the context and cuBLAS/cuDNN workspaces (CUDA_FIXED)

The activations are not guessed from a formula: `saved_bytes_per_item` runs the model's real forward on the
CPU for one member on two and on four items of the longest training sequence, under the dtype policy the
device trains with (fp32 on the CPU, bf16 autocast on CUDA), and adds up what autograd saves (each storage
once). What grows with the batch is per item; the rest (under autocast, the weights' bf16 copies, made once
per forward) is per member; both scale exactly with members x batch. With `train.checkpoint = "layer"`
what the checkpointed forward keeps (counted the same way: each layer's input, fp32 under autocast too, and what the
loop saves outside the layers), plus one layer's activations, recomputed in the backward.
The count matches what an H200 measured to 1% (ACTIVATION_MARGIN); dev/checks/gpu-check.sh re-measures it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from functools import cache

import torch

from engine.core.presets import RunConfig, loop_schedule
from engine.core.tasks import sample  # bound at import: the estimate's two items are not training draws

GIB = 2**30
CUDA_FIXED = 1.5 * GIB  # CUDA context, cuBLAS and cuDNN workspaces
# The backward's transients over the saved activations. Without it the estimate is 4.54 + 55.7 GiB = 64.7 GB for
# the `paper` parity group of 16 (eager) and 58.0 GB for 4 chain seeds, where an H200 measured 64.8 GB and 58.5 GB
# (torch.cuda.max_memory_allocated, torch 2.11; issue 29): 0.2% and 1% more. dev/checks/gpu-check.sh re-measures it.
ACTIVATION_MARGIN = 1.05
# On the CPU (issue 41: peak RSS by ru_maxrss, training and evaluation in one process, against the estimate; the
# table is in dev/LOG.md, 2026-12-05): the process itself (Python, torch, pandas and pyarrow imported: the smoke
# preset trained and evaluated peaks at 0.39 GiB), and the backward's transients and glibc's allocator over the saved
# activations, by the size of one activation of the group (`tensor` in estimate). glibc serves a block below its mmap
# threshold from its heap, where the backward's frees leave holes, and maps a larger one and returns it when freed;
# the threshold starts at 128 KiB (HEAP_TENSOR) and rises to the size of each mapped block freed, up to 32 MiB
# (MAPPED_TENSOR, glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64 bits). So: under 128 KiB always the heap (128 layers of
# the smoke model: 2.1x the activations counted; CPU_MARGIN_SMALL); from 32 MiB always mapped (a batch of 65,536:
# 1.3x; CPU_MARGIN); between the two the heap once the threshold has risen, which depends on the order of the
# allocations, so on the machine (CPU_MARGIN_MID). Over the activations counted, in that range: the `cpu` presets
# 1.07-1.10x and a group of 1,024 smoke members 0.6x on an Intel Xeon; issue 60's smoke group of two at batch 8,192
# (1.72-1.78 GiB) 1.59x and a group of 256 (>= 1.20 GiB) 1.53x, where an AMD EPYC measured 0.98 and 0.73 GiB
# (0.7x; 2 and 8 threads: within 10%). tests/test_untrusted.py holds every peak measured against the estimate.
CPU_FIXED = 0.45 * GIB
CPU_MARGIN, CPU_MARGIN_MID, CPU_MARGIN_SMALL = 1.4, 1.7, 2.2
HEAP_TENSOR, MAPPED_TENSOR = 128 * 2**10, 32 * 2**20
# Per parameter on the CPU beyond the 16 bytes of state (dev/LOG.md, 2026-12-06: VmHWM against the estimate):
# AdamW's multi-tensor (foreach) step makes whole-model temporaries (d_model 2048: 7.3 bytes a parameter over the
# rest), and a checkpointed training holds more around its saves and its resume (19M, checkpoint every step:
# 1.95 GiB fresh, 2.44 GiB resumed, where the estimate without this term said 2.17).
CPU_OPTIMIZER_BYTES, CPU_CHECKPOINT_BYTES = 8, 16
EVAL_CHUNK = 256  # engine.core.evaluate.step_metrics' chunk: examples in one forward


@dataclass(frozen=True)
class MemoryEstimate:
    members: int
    state_bytes: int  # weights + gradients + AdamW moments
    activation_bytes: int  # saved for the backward of the longest training step
    fixed_bytes: int
    checkpoint: str
    eval_bytes: int = 0  # the evaluation after training, on the CPU (eval_bytes)
    margin: float = ACTIVATION_MARGIN

    @property
    def peak_bytes(self) -> int:
        return int(self.state_bytes + self.margin * self.activation_bytes + self.eval_bytes + self.fixed_bytes)

    def sentence(self, device: str) -> str:
        how = ", activations checkpointed per layer" if self.checkpoint == "layer" else ""
        return (
            f"estimated peak memory on {device}: {self.peak_bytes / GIB:.1f} GiB for {self.members} seed(s) "
            f"(weights and optimizer {self.state_bytes / GIB:.2f} GiB, activations "
            f"{self.activation_bytes / GIB:.1f} GiB{how}"
            + (f", evaluation {self.eval_bytes / GIB:.1f} GiB" if self.eval_bytes else "")
            + ")"
        )


@cache
def longest_sequence(cfg: RunConfig) -> int:
    return max(sample(cfg.task, d, 2, torch.Generator().manual_seed(0)).tokens.shape[-1]
               for d in cfg.task.train_difficulties)  # fmt: skip


def _saved_bytes(cfg: RunConfig, kind: str, items: int, recompute: bool = False) -> int:
    """Bytes autograd saves in one training forward of one member on `items` items of the longest training sequence,
    each storage counted once, parameters not counted. recompute (train.checkpoint "layer"): what the checkpointed
    forward keeps, each layer's input included (held by the checkpoint for its recomputation, in its own dtype: fp32
    under autocast too, where the residual stream stays fp32)."""
    from engine.core import model as model_module
    from engine.core.model import build

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

    keep = lambda m, args: (pack(args[0]), None)[1]  # noqa: E731  (a pre-hook returning None leaves the input)
    hooks = [layer.register_forward_pre_hook(keep) for layer in model.layers] if recompute else []

    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=kind == "cuda")
    lever = model_module.CPU_BF16_MATH_ATTENTION  # a GPU runs PyTorch's own attention kernel: count what it saves
    model_module.CPU_BF16_MATH_ATTENTION = lever and kind != "cuda"
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
            out = model(tokens, loops, all_positions=True, readout_steps="all" if cfg.train.loss_over_steps else "last",
                        recompute=recompute)  # fmt: skip
    finally:
        model_module.CPU_BF16_MATH_ATTENTION = lever
        for hook in hooks:
            hook.remove()
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
    state = longest_sequence(cfg) * cfg.model.d_model * 4  # fp32, under autocast too (the residual stream's dtype)
    return per_item, max(0, two - 2 * per_item), state


@cache
def checkpointed_bytes_per_item(cfg: RunConfig, kind: str) -> tuple[int, int]:
    """saved_bytes_per_item's first two for train.checkpoint "layer": what the checkpointed forward keeps (every layer's
    input at every loop step, fp32 under autocast as well, and what the loop saves outside the layers: the boundary,
    its norms, the readout), counted on the CPU under `kind`'s dtype policy, per item and per member."""
    two, four = _saved_bytes(cfg, kind, 2, recompute=True), _saved_bytes(cfg, kind, 4, recompute=True)
    per_item = (four - two) // 2
    return per_item, max(0, two - 2 * per_item)


def estimate(cfg: RunConfig, members: int, device: str, checkpointed: bool = False) -> MemoryEstimate:
    """The peak memory of training `members` seeds of `cfg` on `device` ("cpu" or "cuda"); checkpointed: the training
    saves a checkpoint as it goes (and may resume from one)."""
    kind = "cuda" if device.startswith("cuda") else "cpu"
    per_item, per_member, _ = saved_bytes_per_item(replace(cfg, max_eval_loops=1), kind)
    items = members * cfg.train.batch_size
    activations = per_item * items + per_member * members
    checkpoint = getattr(cfg.train, "checkpoint", "none")
    tensor = items * longest_sequence(cfg) * cfg.model.d_model * 4  # one activation of the group, fp32
    if checkpoint == "layer":  # what the checkpointed forward keeps, and one layer's activations recomputed at a time
        calls = cfg.model.layers_per_block * cfg.model.trained_loops
        kept_item, kept_member = checkpointed_bytes_per_item(replace(cfg, max_eval_loops=1), kind)
        activations = items * (kept_item + per_item // calls) + max(per_member, kept_member) * members
    per_param = 16 if kind == "cuda" else 16 + CPU_OPTIMIZER_BYTES + (CPU_CHECKPOINT_BYTES if checkpointed else 0)
    return MemoryEstimate(
        members=members,
        state_bytes=per_param * cfg.model.n_params * members,
        activation_bytes=int(activations),
        fixed_bytes=int(CUDA_FIXED if kind == "cuda" else CPU_FIXED),
        checkpoint=checkpoint,
        eval_bytes=0 if kind == "cuda" else eval_bytes(cfg, members),
        margin=ACTIVATION_MARGIN if kind == "cuda" else cpu_margin(tensor),
    )


def cpu_margin(tensor: int) -> float:
    """The CPU's factor over the activations counted, by the bytes of one activation of the group (CPU_MARGIN's
    comment: where glibc puts a block of that size)."""
    return CPU_MARGIN_SMALL if tensor < HEAP_TENSOR else CPU_MARGIN_MID if tensor < MAPPED_TENSOR else CPU_MARGIN


def eval_bytes(cfg: RunConfig, members: int) -> int:
    """What the evaluation after training holds at its peak on the CPU (engine.core.evaluate.evaluate, one member and
    one difficulty at a time): every difficulty's evaluation set (tasks.eval_set keeps them: tokens and targets in
    int64), and for one difficulty the step metrics of every example at every loop step (the predictions counted per
    token of the vocabulary, one_hot in int64, the choices, the norms and their copies), one chunk's forward, and the
    rows of all members."""
    n, E, V, d = cfg.max_eval_loops, cfg.task.eval_examples, cfg.model.vocab_size, cfg.model.d_model
    seqs = [eval_sequence(cfg.task, x) for x in cfg.task.eval_difficulties]
    sets = sum(E * (2 * seq + 1) * 8 for seq in seqs)
    metrics = n * E * (V * 8 + 160)
    forward = EVAL_CHUNK * max(seqs) * (6 * d + 2 * cfg.model.d_ff) * 4 + n * EVAL_CHUNK * V * 8
    rows = len(seqs) * 7 * n * members * 200
    return sets + metrics + forward + rows


@cache
def eval_sequence(task, difficulty: int) -> int:
    return sample(task, difficulty, 2, torch.Generator().manual_seed(0)).tokens.shape[-1]


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


def check_fits(cfg: RunConfig, members: int, device: str, checkpointed: bool = False) -> MemoryEstimate:
    """The estimate, or ValueError with one sentence if it exceeds what the device has (before any allocation)."""
    est = estimate(cfg, members, device, checkpointed)
    have = available(device)
    if est.peak_bytes > have:
        raise ValueError(
            f"a group of {members} seed(s) needs about {est.peak_bytes / GIB:.1f} GiB on {device} and "
            f"{have / GIB:.1f} GiB are there; use a smaller train.group_size, train.batch_size or model, or "
            f'train.checkpoint "layer" (activations recomputed per layer).'
        )
    return est
