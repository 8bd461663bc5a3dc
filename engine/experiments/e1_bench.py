"""What E1 costs on this CPU: a random-weight Ouro-1.4B read out at n loop steps, by dtype.

python -m engine.experiments.e1_bench            # prints seconds per prompt for float32 and bfloat16
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from engine.experiments import e1_probe as P


def local_bpe_tokenizer(vocab_size: int = 600):
    """A byte-level BPE built here in the style of Ouro's (SmolLM) tokenizer: digits split, spaces as 'Ġ'."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    corpus = [
        "The variable x is set to the value of y, and the answer is the number that results.",
        "What is the value? Answer 0 or 1. Is the number of ones even or odd? Bits are digits.",
    ] * 50 + [p.prompt for t in P.TASKS for p in P.make_prompts(t, 40, seed=99)]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def _measure_one(dtype_name: str, n_loops: int, prompts: int, batch: int, threads: int, difficulty: int) -> dict:
    """In this process: build a random Ouro-1.4B in `dtype`, time forwards; peak RSS of the whole process."""
    import resource

    from engine.ouro.modeling import OuroConfig, OuroForCausalLM

    torch.set_num_threads(threads)
    dtype = getattr(torch, dtype_name)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    tokenizer = local_bpe_tokenizer()
    texts = [p.prompt for p in P.make_prompts("chain", max(prompts, batch), seed=1, difficulty=difficulty)]
    enc = [tokenizer(t, return_tensors="pt")["input_ids"] for t in texts]
    config = OuroConfig()  # the released Ouro-1.4B sizes
    t0 = time.time()
    with torch.device("meta"):
        model = OuroForCausalLM(config)
    model = model.to_empty(device="cpu").to(dtype).eval()  # allocate once, in the target dtype
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layernorm" in name or name == "model.norm.weight":
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32).mul_(0.02).to(dtype))
    build_s = time.time() - t0
    n_params = sum(p.numel() for p in model.parameters())
    out = {"dtype": dtype_name, "threads": threads, "parameters": n_params, "build_s": round(build_s, 1)}

    def timed(*inputs) -> float:
        t0 = time.perf_counter()
        model.loop_forward(*inputs, n_loops=n_loops)
        return time.perf_counter() - t0

    with torch.inference_mode():
        model.loop_forward(enc[0][:, :8], n_loops=1)  # warm-up (kernel selection), not timed
        single = sorted(timed(ids) for ids in enc[:prompts])
        pad = tokenizer.eos_token_id
        T = max(e.shape[1] for e in enc[:batch])
        ids = torch.full((batch, T), pad)
        mask = torch.zeros(batch, T, dtype=torch.long)
        for i, e in enumerate(enc[:batch]):
            ids[i, T - e.shape[1] :], mask[i, T - e.shape[1] :] = e[0], 1
        batched = sorted(timed(ids, mask) / batch for _ in range(2))
    # a shared machine only slows a run down: the minimum is the best estimate, the median shows the noise
    out["batch1_s_per_prompt"] = round(single[0], 2)
    out["batch1_s_per_prompt_median"] = round(single[len(single) // 2], 2)
    out[f"batch{batch}_s_per_prompt"] = round(batched[0], 2)
    out[f"batch{batch}_s_per_prompt_max"] = round(batched[-1], 2)
    tokens = [e.shape[1] for e in enc[:prompts]]
    out["tokens_per_prompt"] = round(sum(tokens) / len(tokens), 1)
    out["n_loops"] = n_loops
    out["rss_after_import_gib"] = round(rss0, 2)
    out["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
    out["weights_gib"] = round(sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30, 2)
    # matmul FLOPs per prompt (2 per MAC over the non-embedding weights, every token and loop; head once per step)
    blocks = n_params - 2 * config.vocab_size * config.hidden_size
    flops = 2 * blocks * out["tokens_per_prompt"] * n_loops + 2 * config.vocab_size * config.hidden_size * n_loops
    out["gflop_per_prompt"] = round(flops / 1e9, 1)
    out["achieved_gflops_batch1"] = round(flops / 1e9 / out["batch1_s_per_prompt"], 1)
    return out


def measure_cpu(
    dtypes=("float32", "bfloat16"), n_loops: int = 8, prompts: int = 3, batch: int = 4, threads: int = 2, difficulty=3
) -> list[dict]:
    """Peak RSS and seconds per prompt of a random-weight Ouro-1.4B at n loops, one fresh process per dtype."""

    results = []
    for name in dtypes:
        cmd = [sys.executable, "-m", "engine.experiments.e1_bench", "--measure-one", name, "--loops", str(n_loops)]
        cmd += ["--prompts", str(prompts), "--batch", str(batch), "--threads", str(threads)]
        cmd += ["--difficulty", str(difficulty)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[2])
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m engine.experiments.e1_bench", description="CPU cost of a random Ouro-1.4B"
    )
    parser.add_argument("--measure", action="store_true", help="measure fp32 and bf16, one process each")
    parser.add_argument("--measure-one", choices=["float32", "bfloat16"], help=argparse.SUPPRESS)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--loops", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=3, help="prompts timed one at a time")
    parser.add_argument("--batch", type=int, default=4, help="prompts timed as one left-padded batch")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--difficulty", type=int, default=3, help="chain hops of the timed prompts")
    args = parser.parse_args(argv)
    if args.measure_one:
        one = _measure_one(args.measure_one, args.loops, args.prompts, args.batch, args.threads, args.difficulty)
        print(json.dumps(one))
        return 0
    if not args.measure:
        parser.print_help()
        return 2
    for r in measure_cpu(args.dtypes.split(","), args.loops, args.prompts, args.batch, args.threads, args.difficulty):
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
