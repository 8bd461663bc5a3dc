"""dashboard.caching, the dashboard's own caches and its two uses of private APIs: pinned to the Streamlit and
Altair versions they were written for, and each private use checked against what the public API does."""

import inspect
from importlib.metadata import version

import altair as alt
import pandas as pd
from streamlit.testing.v1 import AppTest

from dashboard import caching


def test_written_for_the_installed_streamlit_and_altair():
    """A new Streamlit or Altair fails here first: check the private uses below against it (do they still exist,
    take the same arguments, do what the public API does), then record the versions in caching.WRITTEN_FOR."""
    installed = {name: version(name) for name in caching.WRITTEN_FOR}
    assert installed == caching.WRITTEN_FOR, (
        f"dashboard/caching.py was written for {caching.WRITTEN_FOR}, installed: {installed}; re-check its private "
        "uses (streamlit.elements.vega_charts._convert_altair_to_vega_lite_spec, "
        "altair.utils.schemapi._FromDict.__init__) and update WRITTEN_FOR"
    )


def test_the_private_names_are_there_with_the_arguments_used():
    from altair.utils import schemapi
    from streamlit.elements import vega_charts

    convert = vega_charts._convert_altair_to_vega_lite_spec
    assert list(inspect.signature(convert).parameters)[:1] == ["altair_chart"]
    caching.keep_altair_schema_table()  # patched or not, __init__ takes the wrapper classes and keeps class_dict
    table = schemapi._FromDict(schemapi.SchemaBase.__subclasses__())
    assert isinstance(table.class_dict, dict) and table.class_dict


def test_a_kept_spec_is_what_streamlit_makes_of_the_chart():
    """vega_spec: the private conversion, kept per chart object, gives what st.altair_chart sends (also checked on
    whole pages: tests/test_dashboard.py, test_a_figure_sends_what_st_altair_chart_sends...)."""

    def both():
        import altair as alt
        import pandas as pd
        import streamlit as st

        from dashboard import caching

        frame = pd.DataFrame({"x": [1, 2, 3], "y": [0.2, 0.5, 0.4]})
        chart = alt.Chart(frame).mark_line().encode(x="x:Q", y="y:Q").properties(name="line")
        st.altair_chart(chart, width="stretch")
        st.vega_lite_chart(dict(caching.vega_spec(chart)), width="stretch")
        assert caching.vega_spec(chart) is caching.vega_spec(chart)  # made once per chart object

    at = AppTest.from_function(both).run()
    assert not at.exception
    direct, kept = at.get("vega_lite_chart")
    assert direct.proto.spec == kept.proto.spec and direct.proto.datasets == kept.proto.datasets


def test_altair_builds_its_schema_table_once_per_process(monkeypatch):
    """keep_altair_schema_table: the same chart as without the patch, and no schema hashed again per encode()."""
    from altair.utils import schemapi

    def chart():
        frame = pd.DataFrame({"n": [1, 2], "accuracy": [0.5, 0.6], "boundary": ["norm", "none"]})
        return alt.Chart(frame).mark_line().encode(x="n:Q", y=alt.Y("accuracy:Q", title="accuracy"), color="boundary:N")

    before = chart().to_dict()
    caching.keep_altair_schema_table()
    calls = []
    original = schemapi._FromDict.hash_schema.__func__
    monkeypatch.setattr(schemapi._FromDict, "hash_schema", classmethod(lambda cls, *a, **k: calls.append(1) or
                                                                         original(cls, *a, **k)))  # fmt: skip
    chart()  # the table is built at most once, here
    calls.clear()
    assert chart().to_dict() == before
    assert not calls  # without the kept table: some 570 schemas hashed for each encoded channel
