"""The inspector's figure: one input's readout per loop step, one line per run mode (a pure Altair builder, no
Streamlit in here, as dashboard/charts.py)."""

from __future__ import annotations

import altair as alt
import pandas as pd

from dashboard.caching import memoized
from dashboard.charts import AUTOSIZE, DASH_LEGEND, HEIGHT, MODE_COLORS, N_TITLE, WIDTH

# each run mode keeps its colour (the three shared with every page, Okabe-Ito; the two only the inspector draws)
COLORS = MODE_COLORS | {"none->norm": "#56B4E9", "norm->rescale": "#009E73"}
QUANTITIES = {  # the figure's choice (also its URL value) -> (columns drawn, y title)
    "margin": (("margin",), "margin: log p(right) − log p(wrong)"),
    "top-token share": (("top_share",), "top token's probability"),
    "state norm": (("norm_post", "norm_pre"), "state norm at the answer position"),
}
NORM_SIDES = {"norm_post": "after the boundary (handed on)", "norm_pre": "before the boundary"}


def long_rows(rows: pd.DataFrame, quantity: str) -> pd.DataFrame:
    """The inspector's rows (engine.core.inspector.COLUMNS) as one value per (mode, n, side) for the figure."""
    columns, _ = QUANTITIES[quantity]
    out = pd.concat([rows.assign(side=NORM_SIDES.get(c, quantity), value=rows[c]) for c in columns], ignore_index=True)
    return out.assign(verdict=out["correct"].map({True: "right", False: "wrong"}))


@memoized()
def steps_chart(rows: pd.DataFrame, quantity: str, T: int) -> alt.LayerChart:
    """`quantity` against n, one colour per mode; a circle where the answer is right, a cross where it is wrong;
    the state norm's two sides told apart by dash; the trained budget T a dashed grey rule, the margin's zero (where
    the answer turns) a dotted one."""
    data = long_rows(rows, quantity)
    modes = list(dict.fromkeys(data["mode"]))
    color = alt.Color("mode:N", title="run mode", scale=alt.Scale(domain=modes, range=[COLORS.get(m, "#000000")
                                                                                      for m in modes]))  # fmt: skip
    x = alt.X("n:Q", title=N_TITLE, axis=alt.Axis(tickMinStep=1))
    y = alt.Y("value:Q", title=QUANTITIES[quantity][1], scale=alt.Scale(zero=quantity != "margin"))
    tooltip = ["mode:N", "n:Q", "answer:N", "verdict:N", "top_token:N", alt.Tooltip("top_share:Q", format=".3f"),
               alt.Tooltip("margin:Q", format=".3f"), "side:N", alt.Tooltip("value:Q", format=".4g")]  # fmt: skip
    dash = (
        alt.StrokeDash("side:N", title="state norm", legend=DASH_LEGEND) if quantity == "state norm" else alt.Undefined
    )
    base = alt.Chart(data).encode(x=x, y=y, color=color, detail="side:N", tooltip=tooltip)
    lines = base.mark_line().encode(strokeDash=dash).properties(name="steps")
    shapes = alt.Scale(domain=["right", "wrong"], range=["circle", "cross"])
    points = base.mark_point(size=60, filled=True).encode(
        shape=alt.Shape("verdict:N", title="answer", scale=shapes)
    ).properties(name="answers")  # fmt: skip
    budget = pd.DataFrame({"x": [T], "label": [f"trained budget T = {T}"]})
    layers = [
        lines,
        points,
        alt.Chart(budget).mark_rule(strokeDash=[6, 4], color="#777777").encode(x="x:Q", tooltip=["label:N"])
        .properties(name="budget"),
    ]  # fmt: skip
    if quantity == "margin":
        zero = pd.DataFrame({"y": [0.0], "label": ["margin 0: the answer turns"]})
        rule = alt.Chart(zero).mark_rule(strokeDash=[2, 3], color="#666666").encode(y="y:Q", tooltip=["label:N"])
        layers.append(rule.properties(name="zero"))
    return alt.layer(*layers).properties(width=WIDTH, height=HEIGHT, autosize=AUTOSIZE)
