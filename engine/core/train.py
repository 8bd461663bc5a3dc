"""Training at the trained loop count, many seeds at once.

A group of seeds trains as one ensemble (engine.core.model's leading member dimension): one batched
forward and backward, one AdamW over stacked weights. Every piece that could couple seeds is kept
per member: initial weights (own generator), data (own generator), loss (summed, so each member's
gradient is its own), gradient clipping (per-member norm). AdamW is elementwise, so a member's
update does not see its neighbours either. In floating point one thing does reach a member: the
group's size (batched kernels block, and so round, differently for some sizes), which training
amplifies. A seed's result is bit-reproducible for a given group size, whichever seeds share the
group and however many threads run it (dev/LOG.md, 2026-12-03), not across group sizes: so the config
fixes each seed's group (RunConfig.group). Training batches never hold a held-out example (tasks.train_batch).
The loop count of each step is the trained budget T, or drawn from `train.loops` (loop_schedule) by a schedule
that, like the difficulty schedule, is the same for every seed, so that a group still batches into one tensor.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from tqdm.auto import tqdm

from engine.core import tasks
from engine.core.model import LoopedLM, build
from engine.core.presets import RunConfig, loop_schedule
from engine.core.store import write_safetensors
from engine.errors import UsageError


class NonFiniteLoss(UsageError):
    """A training whose loss became NaN or infinite: it stops there and nothing of its group is stored."""

    def __init__(self, cfg: RunConfig, seeds: list[int], step: int, loss: torch.Tensor):
        values = loss.tolist()
        i = next(i for i, v in enumerate(values) if not math.isfinite(v))
        group = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {seeds[0]}-{seeds[-1]}"
        super().__init__(
            f"training diverged: the loss of seed {seeds[i]} became {values[i]} at step {step} of {cfg.train.steps} "
            f"(lr {cfg.train.lr:g}), so nothing of its group ({group}) was stored; lower train.lr or "
            "train.weight_decay, or lengthen train.warmup_steps."
        )
        self.step, self.seed = step, seeds[i]


@dataclass
class TrainResult:
    model: LoopedLM  # the trained ensemble, one member per seed, on the device it trained on
    losses: torch.Tensor  # (steps, S) training loss of each member at each step
    wall_s: float
    device: str
    resumed_from: int = 0  # the step a checkpoint had reached (0: trained from scratch)
    policy: str = ""  # dtype_policy(): how it trained
    peak_memory_gib: float | None = None  # measured on a GPU (torch.cuda.max_memory_allocated)
    estimated_memory_gib: float | None = None


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but no CUDA device is visible; use --device cpu.")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, got {device!r}.")
    return device


def warmup_cosine(warmup: int, steps: int, min_ratio: float) -> Callable[[int], float]:
    """Linear warmup, then cosine decay to min_ratio of the peak (a LambdaLR factor)."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return factor


def lr_lambda(cfg: RunConfig) -> Callable[[int], float]:
    return warmup_cosine(cfg.train.warmup_steps, cfg.train.steps, cfg.train.min_lr_ratio)


def adamw(decay: list, no_decay: list, lr: float, weight_decay: float, fused: bool | None = None) -> torch.optim.AdamW:
    """AdamW as every loop here uses it: weight decay on matrices only, betas (0.9, 0.95); the fused CUDA kernel
    on a GPU (one launch for every tensor), the multi-tensor one on the CPU (whose rounding the shipped runs have).
    fused: the fused kernel (True) or the multi-tensor one (False) whatever the device (CPU_BF16_FUSED_ADAMW)."""
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    on_gpu = all(p.is_cuda for p in decay + no_decay)
    fast = {"fused": True} if (on_gpu if fused is None else fused) else {"foreach": True}
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=(0.9, 0.95), **fast)


def dtype_policy(device: str, is_compiled: bool, precision: str = "fp32") -> str:
    """How a device trains and evaluates, as manifests record it (train.precision: the CPU's; a GPU is bf16 always)."""
    if device == "cuda":
        how = "torch.compile per decoder layer (dynamic shapes), " if is_compiled else ""
        return (f"cuda: {how}bf16 autocast for matmuls and attention, fp32 weights and AdamW (fused); evaluation "
                "fp32 with TF32 matmuls, the group in one forward")  # fmt: skip
    if precision == "bf16":
        how = ", torch.compile" if is_compiled else ""
        opt = "fused" if CPU_BF16_FUSED_ADAMW else "foreach"
        return (f"cpu: bf16 autocast for matmuls and attention (SDPA math backend){how}, fp32 weights, AdamW "
                f"({opt}) state, loss and evaluation")  # fmt: skip
    return f"cpu: fp32 throughout{', torch.compile' if is_compiled else ''}"


