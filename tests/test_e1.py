"""E1 through the CLI on a tiny random Ouro checkpoint saved here. Nothing is downloaded."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from test_ouro import _tiny_tokenizer  # tests/ is on sys.path under pytest

from engine.cli import main
from engine.core.store import RESULT_COLUMNS, sha256
from engine.experiments import e1
from engine.experiments import e1_bench as measure
from engine.experiments.e1_probe import make_prompts, option_token_ids
from engine.ouro import hub
from engine.ouro.modeling import OuroConfig, OuroForCausalLM

TINY = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)


_word_tokenizer = _tiny_tokenizer  # the same word-level tokenizer as the Ouro tests


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    torch.manual_seed(0)
    model = OuroForCausalLM(OuroConfig(**TINY, total_ut_steps=3)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "gate" in name:
                p.add_(0.1 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("ckpt") / "e1-tiny"
    model.save_pretrained(path)
    _word_tokenizer().save_pretrained(path)
    return path


def _run(ckpt, results, *extra) -> int:
    argv = ["ouro", "--model", str(ckpt), "--task", "chain", "--loops", "1-5", "--prompts", "8"]
    return main([*argv, "--device", "cpu", "--results", str(results), *extra])


def test_cli_table_identity_and_cache(ckpt, tmp_path, capsys, monkeypatch):
    assert _run(ckpt, tmp_path) == 0
    out = capsys.readouterr().out
    table_path, manifest_path = tmp_path / "e1-tiny.parquet", tmp_path / "e1-tiny.json"
    rows = pd.read_parquet(table_path)
    assert list(rows.columns) == RESULT_COLUMNS
    assert set(rows["boundary"]) == {"norm", "norm->none"} and set(rows["eval_loops"]) == {1, 2, 3, 4, 5}
    assert (rows["experiment"] == "e1").all() and (rows["arch"] == "looped").all()
    assert (rows["trained_loops"] == 3).all() and (rows["difficulty"] == 3).all() and (rows["seed"] == 0).all()
    metrics = {"accuracy", "choice_accuracy", "top_token_share", "top_token", "norm_pre", "norm_post", "exit_prob"}
    assert metrics <= set(rows["metric"])
    assert not rows.duplicated([c for c in RESULT_COLUMNS if c != "value"]).any()
    wide = rows.pivot_table(index=["eval_loops", "metric"], columns="boundary", values="value")
    first = wide.loc[1].drop(index="norm_post")  # norm_post is |Norm(pre)| in one mode, |pre| in the other
    assert (first["norm"] == first["norm->none"]).all()  # n = 1: identical readouts
    assert not (wide.loc[5, "norm"] == wide.loc[5, "norm->none"]).all()  # the surgery matters beyond
    assert rows.loc[rows["metric"] == "accuracy", "value"].between(0, 1).all()

    manifest = json.loads(manifest_path.read_text())
    assert manifest["files"][table_path.name] == sha256(table_path.read_bytes())
    entry = manifest["tasks"]["chain"]
    assert entry["n1_identity"]["passed"] and entry["n1_identity"]["logits_equal"]
    assert len(entry["prompts"]) == 8 and set(entry["top_tokens"]) == {"norm", "norm->none"}
    assert manifest["model"]["parameters"] == sum(p.numel() for p in OuroForCausalLM(OuroConfig(**TINY)).parameters())
    assert manifest["model"]["config"]["total_ut_steps"] == 3 and manifest["git_commit"]
    assert "n = 1 identity passed" in out and "norm->none" in out

    # rerun: nothing is loaded or computed, the files are untouched
    before = (table_path.read_bytes(), manifest_path.read_bytes())
    monkeypatch.setattr(e1, "load_model", lambda *a: pytest.fail("the model was loaded for cached results"))
    assert _run(ckpt, tmp_path) == 0
    assert "nothing recomputed" in capsys.readouterr().out
    assert (table_path.read_bytes(), manifest_path.read_bytes()) == before


def test_only_missing_tasks_are_computed(ckpt, tmp_path, monkeypatch):
    assert _run(ckpt, tmp_path) == 0
    chain = pd.read_parquet(tmp_path / "e1-tiny.parquet")
    done = []
    real = e1.probe_task
    monkeypatch.setattr(e1, "probe_task", lambda m, t, s, *a: done.append(s["task"]) or real(m, t, s, *a))
    assert _run(ckpt, tmp_path, "--task", "chain,parity") == 0
    assert done == ["parity"]
    both = pd.read_parquet(tmp_path / "e1-tiny.parquet")
    pd.testing.assert_frame_equal(both[both["task"] == "chain"].reset_index(drop=True), chain)
    assert set(both["task"]) == {"chain", "parity"}
    assert _run(ckpt, tmp_path, "--loops", "1-3") == 0 and done == ["parity", "chain"]  # new settings: recomputed


def test_missing_model_offline_exits_2(tmp_path, capsys, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    results = tmp_path / "results"
    assert main(["ouro", "--model", "nobody/no-such-ouro", "--results", str(results)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("loopscope: error: the model nobody/no-such-ouro is not in the")
    assert "hf download nobody/no-such-ouro --local-dir FOLDER" in err and "--model FOLDER" in err
    assert "Traceback" not in err
    assert not results.exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--prompts", "7"], "--prompts 7"),
        (["--prompts", "0"], "--prompts 0"),
        (["--prompts", "-4"], "--prompts -4"),
        (["--task", "chain,sums"], "unknown task 'sums'"),
        (["--model", "no/such/folder"], "not a folder"),
    ],
)
def test_bad_input_exits_2(ckpt, tmp_path, capsys, args, needle):
    results = tmp_path / "results"
    assert main(["ouro", "--model", str(ckpt), "--results", str(results), *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err
    assert not results.exists()


def test_failed_identity_is_recorded_and_exits_1(ckpt, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(e1, "ouro_n1_identity", lambda *a: {"batch": 2, "logits_equal": False})
    assert _run(ckpt, tmp_path, "--prompts", "2", "--loops", "1-2") == 1
    assert "n = 1 identity failed for chain" in capsys.readouterr().err
    manifest = json.loads((tmp_path / "e1-tiny.json").read_text())
    assert manifest["tasks"]["chain"]["n1_identity"]["passed"] is False
    assert _run(ckpt, tmp_path, "--prompts", "2", "--loops", "1-2") == 1  # served from the cache, still flagged


def test_digit_splitting_tokenizer_gets_space_in_prompt():
    """Ouro's (SmolLM-style) tokenizer splits ' 0' into ' ' + '0': the probe ends the prompt with the space."""
    tok = measure.local_bpe_tokenizer(vocab_size=300)
    prompts = make_prompts("chain", 4, seed=0)
    assert tok(" 0")["input_ids"][0] == tok(" 1")["input_ids"][0]  # the clash this guards against
    from engine.experiments.e1_probe import fit_prompts

    fitted = fit_prompts(tok, prompts)
    assert all(f.prompt == p.prompt + " " and f.options == ("0", "1") for f, p in zip(fitted, prompts, strict=True))
    ids = option_token_ids(tok, fitted)
    assert (ids[:, 0] != ids[:, 1]).all()
    assert fit_prompts(tok, make_prompts("parity", 4, seed=0)) == make_prompts("parity", 4, seed=0)


