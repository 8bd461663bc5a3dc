"""The inspector (engine.core.inspector, dashboard/app_pages/inspector.py): one input's readout per loop step agrees
with the evaluation's own metrics on the same items, n = 1 reads out alike with and without the norm, a bad input is
one sentence, and the page draws a shipped run's real values from a deep link (or says how to restore its weights)."""

import math
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch

from engine.core import inspector, tasks
from engine.core.evaluate import state_scales, step_metrics
from engine.core.model import ModelConfig, build
from engine.core.presets import RunConfig
from engine.core.store import Store, weights_not_kept
from engine.errors import UsageError
from engine.experiments.e5 import load_scales
from engine.experiments.runs import load_models
from engine.runtime import jobs

SHIPPED = Path(__file__).resolve().parents[1] / "cached_results"
RUN = "54cb465fa855929b"  # the `cpu` study's E2 parity `norm` seed 0: shipped with its weights and rescale scalars


@pytest.fixture(scope="module")
def shipped():
    store = Store(SHIPPED)
    model, cfg, _ = load_models(store, [RUN])
    return model, cfg, load_scales(store, RUN, cfg.max_eval_loops)


@pytest.fixture(scope="module")
def chain_none():
    """A small untrained chain model trained-as `none` (its weights are its seed's), with measured rescale scalars."""
    task = tasks.TaskConfig("chain", (1, 2), (1, 2, 3), chains=2, variables=8, eval_examples=16)
    cfg = ModelConfig(vocab_size=tasks.VOCAB_SIZE, d_model=32, n_heads=2, d_ff=48, boundary="none", trained_loops=2)
    return build(cfg, [7]), task


def agree(model, task, items: list[tuple[int, int]], n: int, modes: dict[str, str], scales) -> set[int]:
    """inspect's rows on each item equal step_metrics on a batch of that item alone, in every mode; returns the
    items' labels."""
    labels = set()
    for difficulty, i in items:
        tokens, label = inspector.eval_item(task, difficulty, i)
        rows = inspector.inspect(model, tokens, label, n, modes, scales)
        batch = tasks.eval_set(task, difficulty)
        one = tasks.Batch(batch.tokens[i : i + 1], batch.targets[i : i + 1], batch.answers[i : i + 1])
        assert int(one.answers[0]) == label
        labels.add(label)
        for name, mode in modes.items():
            got = rows[rows["mode"] == name].sort_values("n")
            assert got["n"].tolist() == list(range(1, n + 1))
            s = None if mode != "rescale" else scales[:n, None]
            want = {k: v[:, 0].double() for k, v in step_metrics(model, one, n, mode, scales=s).items()}
            top = torch.tensor([tasks.VOCAB.index(t) for t in got["top_token"]], dtype=torch.double)
            torch.testing.assert_close(top, want["top_token"])
            torch.testing.assert_close(torch.tensor(got["correct"].to_numpy()).double(), want["choice_accuracy"])
            torch.testing.assert_close((top == label).double(), want["accuracy"])
            for column in ("margin", "norm_pre", "norm_post"):
                torch.testing.assert_close(torch.tensor(got[column].to_numpy()), want[column], msg=column)
    return labels


def test_inspect_agrees_with_step_metrics_on_a_shipped_run(shipped):
    model, cfg, scales = shipped
    modes = inspector.run_modes("norm", scales is not None)
    assert list(modes) == ["norm", "norm->none", "norm->rescale"]
    assert agree(model, cfg.task, [(9, 2), (12, 5), (16, 0)], cfg.max_eval_loops, modes, scales) == {0, 1}


def test_inspect_agrees_with_step_metrics_on_a_none_trained_chain_model(chain_none):
    model, task = chain_none
    modes = inspector.run_modes("none", True)
    assert modes == {"none": "none", "none->norm": "norm"}  # rescale is a surgery of norm-trained models only
    assert agree(model, task, [(1, 0), (3, 7), (3, 2)], 6, modes, None) == {0, 1}
    scales = state_scales(model, task, 6, examples=8)[:, 0]  # rescale runs on any model given its scalars
    agree(model, task, [(2, 4)], 6, {"x->rescale": "rescale"}, scales)


def test_the_mean_over_items_is_the_evaluations_metric(shipped):
    """Averaged over a difficulty's first 32 items, the rows give step_metrics' values on that batch (a batch
    rounds a little differently from one item at a time: close, not equal)."""
    model, cfg, _ = shipped
    batch = tasks.eval_set(cfg.task, 12)
    part = tasks.Batch(batch.tokens[:32], batch.targets[:32], batch.answers[:32])
    rows = pd.concat(
        inspector.inspect(model, part.tokens[i], int(part.answers[i]), 12, {"norm->none": "none"}, None)
        for i in range(32)
    )
    means = rows.groupby("n")[["margin", "norm_pre", "norm_post", "correct"]].mean()
    want = step_metrics(model, part, 12, "none")
    for column, metric in (("margin", "margin"), ("norm_pre", "norm_pre"), ("correct", "choice_accuracy")):
        torch.testing.assert_close(torch.tensor(means[column].to_numpy()), want[metric][:, 0].double(), rtol=1e-4,
                                   atol=1e-4, msg=column)  # fmt: skip