# `auto` precision (resolve_precision): bf16 only on a CPU with native bf16 and for a model of at least this many
# parameters (one member). Measured 2026-12-05 on a 2-core Xeon with AMX (amx_bf16, avx512_bf16), a whole training
# step at the hardest batch of 64, fp32 time / bf16 time in one process (`loopscope bench --only precision`), the
# machine loaded by other work (load 4-16): the `cpu` preset's model (105,792 parameters) 1.38x (16 seeds, 2 threads)
# and 1.39x (4 seeds, 1 thread), but 0.83x on a quieter machine with neither lever below (issue 44): not a sure gain;
# E5's 1.6M rung (1,627,392) 1.51x (1 seed, 1 thread); the paper's 19M model 2.30x (1 seed, 1 thread; 1.48x with
# neither lever, issue 44).
# So the line sits between them, where every measurement agrees that bf16 pays.
AUTO_BF16_MIN_PARAMS = 1_000_000
# AdamW's fused CPU kernel in bf16 training (fp32 keeps foreach: the shipped runs' rounding). Measured beside it
# (foreach time / fused time of the whole bf16 step, `cpu` preset's model): 1.08x (16 seeds), 1.04x (4 seeds)
CPU_BF16_FUSED_ADAMW = True
FINITE_EVERY = 25  # on a GPU, the losses come to the host (and are checked) every this many steps (train_group)
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of a CPU that multiplies bf16 natively