def test_slugs():
    from pathlib import Path

    snap = Path("/c/hub/models--ByteDance--Ouro-1.4B/snapshots/" + "a" * 40)
    assert hub.slug_of("ByteDance/Ouro-1.4B", snap) == "ouro-1.4b"
    assert hub.slug_of("cached_results/e1-demo", Path("/x/cached_results/e1-demo")) == "demo"


def test_demo_trains_saves_loads_back_and_probes_with_its_readout_recorded(tmp_path, monkeypatch):
    """The demo command on a tiny config, three steps: the checkpoint reloads through from_pretrained (the
    loading path of the released weights) with the trained weights, and E1 runs on it at the demo's difficulties,
    its manifest recording the readout."""
    from transformers import AutoModelForCausalLM

    from engine.experiments import e1_demo as demo

    tiny = dict(demo.DEMO_CONFIG, hidden_size=16, intermediate_size=44, num_attention_heads=2)
    monkeypatch.setattr(demo, "DEMO_CONFIG", tiny)
    monkeypatch.setattr(demo, "TRAIN", dict(demo.TRAIN, batch=8, eval_prompts=4, eval_every=2))
    monkeypatch.setitem(demo.PROBE, "loops", [1, 2, 3, 4, 5, 6, 7, 8])
    assert demo.main(["--results", str(tmp_path), "--steps", "3", "--prompts", "4"]) == 0
    folder = tmp_path / "e1-demo"
    assert {"config.json", "model.safetensors", "tokenizer.json", "training.json"} <= {p.name for p in folder.iterdir()}
    back = AutoModelForCausalLM.from_pretrained(folder)
    assert type(back) is OuroForCausalLM and back.config.hidden_size == 16 and back.config.total_ut_steps == 4
    fresh = demo.build_model(demo.build_tokenizer(), seed=0)
    assert not torch.equal(back.lm_head.weight, fresh.lm_head.weight)  # trained weights, not a fresh init
    record = json.loads((folder / "training.json").read_text())
    assert [e["step"] for e in record["evals"]] == [2, 3] and record["train"]["steps"] == 3

    manifest = json.loads((tmp_path / "e1-demo.json").read_text())
    for task, difficulty in demo.PROBE["difficulty"].items():
        settings = manifest["tasks"][task]["settings"]
        assert settings["readout"] == "final" and settings["difficulty"] == difficulty and settings["n_max"] == 8
        assert settings["prompts"] == 4 and settings["dtype"] == "float32"
    training = manifest["model"]["training"]
    assert training["probe"]["readout"] == "final" and training["parameters"] == manifest["model"]["parameters"]
    rows = pd.read_parquet(tmp_path / "e1-demo.parquet")
    assert set(rows["eval_loops"]) == set(range(1, 9)) and set(rows["boundary"]) == {"norm", "norm->none"}
    assert set(zip(rows["task"], rows["difficulty"], strict=True)) == set(demo.PROBE["difficulty"].items())
    assert {"norm_ratio", "top_token_share"} <= set(rows["metric"])
    assert demo.main(["--results", str(tmp_path), "--probe-only", "--prompts", "4"]) == 0  # served from the cache