def test_n1_reads_out_alike_with_and_without_the_norm(shipped, chain_none):
    model, cfg, scales = shipped
    tokens, label = inspector.parity_input("1011 0010 110", cfg.task)
    rows = inspector.inspect(model, tokens, label, 5, inspector.run_modes("norm", True), scales)
    first = rows[rows["n"] == 1].set_index("mode")
    same = ["answer", "correct", "top_token", "top_share", "margin", "norm_pre"]
    assert (first.loc[["norm->none", "norm->rescale"], same] == first.loc["norm", same]).all().all()
    assert first.loc["norm->none", "norm_post"] == first.loc["norm->none", "norm_pre"]  # none hands on Block(h) itself
    later = rows[rows["n"] == 3].set_index("mode")
    assert later.loc["norm", "norm_post"] != later.loc["norm->none", "norm_post"]  # the modes part after step 1
    model, task = chain_none
    tokens, label = inspector.eval_item(task, 2, 1)
    rows = inspector.inspect(model, tokens, label, 3, inspector.run_modes("none", False), None)
    first = rows[rows["n"] == 1].set_index("mode")
    assert (first.loc["none", same] == first.loc["none->norm", same]).all()


def test_a_parity_input_is_the_tasks_own_tokens(shipped):
    _, cfg, _ = shipped
    tokens, label = inspector.parity_input(" 1 0 1 1 0 0 1 0 ", cfg.task)
    assert tasks.describe(tokens) == "1 0 1 1 0 0 1 0 =" and label == 0
    batch = tasks.eval_set(cfg.task, 10)  # a stored item typed in comes out as its tokens and label
    bits = "".join(map(str, batch.tokens[3, :-1].tolist()))
    tokens, label = inspector.parity_input(bits, cfg.task)
    assert torch.equal(tokens, batch.tokens[3]) and label == int(batch.answers[3])
    assert inspector.origin(cfg.task, tokens) == "held out: training never draws it"
    assert inspector.origin(cfg.task, inspector.parity_input("1" * 14, cfg.task)[0]) == "beyond the training range"


@pytest.mark.parametrize(
    "text, says",
    [
        ("10x1011", "1 character(s) not 0 or 1"),
        ("", "is empty"),
        ("   ", "is empty"),
        ("101", "has 3 bits; this run takes 7–16"),
        ("1" * 40, "has 40 bits"),
        ("<a href=x>1</a>", "not 0 or 1"),
    ],
)
def test_a_bad_input_is_one_sentence(shipped, text, says):
    _, cfg, _ = shipped
    with pytest.raises(inspector.BadInput) as raised:
        inspector.parity_input(text, cfg.task)
    message = str(raised.value)
    assert says in message and isinstance(raised.value, UsageError)  # the CLI's exit 2, one sentence
    assert message.endswith(".") and "\n" not in message and message.count(": ") <= 2
    assert "<a" not in message and "Traceback" not in message  # what was typed is never echoed


def test_a_bad_item_is_one_sentence(shipped, chain_none):
    _, cfg, _ = shipped
    _, task = chain_none
    with pytest.raises(inspector.BadInput, match="parity input; this run's task is chain"):
        inspector.parity_input("1011001", task)
    with pytest.raises(inspector.BadInput, match="difficulty 9 is not evaluated"):
        inspector.eval_item(task, 9, 0)
    with pytest.raises(inspector.BadInput, match="item 16 is not in the set: it has items 0–15"):
        inspector.eval_item(task, 2, 16)
    with pytest.raises(ValueError, match="one-member model"):
        inspector.inspect(build(ModelConfig(vocab_size=tasks.VOCAB_SIZE, d_model=16, n_heads=2, d_ff=16), [0, 1]),
                          *inspector.eval_item(task, 1, 0), 2, {"norm": "norm"})  # fmt: skip


# ---------------------------------------------------------------- the page


