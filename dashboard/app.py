"""The foreshock dashboard (``foreshock dashboard``): five pages over the run history."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from foreshock.dashboard.auth import gate

PAGES = (
    Path(__file__).parent / "views"
)  # not "pages/": that name turns on Streamlit's legacy multipage mode

st.set_page_config(page_title="foreshock", page_icon="⚡", layout="wide")
gate()  # with --auth: a login or refusal page, and nothing below, unless the user is allowed
navigation = st.navigation(
    [
        st.Page(PAGES / "fleet.py", title="Fleet", default=True),  # served at /
        st.Page(PAGES / "run.py", title="Run", url_path="run"),
        st.Page(PAGES / "compare.py", title="Compare", url_path="compare"),
        st.Page(PAGES / "tuning.py", title="Tuning", url_path="tuning"),
        st.Page(PAGES / "profiles.py", title="Profiles", url_path="profiles"),
    ]
)
navigation.run()