def test_demo_training_never_sees_the_prompts_it_is_judged_on(monkeypatch):
    """Every prompt of the probe (as `loopscope ouro` draws it for the demo) and of the training-time check is held
    out; training batches at the probe's difficulties replace each held-out prompt by an unseen one with the same
    answer, so the labels stay exactly balanced."""
    from engine.experiments import e1_demo as demo

    held = demo.held_out()
    for task, difficulty in demo.PROBE["difficulty"].items():
        for seed, n in ((0, demo.PROBE["prompts"]), (demo.EVAL_SEED, demo.TRAIN["eval_prompts"])):
            assert {p.prompt for p in make_prompts(task, n, seed=seed, difficulty=difficulty)} <= held
    monkeypatch.setattr(demo, "TRAIN", dict(demo.TRAIN, chain_hops=(demo.PROBE["difficulty"]["chain"],),
                                            parity_bits=(demo.PROBE["difficulty"]["parity"],)))  # fmt: skip
    rng, replaced = random.Random(0), 0
    for step in range(40):
        prompts, r = demo.batch_of(step, 0, rng, 64, held)
        replaced += r
        assert len(prompts) == 64 and not {p.prompt for p in prompts} & held
        for half in (prompts[:32], prompts[32:]):
            assert sorted(p.options.index(p.answer) for p in half) == [0] * 16 + [1] * 16
    assert replaced > 0  # 12-bit parity has 4,096 strings: about 8% of them are held out


def test_the_demo_size_is_the_one_documented():
    from engine.experiments import e1_demo as demo

    model = demo.build_model(demo.build_tokenizer(), seed=0)
    assert sum(p.numel() for p in model.parameters()) == 56_321
    assert model.config.num_hidden_layers == 1 and model.config.total_ut_steps == 4