def weightless_key(store: Store) -> str:
    """Seed 3 of the shipped run's group: stored without its weights."""
    key = RunConfig.from_dict(store.manifest(RUN)["config"]).run_key(3)
    assert weights_not_kept(store.manifest(key)) is not None
    return key


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A results folder holding two shipped runs of one group: seed 0 with its weights, seed 3 without."""
    root = tmp_path_factory.mktemp("inspector-results")
    for key in (RUN, weightless_key(Store(SHIPPED))):
        shutil.copytree(SHIPPED / "runs" / key, root / "runs" / key)
    return root


@pytest.mark.slow
def test_the_page_draws_a_shipped_runs_values_from_a_deep_link(monkeypatch, folder, shipped, tmp_path):
    from tests.test_dashboard import charts_on, render

    monkeypatch.setenv("LOOPSCOPE_CACHE", str(tmp_path / "cache"))
    at = render(monkeypatch, folder, "inspector", run=RUN, bits="110100101", n="9", modes=["norm", "norm->none"],
                show="state norm")  # fmt: skip
    assert not at.error and not at.warning
    assert at.text_input(key="bits").value == "110100101" and at.number_input(key="n").value == 9
    model, cfg, scales = shipped
    want = inspector.inspect(model, *inspector.parity_input("110100101", cfg.task), 9,
                             {"norm": "norm", "norm->none": "none"}, None)  # fmt: skip
    table = at.dataframe[0].value
    pd.testing.assert_frame_equal(table.reset_index(drop=True), want, check_dtype=False)
    (spec,) = charts_on(at)
    drawn = pd.DataFrame(next(iter(spec["datasets"].values())))
    assert set(drawn["side"]) == {"after the boundary (handed on)", "before the boundary"}
    assert sorted(drawn.loc[drawn["side"] == "before the boundary", "value"]) == sorted(want["norm_pre"])
    text = " ".join(m.value for m in at.markdown)
    assert "`1 1 0 1 0 0 1 0 1 =` · right answer **1**" in text and "105,792 parameters" in text
    assert [b.proto.label for b in at.get("download_button")] == ["PNG", "SVG", "CSV"]


@pytest.mark.slow
def test_the_pages_default_view_is_a_shipped_run_in_every_mode(monkeypatch, folder, tmp_path):
    from tests.test_dashboard import render

    monkeypatch.setenv("LOOPSCOPE_CACHE", str(tmp_path / "cache"))
    at = render(monkeypatch, folder, "inspector")
    assert at.selectbox(key="run").value == RUN
    table = at.dataframe[0].value
    assert list(dict.fromkeys(table["mode"])) == ["norm", "norm->none", "norm->rescale"]
    assert table["n"].max() == 12 and table["margin"].notna().all()


@pytest.mark.slow
def test_the_page_says_what_is_wrong_with_a_bad_input_in_one_sentence(monkeypatch, folder, tmp_path):
    from tests.test_dashboard import render

    monkeypatch.setenv("LOOPSCOPE_CACHE", str(tmp_path / "cache"))
    at = render(monkeypatch, folder, "inspector", run=RUN, bits="[x](http://e.example)")
    (error,) = at.error
    assert error.value.startswith("The input holds") and "http" not in error.value
    assert not at.dataframe and not at.get("vega_lite_chart")
    at = render(monkeypatch, folder, "inspector", run=RUN, n="1e9")  # a loop count out of range: named, not dropped
    (warning,) = at.warning
    assert "n=1e9 is not a whole number of 1–64: it was ignored, and **12** is shown instead" in warning.value
    assert at.dataframe[0].value["n"].max() == 12


@pytest.mark.slow
def test_the_page_says_how_to_restore_a_weightless_run_and_how_long(monkeypatch, folder, tmp_path):
    from tests.test_dashboard import render

    monkeypatch.setenv("LOOPSCOPE_CACHE", str(tmp_path / "cache"))
    key = weightless_key(Store(folder))
    at = render(monkeypatch, folder, "inspector", run=key)
    (info,) = at.info
    minutes = math.ceil(jobs.restore_seconds(Store(folder).manifest(key)) / 60)  # training and evaluation, as Run says
    assert info.value.startswith("This run's weights are not kept here, so it cannot be inspected until ")
    assert f"`loopscope restore {key}` retrains its group of 16 seeds (about {minutes} min on the machine that " in (
        info.value
    )
    assert info.value.count(". ") == 0 and info.value.endswith("as stored."), info.value  # one sentence
    assert not at.dataframe and not at.get("vega_lite_chart")


@pytest.mark.slow
def test_the_page_in_chromium_deep_link_new_input_and_csv(folder, tmp_path_factory):
    """Opened by a deep link in Chromium: the figure and table of the linked input; typing new bits rewrites the URL
    and redraws; the CSV holds every (mode, n) row with the run and the input."""
    import io

    from tests import test_browser as web

    with web.playwright_api.sync_playwright() as p:
        args = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
        browser = p.chromium.launch(executable_path=str(web.CHROMIUM), args=args)
        for server in web.streamlit_server(folder, tmp_path_factory):
            page = web.open_page(browser, f"{server}/inspector?run={RUN}&bits=1101001010&show=state+norm", "Inspector")
            web.figures(page, 1)
            page.get_by_test_id("stDataFrame").wait_for()  # the table draws after the figure
            assert page.get_by_text("1 1 0 1 0 0 1 0 1 0 =").count() == 1
            box = page.get_by_role("textbox", name="input bits")
            box.fill("0111010")
            box.press("Enter")
            web.url_has(page, "bits=0111010")
            web.figures(page, 1)
            path, name = web.download(page, "CSV", waiting_for=f"inspect-{RUN}-state-norm.csv")
            rows = pd.read_csv(io.StringIO(path.read_text()), dtype={"input": str})
            assert name == f"inspect-{RUN}-state-norm.csv" and len(rows) == 3 * 12
            assert set(rows["input"]) == {"0 1 1 1 0 1 0 ="} and set(rows["run_key"]) == {RUN}
            page.close()
        browser.close()
