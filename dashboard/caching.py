"""The dashboard's own caches and its two uses of private APIs, in one place: everything else caches with
Streamlit's st.cache_data / st.cache_resource.

Caches (bounded, shared by every session of the process, computed once when visitors ask at once: Kept):
    memoized   the chart builders (dashboard.charts): the same Altair chart object for the same input values
    derived    what a page computes from a table's rows, keyed on the table's state and the page's choices
    vega_spec  a chart's Vega-Lite spec, made once per chart object
Private APIs (tests/test_caching.py pins them to WRITTEN_FOR, the versions they were written against, and checks
that each still does what the public API does):
    vega_spec                 calls streamlit.elements.vega_charts._convert_altair_to_vega_lite_spec, the conversion
                              st.altair_chart makes on every run, so that a kept spec is sent as st.vega_lite_chart
    keep_altair_schema_table  patches altair.utils.schemapi._FromDict.__init__ to build Altair's table of its schema
                              classes once per process instead of once per `encode()`
No Streamlit at import: dashboard.charts (and the static report) import this module.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    import altair as alt

WRITTEN_FOR = {"streamlit": "1.67.0", "altair": "6.3.0"}  # the installed versions the private uses were checked on


class _Unkeyable(Exception):
    """An argument the memo cannot key on: the chart is built afresh."""


def _key(value) -> tuple:
    """A key that is equal exactly when the inputs are: frames by their columns, dtypes, index and every value
    (pandas' row hashes, digested), everything else by type and value."""
    if isinstance(value, pd.DataFrame | pd.Series):
        frame = value.to_frame() if isinstance(value, pd.Series) else value
        try:
            rows = pd.util.hash_pandas_object(frame, index=True).to_numpy().tobytes()
        except TypeError as e:  # a cell pandas cannot hash (a list, a dict)
            raise _Unkeyable from e
        columns = tuple((str(c), str(t)) for c, t in frame.dtypes.items())
        return (type(value).__name__, columns, frame.shape, hashlib.sha256(rows).hexdigest())
    if isinstance(value, tuple | list):
        return (type(value).__name__, *(_key(v) for v in value))
    if isinstance(value, dict):
        return ("dict", *((str(k), _key(v)) for k, v in value.items()))
    if value is None or isinstance(value, str | bool | int | float):
        return (type(value).__name__, value)
    if isinstance(value, np.generic):  # a numpy scalar (np.int64 from a frame): by its type and value
        return (type(value).__name__, value.item())
    raise _Unkeyable(type(value).__name__)


class Kept:
    """A bounded cache (the last `size` keys) whose values are computed once per key, also when several threads ask
    for one at once: the first computes, the others wait for its value instead of computing it again beside it (on
    a cold server N visitors arrive together, and N copies of each computation would cost N times the CPU)."""

    def __init__(self, size: int):
        self.size, self.values, self.pending = size, OrderedDict(), {}
        self.lock = threading.Lock()

    def get(self, key, compute):
        while True:
            with self.lock:
                if key in self.values:
                    self.values.move_to_end(key)
                    return self.values[key]
                waiting, mine = self.pending.get(key), False
                if waiting is None:
                    waiting, mine = threading.Event(), True
                    self.pending[key] = waiting
            if not mine:
                waiting.wait()  # then read what it computed (or compute it here, if that failed or was dropped)
                continue
            try:
                value = compute()
                with self.lock:
                    self.values[key] = value
                    while len(self.values) > self.size:
                        self.values.popitem(last=False)
                return value
            finally:
                with self.lock:
                    self.pending.pop(key, None)
                waiting.set()

    def clear(self) -> None:
        with self.lock:
            self.values.clear()


def memoized(size: int = 128):
    """The same chart object for the same inputs (compared by value: _key), the last `size` of them kept. A page
    draws the same figures on every rerun and for every visitor: building and validating an Altair chart costs
    10-60 ms, and the same object lets the page's caller keep its Vega-Lite spec (dashboard.ui.figure). The
    charts returned are shared, so no caller may change one in place (Altair's `properties` and friends copy)."""

    def wrap(build):
        kept = Kept(size)

        @functools.wraps(build)
        def memo(*args, **kwargs):
            try:
                key = _key((args, kwargs))
            except _Unkeyable:
                return build(*args, **kwargs)
            return kept.get(key, lambda: build(*args, **kwargs))

        memo.cache_clear = kept.clear
        return memo

    return wrap


_derived = Kept(256)  # data.table's rows, what the pages compute from them (derived)


def derived(key: tuple | None, compute: Callable):
    """compute(), kept under `key` (the last 256): what a page computes from a table's rows, keyed on the table's
    key (Table.key: its path, size and mtime, so a rewritten table is computed again) and on every choice the rows
    were filtered by. key None: computed every time. The results are shared between sessions: never changed in
    place. Spares a repeat view the pandas work on the table (filters, groupings over its ~70k rows); visitors who
    ask at once wait for one computation (Kept)."""
    return compute() if key is None else _derived.get(key, compute)


_altair_table_kept = False


def keep_altair_schema_table() -> None:
    """Build Altair's table of its schema classes once per process. Altair rebuilds it (hashing some 600 JSON
    schemas) inside every `from_dict`, which every `encode()` calls: about 12 ms each, 0.35 s of a page's 0.8 s of
    CPU on a repeat view of the accuracy page. The table depends only on the classes, which do not change."""
    global _altair_table_kept
    if _altair_table_kept:
        return
    from altair.utils import schemapi  # PRIVATE: patched below (WRITTEN_FOR)

    build, tables = schemapi._FromDict.__init__, {}

    def init(self, wrapper_classes, /) -> None:
        classes = tuple(wrapper_classes)
        if classes not in tables:
            build(self, classes)
            tables[classes] = self.class_dict
        self.class_dict = tables[classes]

    schemapi._FromDict.__init__ = init
    _altair_table_kept = True


_specs = Kept(256)  # id(chart) -> (chart, its Vega-Lite spec), the chart kept so its id stays its own


def vega_spec(chart: alt.TopLevelMixin) -> dict:
    """The Vega-Lite spec Streamlit sends for an Altair chart (its data as Arrow datasets), made once per chart
    object: the chart builders return the same object for the same inputs (memoized), so a rerun or another
    visitor's view of the same figure skips Altair's to_dict and its schema validation (30-60 ms a figure)."""
    from streamlit.elements import vega_charts  # PRIVATE: Streamlit's own conversion (WRITTEN_FOR)

    for _ in range(2):
        kept, spec = _specs.get(id(chart), lambda: (chart, vega_charts._convert_altair_to_vega_lite_spec(chart)))
        if kept is chart:
            return spec
        with _specs.lock:  # another chart had this id (gone since): made again
            _specs.values.pop(id(chart), None)
    return vega_charts._convert_altair_to_vega_lite_spec(chart)