def test_demo_objective_is_ouros_gate_loss_written_out(ckpt):
    """demo.objective against Ouro's stage-1 loss computed here step by step from the gate's lambdas: per prompt,
    p_t = lam_t prod_{j<t}(1 - lam_j) (the last step the rest), loss = sum_t p_t CE_t - beta sum_t p_t log(1/p_t),
    averaged over prompts; and the gradient reaches the exit gate."""
    from engine.experiments import e1_demo as demo

    model = OuroForCausalLM.from_pretrained(ckpt).train()
    torch.manual_seed(0)
    ids = torch.randint(3, 96, (5, 9))
    target = torch.randint(0, 96, (5,))
    out = model.loop_forward(ids, n_loops=4)
    beta = 0.3
    loss, ce = demo.objective(out, target, beta)
    lam, logits = out.gate_lambdas.detach().double(), out.logits.detach().double()
    expected = []
    for b in range(5):
        survive, total = 1.0, 0.0
        for t in range(4):
            p = survive if t == 3 else survive * lam[t, b].item()
            survive *= 1.0 - lam[t, b].item()
            nll = -torch.log_softmax(logits[t, b], -1)[target[b]].item()
            total += p * nll + beta * p * torch.log(torch.tensor(p)).item()  # - beta * H(p): H = -sum p log p
        expected.append(total)
    assert loss.item() == pytest.approx(sum(expected) / 5, rel=1e-5)
    assert ce.shape == (4,)
    loss.backward()
    assert model.model.early_exit_gate.weight.grad.abs().sum() > 0  # the gate is trained with the rest


def test_difficulty_is_parsed_checked_and_recorded(ckpt, tmp_path, capsys):
    assert _run(ckpt, tmp_path, "--difficulty", "chain=5") == 0
    settings = json.loads((tmp_path / "e1-tiny.json").read_text())["tasks"]["chain"]["settings"]
    assert settings["difficulty"] == 5
    assert set(pd.read_parquet(tmp_path / "e1-tiny.parquet")["difficulty"]) == {5}
    for bad in ("chain=x", "loop=3", "chain=99", "parity=0"):
        assert _run(ckpt, tmp_path / "bad", "--difficulty", bad) == 2
        assert "--difficulty" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_the_readout_is_chosen_recorded_and_keyed(ckpt, tmp_path, capsys):
    assert _run(ckpt, tmp_path) == 0
    assert _run(ckpt, tmp_path, "--readout", "released") == 0  # another readout: recomputed, not served
    assert "cached" not in capsys.readouterr().out.split("e1:")[-1]
    manifest = json.loads((tmp_path / "e1-tiny.json").read_text())
    entry = manifest["tasks"]["chain"]
    assert entry["settings"]["readout"] == "released" and entry["settings"]["released_rule"] == e1.RELEASED_RULE
    assert entry["readout_device"] == "cpu"  # the released exit step depends on the device it is computed on
    assert entry["early_exit"] == {"early_exit_threshold": 1.0, "early_exit_step": None}
    final = e1.task_settings("chain", SimpleNamespace(prompts=8, loops=[1, 2], readout="final"), torch.float32, "cpu")
    assert "released_rule" not in final  # the final readout's keys (and cached results) are unchanged
    steps = pd.read_parquet(tmp_path / "e1-tiny.parquet").query("metric == 'exit_step'")
    assert len(steps) and steps["value"].between(1, 5).all()
    assert (steps["value"] <= steps["eval_loops"]).all()  # the released readout never reads past step n


def test_dry_run_says_what_and_how_long_and_writes_nothing(ckpt, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    results = tmp_path / "results"
    assert (
        main(["ouro", "--model", "ByteDance/Ouro-1.4B", "--dry-run", "--device", "cpu", "--results", str(results)]) == 0
    )
    out = capsys.readouterr().out
    assert "download from the Hugging Face Hub" in out and "1,434,652,673" in out and "5.3 GiB in float32" in out
    assert "2000 forwards of n = 8" in out and "min on a 2-core CPU" in out
    assert _run(ckpt, results, "--dry-run") == 0
    assert "local folder" in capsys.readouterr().out
    assert not results.exists()  # nothing downloaded, loaded or written
