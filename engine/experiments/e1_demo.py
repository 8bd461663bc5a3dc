"""A small Ouro trained here on the probe's prompt tasks, at difficulties it cannot answer in one loop step:
E1's demonstration until the released weights are run. It is a demonstration, not a measurement of Ouro.

    python -m engine.experiments.e1_demo     # trains cached_results/e1-demo/, then E1 on it (both modes, n = 1..8):
                                   # cached_results/e1-demo.parquet and e1-demo.json
    python -m engine.experiments.e1_demo --probe-only      # E1 alone, on the checkpoint as it is; the same as
    loopscope ouro --model cached_results/e1-demo --difficulty chain=8,parity=12 --prompts 200 --loops 1-8

The model is engine.ouro.modeling's class at a small size (DEMO_CONFIG: the released sandwich layer, RoPE, untied
head, exit gate, T = total_ut_steps = 4; one layer per loop step, so one step is one attention and one MLP), run as
released: the boundary norm on (`norm`). The tokenizer is word-level, built here with `tokenizers` from the probe's
prompts (words, punctuation and newlines; spaces are dropped). It is saved with save_pretrained and probed through
AutoModelForCausalLM.from_pretrained, the loading path of the released weights.

Training (TRAIN): each step one batch, half `chain` prompts and half `parity` prompts, each half at one difficulty
drawn from the training range (chain 0-8 hops, parity 1-12 bits), left padded as the probe pads them. The loss is
Ouro's stage-1 objective (the exit gate trained with the rest), on the answer token only (the rest of a prompt is
random and carries no signal): with the gate's exit probabilities lam_t = sigmoid(gate(readout_t)), the exit
distribution p_t = lam_t prod_{j<t}(1 - lam_j) (the last step takes the remaining mass; modeling.exit_distribution),

    loss = mean over the batch of  sum_t p_t CE_t  -  entropy_weight * H(p),    H(p) = -sum_t p_t log p_t,

the expected cross-entropy over the exit distribution of the T steps minus an entropy bonus that keeps the exit
distribution from collapsing onto one step (entropy_weight = beta = 0.1).

The probe's difficulties (PROBE: chain 8 hops, parity 12 bits; the probe's defaults are 3 and 6) and the recipe
were chosen on the trained (`norm`) model's accuracy at n = 1 and n = T alone, never on the surgery: at the
defaults a one-layer step answers at n = 1 already. The chain is one chain (the probe's), so its answer is also the
root bit XOR the parity of its `not`s, a 9-term parity that one step partly computes. Six later candidates (D1-D6
in dev/LOG.md, each judged by a rule written before it ran: n = 1 within 0.43-0.57 and n = T >= 0.95 on both
tasks) were not adopted: the objective trains step 1 to answer too, so one step learns part of each task the
longer it trains, while n = T needs that training (a 16-hop chain with 12-bit parity after 6,000 steps: chain
0.465 / 0.980, parity 0.585 / 1.000 at n = 1 / T; with the probe's prompts held out, 0.490 / 0.930 and 0.575 /
1.000, so one step's edge on parity is not memorised strings). This recipe, with the hold-out below, meets the
rule at 3 of 5 seeds (0, the shipped one, and 2, 4; at 1 and 3 one step partly answers the chain: 0.615, 0.725).

Training never sees the prompts the demo is judged on (held_out: the probe's, 200 per task at seed 0 as `loopscope
ouro` draws them, and the training-time check's at EVAL_SEED, at the probe's difficulties): a training prompt among
them is replaced by an unseen one with the same answer, and training.json records how many were. Parity at 12 bits
has only 4,096 strings, so without this most of the probe's parity strings would be trained on. A probe with
another prompt count draws other prompts, which training may have seen. Everything is drawn from `--seed`: the
same seed and thread count give the same weights on the same machine.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.core.train import adamw, optimizer_step, warmup_cosine
from engine.experiments.e1_probe import TASKS, VARIABLES, make_prompts, option_token_ids, probe

DEFAULT_RESULTS = Path("cached_results")
NAME = "e1-demo"  # the checkpoint folder; its E1 tables are e1-demo.parquet and e1-demo.json beside it
DEMO_CONFIG = dict(
    hidden_size=64,
    intermediate_size=176,  # Ouro's ratio 5632 / 2048 = 2.75
    num_hidden_layers=1,
    num_attention_heads=4,
    total_ut_steps=4,
    max_position_embeddings=256,
)
TRAIN = dict(
    steps=3000,
    batch=64,
    lr=1e-3,
    warmup=100,
    min_lr_ratio=0.1,
    weight_decay=0.01,
    clip=1.0,
    entropy_weight=0.1,
    chain_hops=tuple(range(0, 9)),
    parity_bits=tuple(range(1, 13)),
    eval_every=250,
    eval_prompts=128,
)
PROBE = dict(  # the E1 run on the demo: what `loopscope ouro` is given
    difficulty={"chain": 8, "parity": 12},
    prompts=200,
    loops=list(range(1, 9)),
    readout="final",  # the answer at loop step n, as the study reads it (engine.experiments.e1_probe.READOUTS)
    dtype="float32",
)
EVAL_SEED = 4242  # the training-time check (never the probe's seed)


def build_tokenizer():
    """Word-level tokenizer over every word, punctuation mark and newline the probe's prompts can contain."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    split = pre_tokenizers.Split(Regex(r"\w+|[^\w\s]+|\n"), behavior="removed", invert=True)
    words = set(VARIABLES) | {"0", "1", "not"}
    for task in TASKS:
        for difficulty in range(1, 9):
            for pr in make_prompts(task, 4, seed=0, difficulty=difficulty):
                for text in (pr.prompt, *pr.options):
                    words.update(w for w, _ in split.pre_tokenize_str(text))
    vocab = {w: i for i, w in enumerate(["<|endoftext|>", "<unk>", *sorted(words)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = split
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", unk_token="<unk>", pad_token="<|endoftext|>"
    )


def build_model(tokenizer, seed: int):
    from engine.ouro.modeling import OuroConfig, OuroForCausalLM

    torch.manual_seed(seed)
    eos = tokenizer.eos_token_id
    config = OuroConfig(vocab_size=len(tokenizer), bos_token_id=eos, eos_token_id=eos, pad_token_id=eos, **DEMO_CONFIG)
    return OuroForCausalLM(config)


def held_out() -> frozenset[str]:
    """The prompts training never sees: the probe's (PROBE's count at seed 0, as `loopscope ouro` draws them) and
    the training-time check's (EVAL_SEED), at the probe's difficulties (no other difficulty gives the same text)."""
    return frozenset(
        pr.prompt
        for task, difficulty in PROBE["difficulty"].items()
        for seed, n in ((0, PROBE["prompts"]), (EVAL_SEED, TRAIN["eval_prompts"]))
        for pr in make_prompts(task, n, seed=seed, difficulty=difficulty)
    )


def unseen(task: str, n: int, seed: int, difficulty: int, held: frozenset[str]) -> tuple[list, int]:
    """make_prompts, with every held-out prompt replaced by a fresh one with the same answer (drawn from negative
    seeds, which nothing else uses); also the number replaced."""
    prompts, replaced = make_prompts(task, n, seed=seed, difficulty=difficulty), 0
    for i, pr in enumerate(prompts):
        k = 0
        while prompts[i].prompt in held:
            k += 1
            # two held-out prompts with one answer in one batch get the same replacement
            fresh = make_prompts(task, 2, seed=-(1000 * seed + k), difficulty=difficulty)
            prompts[i] = next(p for p in fresh if p.answer == pr.answer)
        replaced += k > 0
    return prompts, replaced


def batch_of(step: int, seed: int, rng: random.Random, size: int, held: frozenset[str]):
    """Half chain prompts, half parity prompts, each half at a difficulty drawn from TRAIN's range, none held out;
    also the number of held-out prompts replaced."""
    k, m = rng.choice(TRAIN["chain_hops"]), rng.choice(TRAIN["parity_bits"])
    base = 1_000_000 * (seed + 1) + step  # never 0, the probe's prompt seed
    chain, a = unseen("chain", size // 2, base, k, held)
    parity, b = unseen("parity", size // 2, base, m, held)
    return chain + parity, a + b


def encode(tokenizer, prompts):
    tokenizer.padding_side = "left"
    enc = tokenizer([p.prompt for p in prompts], return_tensors="pt", padding=True)
    opts = option_token_ids(tokenizer, prompts)
    target = opts[torch.arange(len(prompts)), torch.tensor([p.options.index(p.answer) for p in prompts])]
    return enc["input_ids"], enc["attention_mask"], target


def objective(out, target, entropy_weight: float):
    """sum_t p_t CE_t - w H(p), averaged over the batch; also the per-step CE for the log."""
    ce = torch.stack([F.cross_entropy(lg, target, reduction="none") for lg in out.logits])  # (T, B)
    p = out.exit_probs
    entropy = -(p * p.clamp_min(1e-12).log()).sum(0)
    return ((p * ce).sum(0) - entropy_weight * entropy).mean(), ce.mean(1).detach()


def evaluate(model, tokenizer, n_prompts: int) -> dict:
    model.eval()
    out = {}
    for task in TASKS:
        prompts = make_prompts(task, n_prompts, seed=EVAL_SEED, difficulty=PROBE["difficulty"][task])
        df = probe(model, tokenizer, prompts, model.config.total_ut_steps)
        out[task] = [round(v, 3) for v in df["greedy_acc"]]
    model.train()
    return out


def train(
    out_dir: Path = DEFAULT_RESULTS / NAME,
    seed: int = 0,
    steps: int | None = None,
    threads: int = 1,
    progress: bool = True,
) -> dict:
    from tqdm.auto import tqdm

    torch.set_num_threads(threads)
    steps = TRAIN["steps"] if steps is None else steps
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed).train()
    T = model.config.total_ut_steps
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    opt = adamw(decay, rest, TRAIN["lr"], TRAIN["weight_decay"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(TRAIN["warmup"], steps, TRAIN["min_lr_ratio"]))
    rng = random.Random(f"demo:{seed}")
    held, replaced = held_out(), 0
    log, evals, start = [], [], time.time()
    bar = tqdm(range(steps), desc="train e1-demo", unit="step", disable=not progress, mininterval=2)
    for step in bar:
        prompts, r = batch_of(step, seed, rng, TRAIN["batch"], held)
        replaced += r
        ids, mask, target = encode(tokenizer, prompts)
        out = model.loop_forward(ids, mask, n_loops=T, boundary="norm")
        loss, ce = objective(out, target, TRAIN["entropy_weight"])
        optimizer_step(loss, opt, sched, list(model.parameters()), TRAIN["clip"], per_member=False)
        log.append({"step": step, "loss": round(loss.item(), 5), "ce_per_step": [round(v, 4) for v in ce.tolist()]})
        if (step + 1) % TRAIN["eval_every"] == 0 or step + 1 == steps:
            acc = evaluate(model, tokenizer, TRAIN["eval_prompts"])
            evals.append({"step": step + 1, "greedy_acc_per_step": acc, "wall_s": round(time.time() - start, 1)})
            bar.set_postfix(loss=f"{loss.item():.3f}", chain=acc["chain"][-1], parity=acc["parity"][-1])
            if not progress:
                print(json.dumps(evals[-1]), flush=True)
    wall = time.time() - start
    model.eval()
    save(model, tokenizer, out_dir)
    n_params = sum(p.numel() for p in model.parameters())
    record = {
        "what": "E1 demonstration: a small Ouro-architecture model trained here on the probe's prompt tasks",
        "parameters": n_params,
        "config": DEMO_CONFIG,
        "train": {k: list(v) if isinstance(v, tuple) else v for k, v in TRAIN.items()} | {"steps": steps},
        "objective": "answer token only; sum_t p_t CE_t - entropy_weight * H(p) over the T = 4 steps (Ouro stage 1)",
        "boundary": "norm (as released)",
        "probe": PROBE,
        "held_out": {
            "what": "prompts never trained on: the probe's (seed 0) and the training-time check's (seed "
            f"{EVAL_SEED}), at the probe's difficulties; a probe with another prompt count draws other prompts",
            "prompts": len(held),
            "replaced_in_training": replaced,
        },
        "seed": seed,
        "threads": threads,
        "wall_time_s": round(wall, 1),
        "evals": evals,
        "loss_curve": log[:: max(1, len(log) // 200)],
    }
    (out_dir / "training.json").write_text(json.dumps(record, indent=1))
    return record


def save(model, tokenizer, out_dir: Path) -> None:
    """save_pretrained (model + tokenizer), then reload through the Auto classes and check the logits agree."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    back = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(out_dir)
    prompts = make_prompts("chain", 4, seed=1)
    ids, mask, _ = encode(tok, prompts)
    with torch.inference_mode():
        a, b = model.loop_forward(ids, mask, n_loops=4), back.loop_forward(ids, mask, n_loops=4)
    if not torch.equal(a.logits, b.logits):
        raise RuntimeError("the reloaded demo model does not reproduce the trained one's logits")


def probe_demo(results: Path, prompts: int = PROBE["prompts"]) -> int:
    """E1 on the demo checkpoint in `results`: `loopscope ouro` with PROBE's settings, on the CPU."""
    from engine.core.store import Store
    from engine.experiments import e1

    args = argparse.Namespace(
        model=str(results / NAME), task="chain,parity", prompts=prompts, loops=PROBE["loops"],
        difficulty=PROBE["difficulty"], readout=PROBE["readout"], dtype=PROBE["dtype"], dry_run=False,
    )  # fmt: skip
    return e1.cmd_ouro(args, e1.validate(args), "cpu", Store(results))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.experiments.e1_demo", description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS, help=f"writes {NAME}/ and {NAME}.* here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None, help=f"default {TRAIN['steps']}")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steady on a shared machine)")
    parser.add_argument(
        "--prompts",
        type=int,
        default=PROBE["prompts"],
        help=f"probe prompts per task (the default {PROBE['prompts']} are held out of training; others may be seen)",
    )
    parser.add_argument("--probe-only", action="store_true", help=f"probe {NAME}/ as it is, without training")
    args = parser.parse_args(argv)
    if not args.probe_only:
        record = train(args.results / NAME, args.seed, args.steps, args.threads)
        last = record["evals"][-1]
        print(
            f"{NAME}: {record['parameters']:,} parameters, {record['wall_time_s']} s; greedy accuracy at n = 1..4 "
            f"({TRAIN['eval_prompts']} prompts, chain {PROBE['difficulty']['chain']} hops, parity "
            f"{PROBE['difficulty']['parity']} bits): chain {last['greedy_acc_per_step']['chain']}, "
            f"parity {last['greedy_acc_per_step']['parity']}; saved to {args.results / NAME}"
        )
    return probe_demo(args.results, args.prompts)


if __name__ == "__main__":
    sys.exit(main())
