"""Issue 31's agreement counts, re-measured: the exit step E1's `--readout released` reads vs the released rule's.

    python dev/studies/e1-readout/readout_check.py --device cpu --out /tmp/readout-cpu.json      # seconds on a CPU
    python dev/studies/e1-readout/readout_check.py --device cuda --out readout-cuda.json
    python dev/studies/e1-readout/readout_check.py --released /tmp/ouro/modeling_ouro.py --out /tmp/readout-cpu.json \\
        --write-reference tests/data/released_exit_steps.json   # how the committed reference was made

Gate rows: `--rows` (20,000) rows of 8 gate logits drawn with seed `--seed` (0): a row bias uniform in
[-4, 12] plus N(0, 3) per step, from untouched gates to saturated ones; lam = sigmoid(logit) in the dtype on
the device. For float32 and bfloat16, each row and n = 1..8 (threshold 1.0, as released), the step read by
  project   engine.ouro.modeling.released_exit_steps, what `--readout released` reads;
  released  the released forward's rule: with --released FILE the released `OuroForCausalLM.forward` itself
            (FILE: its modeling_ouro.py; needs transformers), fed these gates with one-hot step states;
            without it, this script's transcription of that rule (the pdf in the dtype, torch.cumsum over
            the steps, the first step >= the threshold, else the last);
  stepwise  the rule `--readout released` used before issue 31: every partial sum rounded to the dtype;
  cpu_sums  sums accumulated as the CPU's cumsum does (float64 for float32, float32 for bf16), rounded;
and, on a GPU, `released` computed on the CPU: how often the device moves the released step. Also counted:
cumsum's outputs equal to step-by-step sums in the dtype (n(n+1)/2 entries per row and n), and the project
against the committed reference (tests/data/released_exit_steps.json: computed once on the CPU from the
released code; on another device disagreements there are the device's, not the project's).
Prints the counts and writes them as JSON to --out. Needs only torch (and this repository); no network.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from engine.ouro.modeling import released_exit_steps  # noqa: E402

REFERENCE = ROOT / "tests" / "data" / "released_exit_steps.json"
N_MAX = 8
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
SOURCE = "Eagle4398/ouro-nixpkgs@d4f815e modeling_ouro.py (ByteDance Ouro remote code), OuroForCausalLM.forward"
# the reference's (early_exit_threshold, early_exit_step) settings; the released config has 1.0 and no step
SETTINGS = [(1.0, None), (0.997, None), (0.9, None), (0.5, None), (None, None), (1.0, 0), (1.0, 2), (0.5, 6)]
SETTINGS += [(1.0, -1), (1.0, 8)]  # an early_exit_step outside 0..n-1 is ignored


def gate_logits(rows: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    bias = torch.rand(rows, 1, generator=g) * 16 - 4
    return bias + 3 * torch.randn(rows, N_MAX, generator=g)  # (rows, 8) float32


# ---------------------------------------------------------------- the rules compared


def transcribed_rule(logits: torch.Tensor, threshold: float | None, step: int | None) -> torch.Tensor:
    """(R, k) gate logits in the dtype -> (R,) 0-based step: the released forward's rule for k steps, written
    from its description, in its layout ((R, 1) positions, the pdf stacked on dim 2). Each step's gates are
    made contiguous first, as a forward's are: the CPU's float32 sigmoid rounds some values of a strided
    view differently (408 of 20,000 here)."""
    R, k = logits.shape
    if step is not None and 0 <= step < k:
        return torch.full((R,), step, device=logits.device)
    if threshold is None:
        return torch.full((R,), k - 1, device=logits.device)
    left, pdf = torch.ones(R, 1, dtype=logits.dtype, device=logits.device), []
    for t in range(k):
        lam = torch.sigmoid(logits[:, t, None].contiguous())  # (R, 1), one step's gates
        pdf.append(lam * left if t < k - 1 else left)
        left = left * (1.0 - lam)
    cum = torch.cumsum(torch.stack(pdf, dim=2), dim=2)
    mask = cum >= threshold
    first = torch.argmax(mask.float(), dim=2)
    first[~mask.any(dim=2)] = k - 1
    return first[:, 0]


def load_released(path: Path) -> types.ModuleType:
    """The released modeling_ouro.py, imported from `path`; its `from .configuration_ouro import OuroConfig`
    gets a stub (the exit rule reads no field of the config class)."""
    from transformers import PretrainedConfig

    package = types.ModuleType("ouro_released")
    package.__path__ = [str(path.parent)]
    config = types.ModuleType("ouro_released.configuration_ouro")
    config.OuroConfig = type("OuroConfig", (PretrainedConfig,), {"model_type": "ouro_released_stub"})
    sys.modules |= {"ouro_released": package, "ouro_released.configuration_ouro": config}
    spec = importlib.util.spec_from_file_location("ouro_released.modeling_ouro", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def released_forward_rule(module: types.ModuleType):
    """The released `OuroForCausalLM.forward` as a rule: (R, k) gate logits -> (R,) 0-based step. Its decoder
    is replaced by one that returns these gates and, as step t's state, the one-hot vector e_t, and its head
    by the identity, so the logits it returns name the step it read."""
    from transformers.modeling_outputs import BaseModelOutputWithPast

    def rule(logits: torch.Tensor, threshold: float | None, step: int | None) -> torch.Tensor:
        R, k = logits.shape
        eye = torch.eye(k, dtype=logits.dtype, device=logits.device)
        states = [eye[t].expand(R, 1, k) for t in range(k)]
        gates = [logits[:, t, None, None].contiguous() for t in range(k)]  # (R, 1, 1): batch R, one position

        def decoder(**_):
            return BaseModelOutputWithPast(last_hidden_state=states[-1]), states, gates

        host = types.SimpleNamespace(
            model=decoder, lm_head=torch.nn.Identity(), early_exit_threshold=threshold, early_exit_step=step
        )
        ids = torch.zeros(R, 1, dtype=torch.long, device=logits.device)
        out = module.OuroForCausalLM.forward(host, input_ids=ids, use_cache=False)
        return out.logits[:, 0].argmax(-1)

    return rule


def stepwise_rule(lam: torch.Tensor, threshold: float) -> torch.Tensor:
    """(k, R) -> (R,) 1-based: the rule before issue 31, every product and partial sum rounded to lam's dtype."""
    k = lam.shape[0]
    stop = torch.full(lam.shape[1:], k, dtype=torch.long, device=lam.device)
    cumulative, survive = torch.zeros_like(lam[0]), torch.ones_like(lam[0])
    for t in range(k):
        cumulative = cumulative + lam[t] * survive
        survive = survive * (1 - lam[t])
        stop = torch.where((cumulative >= threshold) & (stop == k), t + 1, stop)
    return stop


