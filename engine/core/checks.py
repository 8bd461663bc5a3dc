"""The implementation checks the study rests on, runnable on any model (`loopscope check`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.core.model import BOUNDARIES, LoopedLM, build
from engine.core.presets import smoke


@dataclass
class Check:
    name: str
    passed: bool
    detail: str


def n1_identity(model: LoopedLM, tokens: torch.Tensor) -> Check:
    a, b = (model(tokens, 1, mode).logits for mode in BOUNDARIES)
    same = torch.equal(a, b)
    detail = "torch.equal" if same else f"max |diff| = {(a - b).abs().max().item():.3g}"
    return Check(f"{model.cfg.arch}: n=1 logits bit-identical between norm and none", same, detail)


def surgery_adds_nothing(model: LoopedLM, tokens: torch.Tensor) -> Check:
    before = {k: (tuple(v.shape), v.clone()) for k, v in model.state_dict().items()}
    for mode in BOUNDARIES:
        model(tokens, 3, mode)
    after = model.state_dict()
    same = before.keys() == after.keys() and all(
        before[k][0] == tuple(v.shape) and torch.equal(before[k][1], v) for k, v in after.items()
    )
    return Check(
        f"{model.cfg.arch}: switching the boundary adds no parameter",
        same,
        f"{len(after)} tensors, {sum(v.numel() for v in after.values())} values, keys/shapes/values unchanged"
        if same
        else "state dict changed",
    )


def one_pass_equals_per_n(model: LoopedLM, tokens: torch.Tensor, n_max: int = 12) -> Check:
    worst = 0.0
    for mode in BOUNDARIES:
        once = model(tokens, n_max, mode)
        for n in range(1, n_max + 1):
            alone = model(tokens, n, mode)
            worst = max(
                worst,
                (once.logits[n - 1] - alone.logits[-1]).abs().max().item(),
                (once.norm_post[n - 1] - alone.norm_post[-1]).abs().max().item(),
            )
    return Check(
        f"{model.cfg.arch}: one pass of {n_max} loops equals {n_max} separate runs",
        worst <= 1e-6,
        f"max |diff| = {worst:.3g} (tolerance 1e-6)",
    )


@torch.no_grad()
def run_checks(models: list[LoopedLM] | None = None, seed: int = 0) -> list[Check]:
    """All checks on the given models, or on fresh random looped and stacked smoke models."""
    if models is None:
        models = [build(smoke(arch=arch).model, [seed, seed + 1]) for arch in ("looped", "stacked")]
    g = torch.Generator().manual_seed(seed)
    results = []
    for model in models:
        model.eval()
        tokens = torch.randint(0, model.cfg.vocab_size, (model.members, 4, 9), generator=g)
        results += [
            n1_identity(model, tokens),
            surgery_adds_nothing(model, tokens),
            one_pass_equals_per_n(model, tokens),
        ]
    return results
