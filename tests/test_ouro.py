"""Tests for engine.ouro.modeling (local Ouro implementation) and engine.experiments.e1_probe. Nothing is downloaded."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from engine.experiments.e1_probe import COLUMNS, VARIABLES, ProbePrompt, fit_prompts, make_prompts, probe
from engine.ouro.modeling import OuroConfig, OuroForCausalLM, exit_distribution, released_exit_steps

TINY = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
RELEASED_KEY = re.compile(
    r"^(lm_head\.weight|model\.embed_tokens\.weight|model\.norm\.weight"
    r"|model\.early_exit_gate\.(weight|bias)"
    r"|model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj"
    r"|input_layernorm|input_layernorm_2|post_attention_layernorm|post_attention_layernorm_2)\.weight)$"
)


def stepwise_rule(lam: torch.Tensor, threshold: float) -> torch.Tensor:
    """(k, R) -> (R,) 1-based: the rule before issue 31, every product and partial sum rounded to lam's dtype
    (also in dev/studies/e1-readout/readout_check.py, which compares it with the released rule; tests import
    nothing from dev/)."""
    k = lam.shape[0]
    stop = torch.full(lam.shape[1:], k, dtype=torch.long, device=lam.device)
    cumulative, survive = torch.zeros_like(lam[0]), torch.ones_like(lam[0])
    for t in range(k):
        cumulative = cumulative + lam[t] * survive
        survive = survive * (1 - lam[t])
        stop = torch.where((cumulative >= threshold) & (stop == k), t + 1, stop)
    return stop


def _tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Word-level tokenizer covering every word the probe prompts can contain."""
    split = pre_tokenizers.Whitespace()
    words = set(VARIABLES) | {"0", "1", "not"}
    for task in ("chain", "parity"):
        for pr in make_prompts(task, 8, seed=0):
            for text in (pr.prompt, *pr.options):
                words.update(w for w, _ in split.pre_tokenize_str(text))
    vocab = {w: i for i, w in enumerate(["<|endoftext|>", "<unk>", *sorted(words)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = split
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", unk_token="<unk>")


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny matmuls: thread wake-ups would dominate on small CPU boxes."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny random Ouro and tokenizer saved to disk; returns (dir, original model)."""
    torch.manual_seed(0)
    model = OuroForCausalLM(OuroConfig(**TINY)).eval()
    with torch.no_grad():  # non-trivial norm/gate weights so every parameter matters
        for name, p in model.named_parameters():
            if "norm" in name or "gate" in name:
                p.add_(0.1 * torch.randn_like(p))
    out = tmp_path_factory.mktemp("tiny_ouro")
    model.save_pretrained(out)
    tok = _tiny_tokenizer()
    assert len(tok) <= TINY["vocab_size"]
    tok.save_pretrained(out)
    return out, model


@pytest.fixture(scope="module")
def loaded(saved):
    path, _ = saved
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path)


def _ids(n: int, T: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(2, TINY["vocab_size"], (n, T), generator=torch.Generator().manual_seed(seed))


def test_autoload_roundtrip_and_released_names(saved, loaded):
    _, original = saved
    model, _ = loaded
    assert isinstance(model, OuroForCausalLM) and model.config.model_type == "ouro"
    sd, ref = model.state_dict(), original.state_dict()
    assert sd.keys() == ref.keys()
    assert all(torch.equal(sd[k], ref[k]) for k in ref)
    assert all(RELEASED_KEY.match(k) for k in sd), [k for k in sd if not RELEASED_KEY.match(k)]
    assert sd["lm_head.weight"].data_ptr() != sd["model.embed_tokens.weight"].data_ptr()
    assert sd["model.early_exit_gate.bias"].shape == (1,)


def test_released_config_fields_load(saved, tmp_path):
    path, original = saved
    for f in path.iterdir():
        if f.suffix in (".safetensors", ".json"):
            (tmp_path / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.pop("rope_parameters", None)
    cfg.update(
        architectures=["OuroForCausalLM"],
        auto_map={
            "AutoConfig": "configuration_ouro.OuroConfig",
            "AutoModelForCausalLM": "modeling_ouro.OuroForCausalLM",
        },
        rope_theta=1000000.0, rope_scaling=None, head_dim=16, layer_types=["full_attention"] * 2,
        sliding_window=None, use_sliding_window=False, max_window_layers=2, torch_dtype="bfloat16",
        transformers_version="4.54.1", total_ut_steps=4, early_exit_threshold=1.0, use_cache=True,
        some_future_field={"x": 1},
    )  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    config = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(config, OuroConfig)
    assert config.rope_theta == 1e6 and config.total_ut_steps == 4 and config.some_future_field == {"x": 1}
    model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    ids = _ids(2, 6)
    assert torch.equal(model(ids).logits, original(ids).logits)
    bf16 = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)  # runs in bf16
    out = bf16.loop_forward(ids, n_loops=2)
    assert out.logits.dtype == torch.float32 and torch.isfinite(out.logits).all()
    assert out.exit_probs.dtype == torch.float32


def test_n1_modes_bit_identical(loaded):
    model, _ = loaded
    ids, mask = _ids(3, 9), torch.ones(3, 9, dtype=torch.long)
    mask[0, :3] = 0
    for m in (None, mask):
        a = model.loop_forward(ids, m, n_loops=1, boundary="norm")
        b = model.loop_forward(ids, m, n_loops=1, boundary="none")
        assert torch.equal(a.logits, b.logits)
        assert torch.equal(a.exit_probs, b.exit_probs) and torch.equal(a.norm_pre, b.norm_pre)


def test_surgery_keeps_state_dict(saved):
    _, original = saved
    model = OuroForCausalLM(original.config).eval()
    model.load_state_dict(original.state_dict())
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    n_params = sum(p.numel() for p in model.parameters())
    ids = _ids(2, 7)
    model.set_boundary("none")
    assert {k: v.shape for k, v in model.state_dict().items()} == shapes
    assert sum(p.numel() for p in model.parameters()) == n_params
    full = model(ids).logits
    loop = model.loop_forward(ids, boundary="none")
    assert loop.logits.shape[0] == model.config.total_ut_steps
    torch.testing.assert_close(full[:, -1], loop.logits[-1], rtol=0, atol=1e-6)
    assert not torch.allclose(full, original(ids).logits)  # the mode matters beyond n = 1
    with pytest.raises(ValueError):
        model.set_boundary("layernorm")


@pytest.mark.parametrize("boundary", ["norm", "none"])
def test_long_run_prefix_matches_short_run(loaded, boundary):
    model, _ = loaded
    ids = _ids(2, 8)
    long, short = (model.loop_forward(ids, n_loops=n, boundary=boundary) for n in (8, 4))
    assert long.logits.shape == (8, 2, TINY["vocab_size"]) and long.norm_pre.shape == (8, 2)
    assert torch.isfinite(long.logits).all()
    for f in ("logits", "norm_pre", "norm_post", "gate_lambdas"):
        torch.testing.assert_close(getattr(long, f)[:4], getattr(short, f), rtol=0, atol=1e-6)
    # p_t for t < 4 does not depend on n; p_4 of the short run is the remaining mass.
    torch.testing.assert_close(long.exit_probs[:3], short.exit_probs[:3], rtol=0, atol=1e-6)
    if boundary == "none":
        assert torch.equal(long.norm_pre, long.norm_post)


def test_exit_distribution_sums_to_one(loaded):
    model, _ = loaded
    for n in (1, 3, 8):
        p = model.loop_forward(_ids(4, 5), n_loops=n).exit_probs
        assert p.dtype == torch.float32 and p.shape == (n, 4) and (p >= 0).all()
        torch.testing.assert_close(p.sum(0), torch.ones(4), rtol=0, atol=1e-6)
    lam = torch.tensor([[0.2], [0.5], [0.9]])
    torch.testing.assert_close(exit_distribution(lam)[:, 0], torch.tensor([0.2, 0.4, 0.4]))


def test_attention_and_mlp_match_llama_conventions():
    """RoPE (rotate_half, theta 1e6), GQA and SwiGLU agree with transformers' Llama modules."""
    from transformers import LlamaConfig
    from transformers.models.llama import modeling_llama as llama

    from engine.ouro.modeling import OuroAttention, OuroMLP, rope_cos_sin

    torch.manual_seed(0)
    sizes = dict(TINY, num_key_value_heads=2)
    ours = OuroConfig(**sizes)
    ref = LlamaConfig(**sizes, rope_theta=1e6)
    ref._attn_implementation = "sdpa"
    x, pos = torch.randn(2, 7, 64), torch.arange(7).expand(2, 7)
    ref_attn, ref_mlp = llama.LlamaAttention(ref, 0).eval(), llama.LlamaMLP(ref)
    attn, mlp = OuroAttention(ours), OuroMLP(ours)
    attn.load_state_dict(ref_attn.state_dict())
    mlp.load_state_dict(ref_mlp.state_dict())
    cos, sin = llama.LlamaRotaryEmbedding(ref)(x, pos)
    torch.testing.assert_close(rope_cos_sin(pos, 16, ours.rope_theta, x.dtype), (cos, sin))
    expected, _ = ref_attn(x, position_embeddings=(cos, sin), attention_mask=None)
    torch.testing.assert_close(attn(x, cos, sin, None), expected)
    torch.testing.assert_close(mlp(x), ref_mlp(x))


@pytest.mark.parametrize(("layers", "expected"), [(24, 1_434_652_673), (48, 2_667_974_657)])
def test_released_parameter_counts(layers, expected):
    config = OuroConfig(num_hidden_layers=layers)  # defaults are the released Ouro sizes
    with torch.device("meta"):
        model = OuroForCausalLM(config)
    assert sum(p.numel() for p in model.parameters()) == expected
    assert config.head_dim == 128 and config.num_key_value_heads == 16 and config.rope_theta == 1e6


def test_left_padding_matches_single_prompts(loaded):
    model, _ = loaded
    seqs = [_ids(1, T, seed=T)[0] for T in (9, 4, 6)]
    T = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), T, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, T - len(s) :], mask[i, T - len(s) :] = s, 1
    for boundary in ("norm", "none"):
        batch = model.loop_forward(ids, mask, n_loops=5, boundary=boundary)
        for i, s in enumerate(seqs):
            one = model.loop_forward(s[None], n_loops=5, boundary=boundary)
            for f in ("logits", "exit_probs"):
                torch.testing.assert_close(getattr(batch, f)[:, i], getattr(one, f)[:, 0], rtol=0, atol=1e-5)
            for f in ("norm_pre", "norm_post"):  # norms grow with depth in "none": relative check
                torch.testing.assert_close(getattr(batch, f)[:, i], getattr(one, f)[:, 0], rtol=1e-5, atol=0)
    full = model(ids, attention_mask=mask).logits
    torch.testing.assert_close(full[:, -1], model.loop_forward(ids, mask).logits[-1], rtol=0, atol=1e-6)


def _chain_value(prompt: str) -> int:
    defs = dict(line.split(" = ") for line in prompt.split("\n")[:-1])
    target = re.search(r"What is (\w+)\?", prompt).group(1)

    def value(name: str) -> int:
        rhs = defs[name]
        if rhs in ("0", "1"):
            return int(rhs)
        return 1 - value(rhs[4:]) if rhs.startswith("not ") else value(rhs)

    return value(target)


@pytest.mark.parametrize("task", ["chain", "parity"])
def test_prompts_balanced_correct_deterministic(task):
    difficulty = 4 if task == "chain" else 8  # 4 hops / 8 bits
    prompts = make_prompts(task, 40, seed=3, difficulty=difficulty)
    assert prompts == make_prompts(task, 40, seed=3, difficulty=difficulty)
    assert prompts != make_prompts(task, 40, seed=4, difficulty=difficulty)
    assert len({p.prompt for p in prompts}) > 30
    labels = [p.options.index(p.answer) for p in prompts]
    assert labels.count(0) == labels.count(1) == 20
    for p, label in zip(prompts, labels, strict=True):
        if task == "chain":
            assert _chain_value(p.prompt) == label and p.prompt.count(" = ") == 5
            assert p.options == (" 0", " 1")
        else:
            bits = re.search(r"Bits: ([01 ]+)\.", p.prompt).group(1).split()
            assert len(bits) == 8 and bits.count("1") % 2 == label and p.options == (" even", " odd")
    with pytest.raises(ValueError):
        make_prompts(task, 7, seed=0)


def test_probe_dataframe(loaded):
    model, tok = loaded
    assert tok.pad_token is None  # probe must fall back to eos and restore the tokenizer
    for task in ("chain", "parity"):
        df = probe(model, tok, make_prompts(task, 10, seed=0), n_loops=5, boundary="none", batch_size=4)
        assert list(df.columns) == COLUMNS and df["step"].tolist() == [1, 2, 3, 4, 5]
        for col in ("greedy_acc", "forced_acc", "option_rate", "top_share", "exit_prob"):
            assert df[col].between(0, 1).all(), col
        assert abs(df["exit_prob"].sum() - 1) < 1e-5 and (df["n_prompts"] == 10).all()
        assert (df["greedy_acc"] <= df["option_rate"] + 1e-9).all()
    assert tok.pad_token is None and tok.padding_side == "right"
    clash = [ProbePrompt("x = 1\nWhat is x? Answer:", " not 0", (" not 0", " not 1"))]
    with pytest.raises(ValueError, match="same token"):
        probe(model, tok, clash, n_loops=1)


# ---------------------------------------------------------------- the released forward's early exit


REFERENCE = Path(__file__).parent / "data" / "released_exit_steps.json"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_released_exit_steps_match_the_released_code(dtype):
    """tests/data/released_exit_steps.json holds gate logits and the step the released remote code
    (`OuroForCausalLM.forward` of modeling_ouro.py, run once on the CPU with one-hot step states; no code of it
    is in this repository) reads for n = 1..8 under each early_exit_threshold / early_exit_step setting; made
    by `dev/studies/e1-readout/readout_check.py --released FILE --write-reference`. Rows: the bf16 case of issue 31,
    untouched and saturated gates, random gates, and random rows where step-by-step rounding reads another step."""
    case = next(c for c in json.loads(REFERENCE.read_text())["cases"] if c["dtype"] == dtype)
    # each step's gates contiguous, as a forward's are (the CPU's float32 sigmoid of a strided view can differ)
    lam = torch.sigmoid(torch.tensor(case["gate_logits"], dtype=getattr(torch, dtype)).T.contiguous())  # (8, R)
    assert len(case["runs"]) == 10 and lam.shape == (8, 106)
    for run in case["runs"]:
        got = released_exit_steps(lam, run["early_exit_threshold"], run["early_exit_step"])
        assert got.T.tolist() == run["steps"], (run["early_exit_threshold"], run["early_exit_step"])
    steps = case["runs"][0]["steps"]  # threshold 1.0, as released
    assert case["runs"][0]["early_exit_threshold"] == 1.0 and case["runs"][0]["early_exit_step"] is None
    assert steps[2] == [1] * 8 and steps[3] == list(range(1, 9))  # saturated / closed gates
    if dtype == "bfloat16":  # pdf 0.99609375, 0.00156, 0.00094: cumsum reaches 1.0 at step 3, step by step never
        assert steps[0] == [1, 2, 3, 3, 3, 3, 3, 3]
        assert stepwise_rule(lam[:, :1], 1.0).item() == 8
    # the data tells the rules apart: step-by-step rounding reads another step in some rows
    stepwise = torch.stack([stepwise_rule(lam[:n], 1.0) for n in range(1, 9)])
    assert (stepwise.T != torch.tensor(steps)).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_released_readout_on_checkpoints_with_saturated_gates(saved, tmp_path, dtype):
    path, model = saved
    prompts = make_prompts("parity", 8, seed=0)
    for bias, stops_at in ((30.0, 1), (-30.0, None)):  # always exits at step 1 / never before the last
        with torch.no_grad():
            model.model.early_exit_gate.bias.fill_(bias)
        model.save_pretrained(tmp_path / "gate")
        AutoTokenizer.from_pretrained(path).save_pretrained(tmp_path / "gate")
        m = AutoModelForCausalLM.from_pretrained(tmp_path / "gate", dtype=dtype).eval()
        tok = AutoTokenizer.from_pretrained(tmp_path / "gate")
        final = probe(m, tok, prompts, n_loops=4, readout="final")
        released = probe(m, tok, prompts, n_loops=4, readout="released")
        if stops_at == 1:  # every n reads step 1
            assert (released["exit_step"] == 1).all()
            assert (released["greedy_acc"] == final.loc[0, "greedy_acc"]).all()
            assert (released["top_token_id"] == final.loc[0, "top_token_id"]).all()
        else:
            assert released["exit_step"].tolist() == [1, 2, 3, 4]
            assert released[["greedy_acc", "top_token_id"]].equals(final[["greedy_acc", "top_token_id"]])


def test_the_batched_left_padded_probe_reads_the_step_of_each_prompt_alone(saved):
    """float32: a prompt in a left-padded batch reads the same released step as run alone, from untouched to
    nearly saturated gates and thresholds 1.0 / 0.99 / 0.9 (padding moves its gates by ~1e-7 here; in bf16
    by whole bf16 steps, README E1)."""
    path, _ = saved
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    prompts = [p for task in ("chain", "parity") for p in make_prompts(task, 6, seed=0)]
    texts = [p.prompt for p in fit_prompts(tok, prompts)]
    tok.padding_side, tok.pad_token = "left", tok.eos_token
    enc = tok(texts, return_tensors="pt", padding=True)
    assert (enc["attention_mask"] == 0).any()  # the batch is padded
    read = set()
    for bias in (None, 2.0, 4.0):
        if bias is not None:
            with torch.no_grad():
                model.model.early_exit_gate.bias.fill_(bias)
        for threshold in (1.0, 0.99, 0.9):
            model.config.early_exit_threshold = threshold
            with torch.inference_mode():
                batch = model.loop_forward(enc["input_ids"], enc["attention_mask"], n_loops=6).released_steps
                alone = [model.loop_forward(tok([t], return_tensors="pt")["input_ids"], n_loops=6) for t in texts]
            assert torch.equal(batch, torch.cat([a.released_steps for a in alone], 1)), (bias, threshold)
            read |= set(batch[-1].tolist())
    assert read == {1, 2, 3, 4, 5, 6}  # the steps read vary: the comparison is not all-first or all-last
    tok.pad_token = None
    batched = probe(model, tok, prompts, n_loops=6, batch_size=12, readout="released")
    one_by_one = probe(model, tok, prompts, n_loops=6, batch_size=1, readout="released")
    cols = ["exit_step", "greedy_acc", "forced_acc", "top_token_id"]
    assert batched[cols].equals(one_by_one[cols]) and batched["exit_step"].nunique() > 1


def test_early_exit_step_takes_precedence(saved):
    path, _ = saved
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    prompts = make_prompts("parity", 4, seed=0)
    assert probe(model, tok, prompts, n_loops=4, readout="released")["exit_step"].tolist() != [1, 2, 2, 2]
    model.config.early_exit_step = 1  # 0-based: step 2, once two steps are run
    assert probe(model, tok, prompts, n_loops=4, readout="released")["exit_step"].tolist() == [1, 2, 2, 2]
    model.config.early_exit_step, model.config.early_exit_threshold = None, None  # neither: the last step
    assert probe(model, tok, prompts, n_loops=4, readout="released")["exit_step"].tolist() == [1, 2, 3, 4]
