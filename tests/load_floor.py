"""The floor of `tests/loadcheck.py --floor`: Streamlit's own cost per visitor, with nothing of loopscope in it.

Two pages shaped like the session the load check drives: an overview that writes a table like the verdict matrix
and an `accuracy` page with one small Altair line chart. What a session costs here, the browser's CPU above all,
is what any Streamlit app costs on the machine; the dashboard cannot cost less.

    streamlit run tests/load_floor.py
"""

import altair as alt
import pandas as pd
import streamlit as st


def overview() -> None:
    st.title("Overview")
    st.html('<table class="verdicts"><tr><td>claim</td><td>Paper:</td></tr></table>')


def accuracy() -> None:
    st.title("Accuracy")
    frame = pd.DataFrame({"n": range(1, 13), "accuracy": [0.5 + 0.04 * i for i in range(12)]})
    st.altair_chart(alt.Chart(frame).mark_line(point=True).encode(x="n", y="accuracy"))


st.navigation([st.Page(overview, title="Overview", default=True), st.Page(accuracy, url_path="accuracy")]).run()
