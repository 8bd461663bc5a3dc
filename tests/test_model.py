"""The loop and its boundary: the properties the study's surgery rests on."""

from dataclasses import replace

import pytest
import torch

from engine.core.checks import run_checks
from engine.core.model import LoopedLM, ModelConfig, build
from engine.core.presets import smoke
from engine.core.tasks import VOCAB_SIZE

CFG = ModelConfig(VOCAB_SIZE, d_model=32, n_heads=2, d_ff=64, layers_per_block=2, trained_loops=3)


def tokens(members=2, batch=3, length=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB_SIZE, (members, batch, length), generator=g)


def test_parameter_count_matches_formula_and_ignores_loop_count():
    counts = set()
    for T in (1, 4, 12):
        model = build(replace(CFG, trained_loops=T), [0])
        counts.add(sum(p.numel() for p in model.parameters()))
        assert counts == {CFG.n_params}
    model = build(CFG, [0])
    before = sum(p.numel() for p in model.parameters())
    model(tokens(1), 9)  # running more loops creates nothing
    assert sum(p.numel() for p in model.parameters()) == before


@pytest.mark.parametrize("arch", ["looped", "stacked"])
def test_n1_bit_identical_between_modes(arch):
    model = build(smoke(arch=arch).model, [0, 1])
    with torch.no_grad():  # perturb norm gains so the check is not trivially about unit weights
        for p in model.parameters():
            if p.dim() == 2:
                p.add_(0.3 * torch.randn_like(p))
    x = tokens()
    norm, none = model(x, 1, "norm"), model(x, 1, "none")
    assert torch.equal(norm.logits, none.logits)
    # ...and at n = 2 they differ, so the modes are really different computations
    assert not torch.equal(model(x, 2, "norm").logits[-1], model(x, 2, "none").logits[-1])


def test_surgery_keeps_state_dict_keys_and_shapes():
    model = build(CFG, [0])  # trained with norm
    before = {k: v.shape for k, v in model.state_dict().items()}
    model(tokens(1), 5, "none")
    assert {k: v.shape for k, v in model.state_dict().items()} == before


@pytest.mark.parametrize("mode", ["norm", "none"])
def test_one_pass_equals_separate_runs(mode):
    model = build(CFG, [3, 4])
    x = tokens()
    once = model(x, 10, mode)
    assert once.logits.shape[:2] == (10, 2) and once.norm_pre.shape == (10, 2, 3)
    for n in range(1, 11):
        alone = model(x, n, mode)
        assert (once.logits[n - 1] - alone.logits[-1]).abs().max() <= 1e-6
        assert (once.norm_pre[n - 1] - alone.norm_pre[-1]).abs().max() <= 1e-6


def test_norms_follow_the_boundary():
    model = build(CFG, [0])
    out = model(tokens(1), 4, "norm")
    # after the boundary the state is RMS-normalised with unit gains: ||h|| = sqrt(d_model)
    assert torch.allclose(out.norm_post, torch.full_like(out.norm_post, CFG.d_model**0.5), rtol=1e-4)
    out = model(tokens(1), 4, "none")
    assert torch.equal(out.norm_pre, out.norm_post)  # nothing between steps


def test_members_are_independent_of_their_group():
    alone, grouped = build(CFG, [7]), build(CFG, [1, 7, 9])
    for k, v in alone.state_dict().items():
        assert torch.equal(v[0], grouped.state_dict()[k][1]), k
    x = tokens(1)
    out_alone = alone(x, 3).logits[:, 0]
    out_grouped = grouped(torch.cat([tokens(1, seed=5), x, tokens(1, seed=6)]), 3).logits[:, 1]
    assert torch.allclose(out_alone, out_grouped, atol=1e-5)


def test_stacked_is_untied_depth_run_once():
    looped, stacked = smoke(arch="looped").model, smoke(arch="stacked").model
    assert stacked.arch == "stacked" and stacked.trained_loops == 1
    assert stacked.layers_per_block == looped.layers_per_block * looped.trained_loops
    model = LoopedLM(stacked, 1)
    assert len(model.layers) == stacked.layers_per_block


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(boundary="layernorm"), "boundary must be one of"),
        (dict(tied=False), "set trained_loops=1"),
        (dict(d_model=30), "even size"),
        (dict(layers_per_block=0), "positive integer"),
    ],
)
def test_config_rejects_contradictions_with_a_sentence(change, message):
    with pytest.raises(ValueError, match=message):
        replace(CFG, **change)


def test_checks_pass_and_can_fail():
    assert all(c.passed for c in run_checks())
    broken = build(CFG, [0])
    broken.boundary_transfer = lambda x, mode, scale=None: (x, x * 1.001 if mode == "none" else x)  # a wrong readout
    assert not all(c.passed for c in run_checks([broken]))


def test_zero_loops_is_refused_not_read_as_the_default():
    model = build(replace(smoke().model, boundary="norm"), [0])
    tokens = torch.zeros(1, 2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="n_loops must be at least 1"):
        model(tokens, 0)
    assert model(tokens, None).logits.shape[0] == model.cfg.trained_loops  # None: the trained budget