def pdf_of(lam: torch.Tensor) -> torch.Tensor:
    """(k, R) -> (R, k): the released exit pdf of k steps in lam's dtype."""
    left, pdf = torch.ones_like(lam[0]), []
    for t in range(lam.shape[0]):
        pdf.append(lam[t] * left if t < lam.shape[0] - 1 else left)
        left = left * (1.0 - lam[t])
    return torch.stack(pdf, dim=-1)


def cpu_sums_rule(lam: torch.Tensor, threshold: float) -> torch.Tensor:
    """(k, R) -> (R,) 1-based: the pdf's partial sums accumulated in a wider type, as the CPU's cumsum does."""
    pdf = pdf_of(lam)
    wide = torch.float64 if lam.dtype == torch.float32 else torch.float32
    reached = pdf.to(wide).cumsum(-1).to(lam.dtype) >= threshold
    return torch.where(reached.any(-1), reached.float().argmax(-1), pdf.shape[-1] - 1) + 1


def stepwise_sums(pdf: torch.Tensor) -> torch.Tensor:
    sums, total = [], torch.zeros_like(pdf[..., 0])
    for t in range(pdf.shape[-1]):
        total = total + pdf[..., t]
        sums.append(total)
    return torch.stack(sums, dim=-1)


# ---------------------------------------------------------------- the counts


def measure(device: str, rows: int, seed: int, rule, threshold: float = 1.0) -> dict:
    logits32 = gate_logits(rows, seed)
    out = {}
    for name, dtype in DTYPES.items():
        logits = logits32.to(dtype).to(device)
        lam = torch.sigmoid(logits).T.contiguous()  # (8, R)
        project = released_exit_steps(lam, threshold)  # (8, R), row n - 1
        c = dict.fromkeys(("project", "stepwise", "cpu_sums", "released_cpu"), 0)
        entries = {"cumsum_equals_stepwise_sums": 0, "cumsum_entries": 0}
        for n in range(1, N_MAX + 1):
            released = rule(logits[:, :n], threshold, None) + 1
            c["project"] += int((project[n - 1] == released).sum())
            c["stepwise"] += int((stepwise_rule(lam[:n], threshold) == released).sum())
            c["cpu_sums"] += int((cpu_sums_rule(lam[:n], threshold) == released).sum())
            if device != "cpu":
                on_cpu = rule(logits[:, :n].cpu(), threshold, None) + 1
                c["released_cpu"] += int((on_cpu == released.cpu()).sum())
            pdf = pdf_of(lam[:n])[:, None, :]  # (R, 1, n), the released layout
            entries["cumsum_equals_stepwise_sums"] += int((pdf.cumsum(2) == stepwise_sums(pdf)).sum())
            entries["cumsum_entries"] += pdf.numel()
        if device == "cpu":
            c.pop("released_cpu")
        out[name] = {"agree_with_released": c, "of": rows * N_MAX, **entries}
    return out


