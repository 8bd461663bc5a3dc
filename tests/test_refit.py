"""Readout refit mechanics: which parameters train, a bit-identical frozen loop, the recovery formula."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from engine.core.model import build
from engine.core.presets import smoke
from engine.experiments import refit as rf


@pytest.fixture(scope="module")
def three_layer():
    """An (untrained) smoke model with a 3-layer block, so that first, middle and last differ."""
    run = smoke("parity", "norm")
    run = replace(run, model=replace(run.model, layers_per_block=3))
    return run, build(run.model, [0, 1])


def test_targets_name_the_intended_layers():
    assert [rf.layer_index(t, 3) for t in rf.TARGETS] == [None, 2, 0, 1, 2, 2]
    assert [rf.part(t) for t in rf.TARGETS] == [None, None, None, None, "attn", "mlp"]
    halves = {"head+last.attn": ["head+last.attn"], "head+last.mlp": ["head+last.mlp"]}
    assert (
        rf.distinct_targets(rf.TARGETS, 1)
        == {
            "head": ["head"],
            "head+last": ["head+last", "head+first", "head+middle"],
        }
        | halves
    )
    assert (
        rf.distinct_targets(rf.TARGETS, 2)
        == {
            "head": ["head"],
            "head+last": ["head+last", "head+middle"],
            "head+first": ["head+first"],
        }
        | halves
    )
    assert list(rf.distinct_targets(rf.TARGETS, 6)) == list(rf.TARGETS)


@pytest.mark.parametrize("target", rf.TARGETS)
def test_only_the_target_changes_and_the_frozen_loop_is_bit_identical(three_layer, target):
    run, model = three_layer
    before = {k: v.clone() for k, v in model.state_dict().items()}
    res = rf.refit(model, run, [0, 1], target, rf.RefitConfig(schedule=(0, 3), lr=1e-2), n_max=run.model.trained_loops)
    layer, half = rf.layer_index(target, 3), rf.part(target)
    expected = {"lm_head.weight"} | {k for k in before if layer is not None and k.startswith(f"layers.{layer}.")}
    if half:  # one sandwich half: its sublayer and the two norms around it, 1 + 4 or 1 + 3 tensors
        owned = {"attn": ("self_attn", "input_layernorm."), "mlp": ("mlp.", "post_attention_layernorm.")}[half]
        owned += {"attn": ("input_layernorm_2",), "mlp": ("post_attention_layernorm_2",)}[half]
        expected = {k for k in expected if k == "lm_head.weight" or any(o in k for o in owned)}
        assert len(expected) == {"attn": 7, "mlp": 6}[half]
    assert set(res.names) == expected
    after = res.state
    for k, v in before.items():
        assert torch.equal(model.state_dict()[k], v), f"the source model changed: {k}"
        if k in expected:
            assert all(not torch.equal(after[k][i], v[i]) for i in range(2)), f"{k} was not refit in every member"
        else:
            assert torch.equal(after[k], v), f"frozen {k} changed"
    assert set(res.grids) == {3} and res.grids[3].shape == (len(run.task.eval_difficulties), 3, 2)
    assert res.losses.shape == (3, 2) and torch.isfinite(res.losses).all()


def test_recovery_formula_and_its_guard():
    refit = np.array([0.8, 0.5, 0.9, 0.3, 0.9, 0.6, 0.7])
    removed = np.array([0.5, 0.5, 0.5, 0.5, 0.5, 0.7, 0.7])
    original = np.array([0.9, 0.9, 0.9, 0.9, 0.54, 0.6, 0.75])
    got = rf.recovery(refit, removed, original)
    # 0.3/0.4; nothing; all; worse than removed; gap 0.04 < 0.05; negative gap; gap 0.05 (kept)
    np.testing.assert_allclose(got, [0.75, 0.0, 1.0, -0.5, np.nan, np.nan, 0.0], equal_nan=True)
    assert np.isnan(rf.recovery(0.9, 0.5, 0.5)) and rf.recovery(0.6, 0.5, 0.7) == pytest.approx(0.5)


def test_refit_config_is_checked():
    with pytest.raises(ValueError, match="start at 0"):
        rf.RefitConfig(schedule=(10, 20))
    with pytest.raises(ValueError, match="start at 0"):
        rf.RefitConfig(schedule=(0, 20, 10))
    with pytest.raises(ValueError, match="targets"):
        rf.RefitConfig(targets=("head+norm",))