def cpu_flags() -> set[str]:
    """This CPU's feature flags (/proc/cpuinfo; empty where there is none, e.g. macOS)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def resolve_precision(asked: str, cfg: RunConfig, device: str = "cpu") -> tuple[str, str]:
    """train.precision for `asked` (fp32, bf16 or auto) on `device`, and why. auto: bf16 only on a CPU that has
    native bf16 (CPU_BF16_FLAGS) and for a model large enough to gain (AUTO_BF16_MIN_PARAMS); fp32 on a GPU (it
    trains under bf16 autocast whatever the field says, and its run keys stay those of the GPU study)."""
    if asked in ("fp32", "bf16"):
        return asked, f"{asked} as asked"
    if asked != "auto":
        raise ValueError(f"precision must be fp32, bf16 or auto, got {str(asked)[:40]!r}.")
    if device == "cuda":
        return "fp32", "a GPU trains under bf16 autocast whatever train.precision says, so the key keeps fp32"
    native = sorted(set(CPU_BF16_FLAGS) & cpu_flags())
    if not native:
        return "fp32", (f"this CPU has no native bf16 ({' or '.join(CPU_BF16_FLAGS)} is not among its flags): bf16 "
                        "would be emulated, slower than fp32")  # fmt: skip
    n = cfg.model.n_params
    if n < AUTO_BF16_MIN_PARAMS:
        return "fp32", (f"the model has {n:,} parameters, below the {AUTO_BF16_MIN_PARAMS:,} at which bf16 pays on "
                        "this kind of CPU: its matmuls are too small to gain")  # fmt: skip
    return "bf16", f"this CPU has native bf16 ({', '.join(native)}) and the model has {n:,} parameters"


def compile_wanted(device: str) -> bool:
    """torch.compile on a GPU (fused norms, RoPE and SwiGLU; one compilation for every sequence length), not on
    the CPU (where the shipped runs were made eager); $LOOPSCOPE_COMPILE=0 or 1 overrides."""
    env = os.environ.get("LOOPSCOPE_COMPILE")
    return env == "1" if env in ("0", "1") else device == "cuda"


def compiled(model: LoopedLM, backend: str = "inductor") -> LoopedLM:
    """The model with each decoder layer compiled (Inductor fuses its norms, RoPE, SwiGLU and casts): the layers
    share one graph, so one compilation (dynamic shapes: every sequence length and group size) serves every layer
    and loop step, in seconds rather than the minutes a whole unrolled loop takes. Weights and names unchanged.
    The group size is the leading dimension of the stacked weights, and Dynamo keeps parameters' shapes static by
    default: one graph per group size (4, 16, 2 members: 3 graphs). With parameters' shapes dynamic too, one graph
    serves every group size and width (tests/test_gpu_engine.py, counted with the eager backend)."""
    compile_cache()
    torch._dynamo.config.force_parameter_static_shapes = False
    if os.environ.get("LOOPSCOPE_COMPILE_FAIL") == "1":  # a compile that fails, on demand (the session's fallback)
        backend = failing_backend
    for layer in model.layers:
        layer.compile(dynamic=True, backend=backend)
    return model


def failing_backend(graph, example_inputs):
    """What $LOOPSCOPE_COMPILE_FAIL=1 compiles with: the first compiled forward raises, as a compile that fails on a
    device would (dev/checks/gpu-session.sh then goes on eager)."""
    raise RuntimeError("a compile failure, simulated ($LOOPSCOPE_COMPILE_FAIL=1)")


def gpu_determinism() -> None:
    """What torch offers to make a GPU training repeat itself, set before one (the CPU's training is left as it is):
    deterministic algorithms where an op has one (a warning where it has none), cuDNN without autotuning, Inductor
    without choosing kernels by timing them, cuBLAS with a fixed workspace (read when its handle is made)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = False, True
    import torch._inductor.config as inductor

    if hasattr(inductor, "deterministic"):  # where this torch has it
        inductor.deterministic = True


def compile_cache() -> None:
    """Keep Inductor's compiled kernels across processes (a second run of a shape skips most of the compile)."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path.home() / ".cache" / "loopscope" / "inductor"))
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")


def optimizer_step(loss: torch.Tensor, opt, sched, params: list, grad_clip: float, per_member: bool = True) -> None:
    """The one training step of training, refits and the E1 demonstration: backward of a scalar loss, gradient
    clipping (per ensemble member, or over the whole model), the optimizer, the schedule."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if per_member:
        clip_per_member(params, grad_clip)
    else:
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
    opt.step()
    sched.step()


def member_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of each member over its supervised positions (and readout steps).

    logits (k, S, B, T, V), targets (S, B, T) -> (S,)
    """
    k, S = logits.shape[:2]
    tgt = targets.expand(k, *targets.shape)
    ce = F.cross_entropy(logits.float().flatten(0, -2), tgt.flatten(), ignore_index=tasks.IGNORE, reduction="none")
    ce = ce.view(k, S, -1).transpose(0, 1).flatten(1)  # (S, k*B*T)
    counts = (tgt != tasks.IGNORE).transpose(0, 1).flatten(1).sum(1)
    return ce.sum(1) / counts


def member_norms(grads: list[torch.Tensor]) -> torch.Tensor:
    """(S,) gradient norm of each member over every tensor. On the CPU the sum of squares tensor by tensor, as every
    shipped run clipped; on a GPU one multi-tensor launch (torch._foreach_norm over each tensor's member slices, the
    same norm up to rounding and still per member: a member's norm reads none of its neighbours)."""
    S = grads[0].shape[0]
    if grads[0].is_cuda:
        norms = torch._foreach_norm([g[i].float() for g in grads for i in range(S)])  # fp32 grads: .float() is a view
        return torch.stack(norms).view(len(grads), S).pow(2).sum(0).sqrt()
    return torch.stack([g.float().pow(2).flatten(1).sum(1) for g in grads]).sum(0).sqrt()


def clip_per_member(params: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """clip_grad_norm_ applied to each member separately; returns the (S,) pre-clip norms. The scaling is one
    multi-tensor op (torch._foreach_mul_; bit-identical to scaling tensor by tensor, tests/test_gpu_engine.py)."""
    grads = [p.grad for p in params]
    norms = member_norms(grads)
    coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    torch._foreach_mul_(grads, [coef.view(-1, *[1] * (g.dim() - 1)).to(g.dtype) for g in grads])
    return norms


# ---------------------------------------------------------------- checkpoints: resume after a crash


def save_checkpoint(path: Path, cfg: RunConfig, seeds: list[int], done: int, model, opt, sched, generators, losses):
    """Everything the next step depends on, in one safetensors file written atomically: weights, AdamW
    moments, every seed's data generator and the losses so far as tensors; the step, the optimizer's
    hyperparameters and the scheduler's counters as JSON in the header. No pickle."""
    opt_state = opt.state_dict()
    tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
    tensors |= {f"opt.{i}.{name}": v for i, s in opt_state["state"].items() for name, v in s.items()}
    tensors |= {f"generator.{i}": g.get_state() for i, g in enumerate(generators)}
    tensors["losses"] = losses[:done]
    meta = {
        "step": done,
        "config": cfg.to_dict(),
        "seeds": list(seeds),
        "param_groups": opt_state["param_groups"],
        "scheduler": sched.state_dict(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_safetensors(path, tensors, metadata={"loopscope": json.dumps(meta)})


def load_checkpoint(path: Path, cfg: RunConfig, seeds: list[int], model, opt, sched, generators, losses) -> int:
    """Restore a checkpoint of this very config and seed group in place; return its step (0 if none fits). Everything
    is checked before a weight is copied (checkpoint_fault): a checkpoint that is unreadable, or whose header or
    tensors are not what this training saves at the step it names (a file made by hand, a step its optimizer, its
    scheduler and its losses did not reach), is not resumed: the training starts at step 0 and replaces it at its
    first save. A file that breaks while its weights are copied is removed (UsageError: run the command again)."""
    if not path.is_file():
        return 0
    copied = False
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads(f.metadata()["loopscope"])
            ours = isinstance(meta, dict) and meta.get("seeds") == list(seeds)
            if not ours or meta.get("config") != json.loads(json.dumps(cfg.to_dict())):
                return 0  # another run's checkpoint (a hash collision or a hand-copied file): not ours to resume
            wrong = checkpoint_fault(f, meta, cfg, model, opt, sched, generators)
            if wrong:
                raise ValueError(wrong)
            tensors = {k: f.get_tensor(k) for k in f.keys() if not k.startswith("model.")}
            steps = {float(v) for k, v in tensors.items() if k.startswith("opt.") and k.endswith(".step")}
            if steps != {meta["step"]} or not torch.isfinite(tensors["losses"]).all():
                raise ValueError(f"its optimizer or losses are not at step {meta['step']}")
            with torch.no_grad():  # one tensor at a time: no second copy of the weights in memory
                for k, v in model.state_dict().items():
                    copied = True
                    v.copy_(f.get_tensor(f"model.{k}"))
    except Exception as e:  # unreadable, or not this training's: train from scratch rather than fail
        if copied:  # the fresh weights are partly overwritten: starting at 0 would not be this seed's training
            path.unlink(missing_ok=True)
            raise UsageError(f"checkpoint {path} broke while it was read ({type(e).__name__}); it was removed: run the "
                             "command again (the training starts at step 0).") from e  # fmt: skip
        why = str(e)[:120] if isinstance(e, ValueError) and str(e) else type(e).__name__
        print(f"loopscope: checkpoint {path} is unreadable ({why}); starting at step 0.", file=sys.stderr)
        return 0
    state: dict[int, dict] = {}
    for k, v in tensors.items():
        if k.startswith("opt."):
            _, i, name = k.split(".", 2)
            state.setdefault(int(i), {})[name] = v
    groups = [dict(g, betas=tuple(g["betas"])) for g in meta["param_groups"]]
    opt.load_state_dict({"state": state, "param_groups": groups})
    sched.load_state_dict(meta["scheduler"])
    for i, g in enumerate(generators):
        g.set_state(tensors[f"generator.{i}"])
    done = meta["step"]
    losses[:done] = tensors["losses"]
    return done


ADAMW_STATE = ("exp_avg", "exp_avg_sq", "step")  # what AdamW keeps per parameter (no amsgrad)


def checkpoint_fault(f, meta: dict, cfg: RunConfig, model, opt, sched, generators) -> str | None:
    """None if an open checkpoint `f` (with its header `meta`, of this config and seeds) holds what save_checkpoint
    writes for this model, optimizer, scheduler and generators at the step it names, shape for shape, else what is
    not: a step within the training; the weights' names, shapes and dtypes; AdamW's state for every parameter; the
    optimizer's groups and the scheduler's state with the fresh ones' fields (only the learning rate and the step
    counters may differ); one generator state per seed; the losses of every step so far."""
    step, total = meta.get("step"), cfg.train.steps
    if not isinstance(step, int) or isinstance(step, bool) or not 0 < step <= total:
        return f"its step is not one of 1..{total}"
    shapes = {n: (f.get_slice(n).get_shape(), f.get_slice(n).get_dtype()) for n in f.keys()}
    want = {f"model.{k}": (list(v.shape), v.dtype) for k, v in model.state_dict().items()}
    params = [p for g in opt.param_groups for p in g["params"]]
    want |= {f"opt.{i}.{n}": ([] if n == "step" else list(p.shape), torch.float32)
             for i, p in enumerate(params) for n in ADAMW_STATE}  # fmt: skip
    want |= {f"generator.{i}": (list(g.get_state().shape), torch.uint8) for i, g in enumerate(generators)}
    want["losses"] = ([step, len(generators)], torch.float32)
    dtype = {torch.float32: "F32", torch.bfloat16: "BF16", torch.uint8: "U8"}
    if set(shapes) != set(want) or any(shapes[n] != (s, dtype.get(d)) for n, (s, d) in want.items()):
        return "its tensors are not this training's"
    fresh = json.loads(json.dumps(opt.state_dict()["param_groups"]))
    groups = meta.get("param_groups")
    if not isinstance(groups, list) or len(groups) != len(fresh) or not all(
        isinstance(g, dict) and g.keys() == h.keys() and all(g[k] == h[k] for k in h if k != "lr")
        and isinstance(g["lr"], float) and math.isfinite(g["lr"]) for g, h in zip(groups, fresh, strict=False)
    ):  # fmt: skip
        return "its optimizer's groups are not this training's"
    counters = ("last_epoch", "_step_count", "_last_lr")
    state, fresh = meta.get("scheduler"), json.loads(json.dumps(sched.state_dict()))
    if not isinstance(state, dict) or state.keys() != fresh.keys() or state["last_epoch"] != step:
        return f"its scheduler is not at step {step}"
    last = state["_last_lr"]
    rates = isinstance(last, list) and len(last) == len(fresh["_last_lr"]) and all(type(x) is float for x in last)
    if any(state[k] != fresh[k] for k in fresh if k not in counters) or state["_step_count"] != step + 1 or not rates:
        return f"its scheduler is not at step {step}"
    return None


def checkpoint_header(path: Path) -> dict:
    """A checkpoint's JSON header (step, config, seeds; save_checkpoint's `meta`) without reading its tensors: what
    `loopscope list` shows of a training killed midway. ValueError (what is wrong) where the file is not a readable
    checkpoint or its header not one save_checkpoint writes (a config RunConfig reads, seeds, a step within its
    training)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {})["loopscope"])
    except Exception as e:  # safetensors' errors for a file that is not one, JSON's, a missing header
        raise ValueError(f"not a readable checkpoint ({type(e).__name__})") from None
    if not isinstance(meta, dict):
        raise ValueError("its header is not a JSON object")
    try:
        total = RunConfig.from_dict(meta.get("config")).train.steps
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise ValueError(f"its config cannot be read ({str(e)[:80]})") from None
    seeds, step = meta.get("seeds"), meta.get("step")
    if not isinstance(seeds, list) or not seeds or not all(type(s) is int for s in seeds):
        raise ValueError("its seeds are not a list of seeds")
    if type(step) is not int or not 0 <= step <= total:
        raise ValueError(f"its step is not one of 0..{total}")
    return meta


def train_group(
    cfg: RunConfig,
    seeds: list[int],
    device: str = "cpu",
    progress: bool = True,
    checkpoint_path: Path | None = None,
    checkpoint_every: int = 0,
    on_step: Callable[[int, int, float], None] | None = None,
    compile: bool | None = None,
    check_every: int = 0,
) -> TrainResult:
    """Train one group of seeds. With checkpoint_path, resume from it if it holds this run, and save it
    every checkpoint_every steps; on_step(steps done, total steps, mean loss) is called after each step.
    compile (default: compile_wanted) runs the forward through torch.compile (dynamic shapes, one compilation for
    every sequence length): worth it on a GPU, not on 2 CPU cores (docs/performance.md). The estimated peak memory
    is printed first, and a group that cannot fit ends with ValueError before anything is allocated.
    check_every (default: every step on the CPU, FINITE_EVERY on a GPU): the losses stay on the device and are copied
    to the host, and checked for NaN or infinity, every this many steps (and before a checkpoint and at the end), so a
    GPU step never waits for the host; a diverged loss still stops the training with the step it diverged at named
    (the steps run past it are thrown away with the group). on_step sees the mean loss of the last step copied."""
    from engine.core.memory import GIB, check_fits

    device = resolve_device(device)
    if device == "cuda":
        gpu_determinism()
    est = check_fits(cfg, len(seeds), device, checkpoint_path is not None and checkpoint_every > 0)
    if progress:
        print(f"loopscope: {est.sentence(device)}.", file=sys.stderr)
    t0 = time.perf_counter()
    model = build(cfg.model, seeds).to(device)
    compile = compile_wanted(device) if compile is None else compile
    forward = compiled(model) if compile else model
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    decay = [p for p in model.parameters() if p.dim() == 3]  # matrices and embeddings
    no_decay = [p for p in model.parameters() if p.dim() != 3]  # RMSNorm gains
    t = cfg.train
    cpu_bf16 = device == "cpu" and t.precision == "bf16"  # fp32 on the CPU: exactly as the shipped runs trained
    opt = adamw(decay, no_decay, t.lr, t.weight_decay, fused=CPU_BF16_FUSED_ADAMW if cpu_bf16 else None)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg))
    generators = [tasks.train_generator(s) for s in seeds]
    schedule = tasks.difficulty_schedule(cfg.task, t.steps)
    loops = loop_schedule(cfg.train_loops, t.steps)
    params = list(model.parameters())
    losses = torch.empty(t.steps, len(seeds))
    held = torch.empty(t.steps, len(seeds), device=device)  # each step's losses, on the device until copied
    every = check_every or (FINITE_EVERY if device == "cuda" else 1)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda" or cpu_bf16)
    start = 0
    if checkpoint_path is not None:
        start = load_checkpoint(Path(checkpoint_path), cfg, seeds, model, opt, sched, generators, losses)

    synced = [start, float("nan")]  # steps copied to the host and checked; the last one's mean loss

    def sync(upto: int) -> None:
        if upto <= synced[0]:
            return
        losses[synced[0] : upto] = held[synced[0] : upto].cpu()
        bad = (~torch.isfinite(losses[synced[0] : upto]).all(1)).nonzero()
        if len(bad):  # diverged: stop, store nothing (the caller gets one sentence naming the first such step)
            first = synced[0] + int(bad[0])
            raise NonFiniteLoss(cfg, seeds, first + 1, losses[first])
        synced[:] = [upto, float(losses[upto - 1].mean())]

    bar = tqdm(range(start, t.steps), desc=f"train {cfg.task.name} x{len(seeds)} seeds", disable=not progress)
    for step in bar:
        batches = [tasks.train_batch(cfg.task, schedule[step], t.batch_size, g) for g in generators]
        tokens, targets = (torch.stack([getattr(b, f) for b in batches]) for f in ("tokens", "targets"))
        if device == "cuda":  # pinned: the copy runs beside the step before it, the host does not wait
            tokens, targets = tokens.pin_memory(), targets.pin_memory()
        tokens, targets = tokens.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        with autocast:
            out = forward(tokens, loops[step], all_positions=True, readout_steps="all" if t.loss_over_steps else "last",
                          recompute=t.checkpoint == "layer")  # fmt: skip
        loss = member_losses(out.logits, targets)
        optimizer_step(loss.sum(), opt, sched, params, t.grad_clip)  # each member's gradient is its own loss's
        held[step] = loss.detach().float()
        done = step + 1
        # the last step too: a group killed during its evaluation then resumes at the evaluation, training nothing
        saving = (
            checkpoint_path is not None and checkpoint_every > 0 and (done % checkpoint_every == 0 or done == t.steps)
        )
        if done % every == 0 or done == t.steps or saving:
            sync(done)
        if step % 50 == 0 or step == t.steps - 1:
            bar.set_postfix(loss=f"{synced[1]:.4f}")
        if saving:
            save_checkpoint(Path(checkpoint_path), cfg, seeds, done, model, opt, sched, generators, losses)
        if on_step is not None:
            on_step(done, t.steps, synced[1])
    peak = torch.cuda.max_memory_allocated() / GIB if device == "cuda" else None
    policy = dtype_policy(device, compile, t.precision)
    return TrainResult(model, losses, time.perf_counter() - t0, device, start, policy, peak, est.peak_bytes / GIB)