def check_reference(device: str) -> dict:
    """The project's steps on `device` against the committed reference (computed on the CPU)."""
    if not REFERENCE.exists():
        return {}
    data = json.loads(REFERENCE.read_text())
    out = {}
    for case in data["cases"]:
        dtype = DTYPES[case["dtype"]]
        lam = torch.sigmoid(torch.tensor(case["gate_logits"], dtype=dtype, device=device)).T.contiguous()
        agree = total = 0
        for run in case["runs"]:
            got = released_exit_steps(lam, run["early_exit_threshold"], run["early_exit_step"]).T.cpu()
            want = torch.tensor(run["steps"])
            agree, total = agree + int((got == want).sum()), total + want.numel()
        out[case["dtype"]] = {"agree": agree, "of": total}
    return out


def write_reference(path: Path, rule, rows: int, seed: int) -> None:
    """Gate rows and the step the released code reads for each (n = 1..8, every setting), on the CPU."""
    special = [
        [5.5] + [-0.405] * 7,  # bf16: pdf 0.99609375, 0.00156, 0.00094, ...: cumsum reaches 1.0 at step 3
        [0.0] * 8,  # untouched
        [30.0] * 8,  # saturated: exits at step 1
        [-30.0] * 8,  # never exits before the last step
        [100.0, -100.0] * 4,
        [-30.0, -30.0, 30.0, 30.0, -30.0, -30.0, -30.0, -30.0],
        [20.0] * 8,  # sigmoid(20) rounds to 1.0 in both dtypes
        [5.5] * 8,
        [4.6] * 8,  # lambda 0.99 every step
        [2.0, 2.0, 2.0, 2.0, 8.0, 8.0, 8.0, 8.0],
    ]
    logits32 = gate_logits(rows, seed)
    cases = []
    for name, dtype in DTYPES.items():
        logits = logits32.to(dtype)
        lam = torch.sigmoid(logits).T
        differ = torch.zeros(rows, dtype=torch.bool)
        for n in range(1, N_MAX + 1):
            differ |= stepwise_rule(lam[:n], 1.0) != rule(logits[:, :n], 1.0, None) + 1
        picked = torch.cat([torch.arange(48), 48 + torch.nonzero(differ[48:])[:48, 0]])
        chosen = torch.cat([torch.tensor(special, dtype=torch.float32).to(dtype), logits[picked]])
        runs = []
        for threshold, step in SETTINGS:
            steps = [rule(chosen[:, :n], threshold, step) + 1 for n in range(1, N_MAX + 1)]
            runs.append({"early_exit_threshold": threshold, "early_exit_step": step,
                         "steps": torch.stack(steps, 1).tolist()})  # fmt: skip
        cases.append({"dtype": name, "gate_logits": chosen.float().tolist(), "runs": runs})
    about = (
        "Gate logits (rows of 8, exactly representable in the dtype) and, for each setting and n = 1..8, the "
        "1-based step read by the released OuroForCausalLM.forward run on the CPU with n loop steps, these "
        "gates and one-hot step states; written by dev/studies/e1-readout/readout_check.py --write-reference"
    )
    meta = {"about": about, "source": SOURCE, "torch": torch.__version__, "device": "cpu", "seed": seed}
    path.write_text(json.dumps({**meta, "cases": cases}, separators=(",", ":")) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--out", type=Path, required=True, help="where to write the counts as JSON")
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--released", type=Path, help="the released modeling_ouro.py, to run its own forward")
    p.add_argument("--write-reference", type=Path, help="write the reference test data (CPU, needs --released)")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("readout_check: error: --device cuda, but torch sees no CUDA device.", file=sys.stderr)
        return 2
    if args.released is not None and not args.released.is_file():
        print(f"readout_check: error: --released {args.released} is not a file.", file=sys.stderr)
        return 2
    if args.write_reference is not None and args.released is None:
        print("readout_check: error: --write-reference needs --released (the released code).", file=sys.stderr)
        return 2
    start = time.time()
    rule = released_forward_rule(load_released(args.released)) if args.released else transcribed_rule
    if args.write_reference:
        write_reference(args.write_reference, rule, args.rows, args.seed)
    counts = measure(args.device, args.rows, args.seed, rule)
    result = {
        "device": args.device if args.device == "cpu" else f"cuda ({torch.cuda.get_device_name(0)})",
        "torch": torch.__version__,
        "released": f"the released forward ({args.released})" if args.released else "transcribed rule",
        "rows": args.rows,
        "seed": args.seed,
        "threshold": 1.0,
        "counts": counts,
        "reference": check_reference(args.device),
        "wall_time_s": round(time.time() - start, 2),
    }
    for name, c in counts.items():
        agree = ", ".join(f"{k} {v:,}" for k, v in c["agree_with_released"].items())
        print(f"{name}: steps equal to the released rule's, of {c['of']:,}: {agree}; cumsum outputs equal to "
              f"step-by-step sums: {c['cumsum_equals_stepwise_sums']:,} of {c['cumsum_entries']:,}")  # fmt: skip
    for name, c in result["reference"].items():
        print(f"{name}: the committed reference (released code, CPU): {c['agree']:,} of {c['of']:,} equal")
    print(f"{result['device']}, torch {result['torch']}, {result['released']}, {result['wall_time_s']} s")
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
