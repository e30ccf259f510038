"""What every page says when the store cannot be read: empty, outdated, broken."""

from __future__ import annotations

import shlex

import streamlit as st

from headroom.dashboard.data import StoreState
from headroom.db.errors import StoreError

AGENT_COMMAND = "headroom agent run --suite quick"


def agent_command(url: str) -> str:
    """The agent's command that fills the store at ``url``: with ``--db`` unless it is the default file (its
    password hidden: a page never shows one)."""
    from headroom.db.engine import display_url
    from headroom.db.location import default_url

    return AGENT_COMMAND if url == default_url() else f"{AGENT_COMMAND} --db {shlex.quote(display_url(url))}"


def store_notice(state: StoreState) -> None:
    """Explain a store the page cannot read, and what to run; nothing for a readable store."""
    if state.status == "missing":
        st.info(
            f"No measurements yet in `{state.url}`. Run the benchmark agent on each GPU box "
            "(`--suite smoke --device cpu` on a machine without a GPU), then reload:"
        )
        st.code(agent_command(state.url), language="sh")
        st.caption("Planning from datasheets works without any measurement (Plan page).")
    elif state.status == "outdated":
        st.warning("This store was written by an older headroom. The dashboard only reads and never migrates; "
                   "upgrade the store with:")
        st.code(state.upgrade_command or "", language="sh")
        st.caption(state.message)
    elif state.status == "error":
        st.error(state.message)


def readable_store() -> str:
    """The store URL when it can be read; otherwise explain why and stop the page."""
    from headroom.dashboard.data import store_state, store_url

    url = store_url()
    state = store_state(url)
    if not state.ok:
        store_notice(state)
        st.stop()
    return url


def store_failed(err: StoreError) -> None:
    """A page stopped by a store error that a query met (damage that appeared after the store was opened and
    checked): its message, which names the store and what is wrong. The store is closed, so the next visit
    opens it again and checks it whole (headroom.dashboard.data.store)."""
    from headroom.dashboard.data import store, store_url

    try:
        store(store_url()).close()  # the cached one: its connections go now, not when it is collected
    except StoreError:
        pass  # not cached, and refused again on opening
    store.clear()
    st.error(str(err))
