"""The Plan page on a cluster: GPU count, pins and links in the URL, the chosen layout, two layouts side by side.

Expected values come from the core (headroom.core.planning.advice.plan_and_advise on a request built here, not
through headroom.dashboard.planning), so a test fails if the page plans something else than the CLI would.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("streamlit")
import pandas as pd
from streamlit.dataframe_util import convert_arrow_bytes_to_pandas_df
from streamlit.testing.v1 import AppTest

from headroom.core.errors import ConfigError
from headroom.core.planning.advice import plan_and_advise
from headroom.core.planning.layout_search import PINNABLE
from headroom.core.planning.planner import Plan, PlanRequest
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.hardware import get_hardware
from headroom.core.specs.interconnect import default_cluster
from headroom.core.specs.layout import SINGLE, Layout
from headroom.core.specs.presets import get_preset
from headroom.core.timing.step import datasheet_profile
from headroom.core.units import GB
from headroom.dashboard import charts, colours, plan_tables, planning, widths
from headroom.dashboard.text import plain
from tests.dashboard_support import render_url

H100 = datasheet_profile(get_hardware("h100-sxm"))
SMALL = {"model": "bench-llama-small", "seq_len": "128", "global_batch": "8"}
"""8 heads, 4 key/value heads, 4 layers: every axis has a choice on 8 GPUs, and a search takes seconds."""


def core_plan(model: str, seq_len: int, global_batch: int, gpus: int, layout: Layout = SINGLE,
              pinned: frozenset[str] = frozenset()) -> Plan:
    """What `headroom plan --gpus` plans for the page's default precision, optimizer, attention and budget."""
    request = PlanRequest(spec=get_preset(model), train=TrainConfig(seq_len=seq_len, layout=layout),
                          global_batch=global_batch, gpus=gpus, pinned=pinned, cluster=default_cluster("h100-sxm"))
    return plan_and_advise(request, H100)


@pytest.fixture(scope="module")
def small_search() -> Plan:
    return core_plan("bench-llama-small", 128, 8, 8)


@pytest.fixture(scope="module")
def pipelined():
    """The page's plan of 8 GPUs with pp pinned at 2 (two rank kinds), and the core's."""
    inputs = planning.PlanInputs(model="bench-llama-small", seq_len=128, global_batch=8, gpus=8, pp="2")
    page = planning.make_plan(inputs, planning.resolve_preset(inputs.model), *planning.datasheet_hardware(inputs.hardware))
    return page, core_plan("bench-llama-small", 128, 8, 8, Layout(pp=2), frozenset({"pp"}))


def chart_data(at: AppTest, color: str) -> list[pd.DataFrame]:
    """The data of every chart whose colour encodes ``color`` (``term``: time by term; ``component``: memory)."""
    found = []
    for element in at.get("vega_lite_chart"):
        spec = json.loads(element.proto.spec)
        layers = spec.get("layer", [spec])
        if any(layer.get("encoding", {}).get("color", {}).get("field") == color for layer in layers):
            found.append(convert_arrow_bytes_to_pandas_df(element.proto.datasets[0].data.data))
    return found


# --- inputs -> request -----------------------------------------------------------------------------------------


def test_the_inputs_pin_every_field_of_a_layout():
    axes = {f for f in planning.PlanInputs.__dataclass_fields__ if f in PINNABLE}
    assert axes == set(PINNABLE), "a Layout field the page cannot pin (or a pin the search does not know)"
    assert all(getattr(planning.PlanInputs(), axis) == planning.AUTO for axis in PINNABLE)


def test_without_a_gpu_count_the_page_plans_one_layout():
    spec = get_preset("llama3.2-1b")
    request = planning.build_request(planning.PlanInputs(), spec, H100)
    assert request.gpus is None and request.pinned == frozenset()
    assert request.layout == Layout() and request.cluster is None  # one GPU, as `headroom plan` without --gpus
    eight = planning.build_request(planning.PlanInputs(dp="8", zero="3", reshard_after_forward="off"), spec, H100)
    assert eight.layout == Layout(dp=8, zero=3, reshard_after_forward=False)
    assert (eight.cluster.gpus_per_node, eight.cluster.intra.key, eight.cluster.inter.key) == (8, "nvlink4", "ib-ndr")
    tp = planning.build_request(planning.PlanInputs(tp="2"), spec, H100)
    assert tp.layout == Layout(tp=2)  # sp off unless pinned, as `headroom plan --tp 2` plans it
    assert planning.build_layout(planning.PlanInputs(tp="2", sp="on")) == Layout(tp=2, sp=True)
    assert planning.build_layout(planning.PlanInputs(pp="2", schedule="interleaved")) == \
        Layout(pp=2, schedule="interleaved", virtual_stages=2)
    assert planning.build_layout(planning.PlanInputs(pp="2", virtual_stages="4")).schedule == "interleaved"
    # One stage runs no pipeline: a schedule or virtual stages pinned without pp are dropped (and the page says so).
    assert planning.build_layout(planning.PlanInputs(schedule="interleaved")) == Layout()
    assert planning.build_layout(planning.PlanInputs(pp="1", virtual_stages="2")) == Layout()


def test_a_gpu_count_searches_and_keeps_what_is_pinned():
    inputs = planning.PlanInputs(gpus=64, tp="8", zero="1", gpus_per_node=4, interconnect="ib-hdr")
    request = planning.build_request(inputs, get_preset("llama3-8b"), H100)
    assert request.gpus == 64 and request.pinned == frozenset({"tp", "zero"})
    assert (request.layout.tp, request.layout.zero, request.layout.dp) == (8, 1, 1)
    assert (request.cluster.gpus_per_node, request.cluster.intra.key, request.cluster.inter.key) == (4, "nvlink4", "ib-hdr")
    assert planning.pins_text(request) == "tp 8, zero 1"
    pcie = planning.build_request(planning.PlanInputs(gpus=64, intra_node="pcie5-x16"), get_preset("llama3-8b"), H100)
    assert pcie.cluster.intra.key == "pcie5-x16"  # as `headroom plan --intra-node pcie5-x16`
    off = planning.build_request(planning.PlanInputs(gpus=8, sp="off", virtual_stages="2"), get_preset("llama3-8b"), H100)
    assert planning.pins_text(off) == "sp off, virtual stages 2"


def test_bad_inputs_raise_the_message_the_page_shows():
    spec = get_preset("llama3.2-1b")
    with pytest.raises(ConfigError) as core_error:
        TrainConfig(seq_len=4096, layout=Layout(tp=3)).check_model(spec)
    with pytest.raises(ConfigError) as page_error:
        planning.build_request(planning.PlanInputs(model="llama3.2-1b", gpus=8, tp="3"), spec, H100)
    assert str(page_error.value) == str(core_error.value) and "32 attention heads" in str(core_error.value)
    cases = {
        "cap of 4096": planning.PlanInputs(gpus=4097),
        "0 (plan the one layout) or a positive count": planning.PlanInputs(gpus=-8),
        "tp 'two' is neither auto nor a whole number": planning.PlanInputs(tp="two"),
        "sp on needs tp pinned": planning.PlanInputs(gpus=8, sp="on"),
        "unknown interconnect 'carrier-pigeon'; known: nvlink3": planning.PlanInputs(interconnect="carrier-pigeon",
                                                                                    dp="2"),
        "zero (sharding stage) must be 0, 1, 2 or 3, got 5": planning.PlanInputs(zero="5"),
        "unknown link 'nvlnk4' between the GPUs of a node": planning.PlanInputs(intra_node="nvlnk4", dp="2"),
    }
    for message, inputs in cases.items():
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            planning.build_request(inputs, spec, H100)


# --- frames and charts --------------------------------------------------------------------------------------------


def test_the_page_plans_what_the_core_plans(pipelined):
    page, core = pipelined
    assert [str(o.layout) for o in page.layouts] == [str(o.layout) for o in core.layouts]
    assert page.recommendation.layout == core.recommendation.layout
    assert page.recommendation.tokens_per_s == core.recommendation.tokens_per_s
    frame = plan_tables.layouts_frame(page)
    assert list(frame["layout"]) == [str(o.layout) for o in core.layouts]
    assert all(o.layout.pp == 2 for o in page.layouts)
    assert list(frame["why"]) == [o.why_lost(page.recommendation) for o in page.layouts]
    assert frame["why"].iloc[0] == "recommended"
    assert plan_tables.recommendation_text(page).endswith(f"on {core.recommendation.layout} (8 GPUs)")


def test_time_by_term_adds_up_to_the_step(pipelined):
    page, _ = pipelined
    winner, runner_up = (plan_tables.shown_candidate(o) for o in page.layouts[:2])
    frame = plan_tables.time_terms_frame(page, {"A": winner, "B": runner_up})
    assert tuple(winner.time.by_term()) == plan_tables.TIME_TERMS == tuple(colours.TIME)
    for row, candidate in (("A", winner), ("B", runner_up)):
        terms = frame[frame["row"] == row].set_index("term")["seconds"]
        assert list(terms.index) == list(plan_tables.TIME_TERMS)
        assert terms.sum() == pytest.approx(candidate.step_time_s, rel=1e-12)
        assert terms["bubble"] == pytest.approx(candidate.time.bubble_s)  # uncalibrated: factor 1
        assert terms["bubble"] > 0  # pp 2: the pipeline idles
    spec = charts.build_step_time_chart(frame).to_dict()
    assert spec["mark"]["type"] == "bar" and spec["encoding"]["x"]["stack"] == "zero"
    assert spec["encoding"]["color"]["field"] == "term" and spec["encoding"]["y"]["field"] == "row"
    assert spec["encoding"]["color"]["scale"]["domain"] == list(plan_tables.TIME_TERMS)
    assert spec["encoding"]["y"]["axis"] == {"labelLimit": 0}  # "tp 1, pp 2 (1f1b), cp 1, dp 4, zero 3" in full
    assert spec["encoding"]["color"]["legend"] == {"title": "term", "orient": "bottom", "direction": "horizontal",
                                                   "columns": 4, "symbolLimit": 0, "labelLimit": 0}
    # a step of a few milliseconds (its kernels' launches) reads in milliseconds; the data keeps its seconds
    assert 1e-4 < winner.step_time_s < 0.1
    assert spec["encoding"]["x"]["field"] == "time" and spec["encoding"]["x"]["title"] == "milliseconds per optimizer step"
    data = pd.DataFrame(spec["datasets"][spec["data"]["name"]])
    assert list(data["time"]) == pytest.approx(list(data["seconds"] * 1e3))


def test_memory_per_rank_kind_ends_at_what_the_most_loaded_rank_needs(pipelined):
    page, _ = pipelined
    best = page.recommendation
    frame = plan_tables.rank_memory_frame(page, {"": best})
    totals = frame.groupby("row")["gb"].sum()
    assert set(totals.index) == {r.rank.name for r in best.estimate.ranks} == {"first stage", "last stage"}
    assert totals.max() == pytest.approx(best.required_bytes / GB, abs=1e-8)
    first = frame[frame["row"] == "first stage"].set_index("component")["gb"]
    stage0 = next(r for r in best.estimate.ranks if r.rank.name == "first stage")
    assert first.drop("margin").to_dict() == pytest.approx({k: v / GB for k, v in stage0.peak_components.items()})
    tagged = plan_tables.rank_memory_frame(page, {"A": best, "B": plan_tables.shown_candidate(page.layouts[1])})
    assert {"A: first stage", "A: last stage", "B: first stage"} <= set(tagged["row"])
    bars, rule, label = charts.build_peak_bar_chart(frame, 80.0, row="row").to_dict()["layer"]
    assert bars["encoding"]["y"]["field"] == "row" and rule["encoding"]["x"]["field"] == "budget_gb"
    assert label["mark"]["text"] == "budget 80 GB"
    assert bars["encoding"]["y"]["axis"] == {"labelLimit": 0}


def test_collectives_and_the_comparison(pipelined):
    page, _ = pipelined
    best = page.recommendation
    comm = plan_tables.communication_frame(best)
    assert len(comm) == len(best.time.communication) and "pp" in set(comm["axis"])
    assert comm["seconds"].sum() == pytest.approx(sum(t.seconds for t in best.time.communication))
    first, second = plan_tables.layout_options(page)[:2]
    pair = plan_tables.comparison(page, first, second)
    assert pair["A"][1] is best and pair["A"][2] == "recommended"
    assert pair["B"][2] == page.layouts[1].why_lost(best)
    with pytest.raises(ConfigError, match="was not planned"):
        plan_tables.find_layout(page, "tp 9, pp 9, cp 9, dp 9, zero 9")


def test_searched_candidates_carry_their_layout(pipelined):
    page, _ = pipelined
    shown = plan_tables.shown_candidates(page)
    labels = plan_tables.peak_components_frame(page, shown).drop_duplicates("order")["candidate"]
    assert list(labels) == [f"{c.label} on {c.layout}" for c in shown]
    table = plan_tables.candidates_frame(page)
    assert list(table["layout"][: len(page.candidates)]) == [str(c.layout) for c in page.candidates]


def test_step_times_read_at_any_size():
    assert [plan_tables.seconds_text(s) for s in (12.3456, 0.1, 0.0123, 0.000112, 3.3e-5)] == \
        ["12.346 s", "0.100 s", "12.3 ms", "0.112 ms", "33 us"]


# --- the page -----------------------------------------------------------------------------------------------------


def test_a_search_over_8_gpus_shows_the_layout_and_its_time_by_term(monkeypatch, tmp_path, small_search):
    at = render_url(tmp_path, monkeypatch, {**SMALL, "gpus": "8"})
    best = small_search.recommendation
    subheaders = [s.value for s in at.subheader]
    assert f"Chosen layout: {best.layout}" in subheaders
    assert f"Layouts searched ({len(small_search.layouts)} of {len(small_search.layouts)} fit)" in subheaders
    (shown,) = [str(s.value) for s in at.success]
    assert shown.endswith(f"on {best.layout} (8 GPUs)")
    assert any("Communication from datasheet links" in c.value for c in at.caption)
    # 16 candidates within 1% of the fastest (FSDP resharded and kept gathered alike): one band, said under the
    # ranked table (the CLI ranks them 1=)
    assert small_search.band == 16
    assert "Ranks 1-16 are one band: within 1% of the fastest" in " ".join(c.value for c in at.caption)
    assert any(str(best.layout) in c.value for c in at.code)  # the exports carry the winner's layout
    chosen, compared = chart_data(at, "term")
    assert chosen["seconds"].sum() == pytest.approx(best.step_time_s, rel=1e-12)
    assert set(chosen["term"]) == set(plan_tables.TIME_TERMS) and set(compared["row"]) == {"A", "B"}
    layouts = next(d.value for d in at.dataframe if "why" in d.value.columns)
    assert list(layouts["layout"]) == [str(o.layout) for o in small_search.layouts]


def test_a_search_shows_its_tables_and_charts_in_full(monkeypatch, tmp_path, small_search):
    at = render_url(tmp_path, monkeypatch, {**SMALL, "gpus": "8", "budget": "1.05GB"})
    page = planning.make_plan(planning.PlanInputs(model="bench-llama-small", seq_len=128, global_batch=8, gpus=8,
                                                  budget="1.05GB"),
                              get_preset("bench-llama-small"), *planning.datasheet_hardware(planning.PlanInputs().hardware))
    assert page.recommendation is not None and page.rejected  # some layouts fit, some candidates do not
    layouts = next(d for d in at.dataframe if "why" in d.value.columns)
    # every layout name on one line, and the reason a layout lost wrapped whole in what the other columns leave of
    # the page at 1,440 px; the search's GPU count and "fits" are left out (every layout has the one, a missing rank
    # says the other)
    assert list(layouts.proto.column_order) == ["rank", "layout", "tokens_per_s", "step_time_s", "required_gb", "why"]
    assert layouts.proto.placeholder == "-"
    shown_whole(layouts, one_line=("layout",), wrapped="why")
    rejected = next(d for d in at.dataframe if "broken_by" in d.value.columns)
    # a layout leaves no room for a rejected candidate's tokens/s; what breaks the budget wraps, whole
    assert list(rejected.value.columns) == ["candidate", "layout", "required_gb", "over_gb", "broken_by"]
    assert list(rejected.value["required_gb"]) == sorted(c.required_bytes / GB for c in page.rejected)
    shown_whole(rejected, one_line=("candidate", "layout"), wrapped="broken_by")
    # the memory chart draws the closest rejected candidate with its layout, as its caption names it
    closest = plan_tables.closest_rejected(page)
    label = f"{closest.label} on {closest.layout}"
    (memory,) = [d for d in chart_data(at, "component") if "candidate" in d.columns]
    assert label in set(memory["candidate"])
    assert any(f"the closest rejected candidate, {label}, needs" in c.value for c in at.caption)
    # the scatter spans the decision window and draws the Pareto front inside it; the toggle adds the rest
    specs = [json.loads(e.proto.spec) for e in at.get("vega_lite_chart")]
    (points,) = [layer for spec in specs for layer in spec.get("layer", [spec]) if "shape" in layer["encoding"]]
    window = plan_tables.decision_window(page)
    assert points["encoding"]["x"]["scale"]["domain"] == list(window)
    table = plan_tables.candidates_frame(page)
    inside = plan_tables.in_window(table, window)
    on_front = plan_tables.pareto_front(table) & inside
    (drawn,) = chart_data(at, "fits")
    assert sorted(drawn["candidate"]) == sorted(table.loc[on_front, "candidate"]) and 0 < len(drawn) < inside.sum()
    assert at.toggle(key="candidates_cloud").value is False
    at.toggle(key="candidates_cloud").set_value(True).run()
    (scatter,) = [e for e in at.get("vega_lite_chart") if "fits" in e.proto.spec]
    assert sum(len(convert_arrow_bytes_to_pandas_df(d.data.data)) for d in scatter.proto.datasets
               if "required_gb" in convert_arrow_bytes_to_pandas_df(d.data.data)) == int(inside.sum())


def shown_whole(table, one_line: tuple[str, ...], wrapped: str) -> None:
    """``table`` (an st.dataframe) fits the page at 1,440 px and shows its texts whole: each of ``one_line`` on
    one line, ``wrapped`` over rows tall enough to hold its longest text (headroom.dashboard.widths' font)."""
    config = json.loads(table.proto.columns)
    shown = list(table.proto.column_order) or list(table.value.columns)
    width = {name: config[name]["width"] for name in shown}
    assert sum(width.values()) <= widths.MAIN_PX, width
    for name in one_line:
        assert all(widths.text_px(text) + 2 * widths.CELL_PADDING_PX <= width[name] for text in table.value[name])
    lines = max(widths.wrapped_lines(text, width[wrapped]) for text in table.value[wrapped])
    assert lines > 1 and table.proto.row_height > widths.WRAPS_ABOVE_PX  # so Streamlit wraps the cells
    assert table.proto.row_height >= widths.FONT_PX * (1 + widths.LINE_HEIGHT * (lines - 1))


def test_pins_in_the_url_are_honoured(monkeypatch, tmp_path):
    at = render_url(tmp_path, monkeypatch, {**SMALL, "gpus": "8", "tp": "2", "zero": "1", "interconnect": "ib-hdr"})
    expected = core_plan("bench-llama-small", 128, 8, 8, Layout(tp=2, zero=1), frozenset({"tp", "zero"}))
    assert at.text_input(key="plan_tp").value == "2" and at.text_input(key="plan_zero").value == "1"
    assert at.text_input(key="plan_dp").value == planning.AUTO
    layouts = next(d.value for d in at.dataframe if "why" in d.value.columns)
    assert list(layouts["layout"]) == [str(o.layout) for o in expected.layouts]
    assert all(layout.startswith("tp 2 +sp,") and layout.endswith("zero 1") for layout in layouts["layout"])
    assert f"Chosen layout: {expected.recommendation.layout}" in [s.value for s in at.subheader]
    assert any("with tp 2, zero 1 pinned" in m.value for m in at.markdown)
    assert any("InfiniBand HDR" in c.value for c in at.caption)
    assert at.query_params["tp"] in ("2", ["2"]) and at.query_params["dp"] in ("auto", ["auto"])


def test_a_bad_pin_shows_the_error_message(monkeypatch, tmp_path):
    at = render_url(tmp_path, monkeypatch, {"model": "llama3.2-1b", "gpus": "8", "tp": "3"})
    with pytest.raises(ConfigError) as expected:
        TrainConfig(seq_len=4096, layout=Layout(tp=3)).check_model(get_preset("llama3.2-1b"))
    assert "use --tp among 1, 2, 4, 8, 16" in str(expected.value)  # the CLI's words; the page names its control
    assert [e.value for e in at.error] == [plain(str(expected.value).replace("--tp", "tp (tensor)"))]  # as text
    assert not at.success and not at.get("vega_lite_chart")


def test_the_gpu_count_is_capped(monkeypatch, tmp_path):
    at = render_url(tmp_path, monkeypatch, {**SMALL, "gpus": "8192"})
    (error,) = [e.value for e in at.error]
    assert "8192 GPUs is over this page's cap of 4096" in error and "headroom plan --gpus 8192" in error


def test_the_compare_view_shows_two_layouts(monkeypatch, tmp_path, small_search):
    at = render_url(tmp_path, monkeypatch, {**SMALL, "gpus": "8"})
    outcomes, winner = small_search.layouts, small_search.recommendation
    assert at.selectbox(key="compare_a").value == str(outcomes[0].layout)  # the recommendation
    assert at.selectbox(key="compare_b").value == str(outcomes[1].layout)  # and the runner-up
    markdown = [m.value for m in at.markdown]
    assert any(m.startswith(f"**A: {outcomes[0].layout}**") for m in markdown)
    assert any(m.startswith(f"**B: {outcomes[1].layout}**") for m in markdown)
    assert "**Why it lost:** recommended" in markdown
    assert f"**Why it lost:** {outcomes[1].why_lost(winner)}" in markdown

    other = outcomes[-1]
    at.selectbox(key="compare_b").set_value(str(other.layout)).run()
    assert not at.exception
    markdown = [m.value for m in at.markdown]
    assert any(m.startswith(f"**B: {other.layout}**") for m in markdown)
    assert f"**Why it lost:** {other.why_lost(winner)}" in markdown
    _, compared = chart_data(at, "term")
    b = plan_tables.shown_candidate(other)
    assert compared.loc[compared["row"] == "B", "seconds"].sum() == pytest.approx(b.step_time_s, rel=1e-12)
    memory = chart_data(at, "component")[1]  # chosen layout's ranks, then A and B's
    assert any(row.startswith("B: ") for row in memory["row"])


def test_a_search_past_the_pages_time_limit_says_how_far_it_got(monkeypatch, tmp_path):
    """The page's work is bounded: a URL asking for thousands of GPUs cannot keep the server busy for minutes."""
    monkeypatch.setattr(planning, "PAGE_TIME_LIMIT_S", 0.0)  # spent at once: one layout tried
    every = core_plan("bench-llama-small", 128, 8, 8)
    at = render_url(tmp_path, monkeypatch, {**SMALL, "gpus": "8", "budget": "1.01GB"})
    assert [w.value for w in at.warning] == [(
        "The search stopped at this page's limit of 0 s: 1 layout tried, those that could be fastest first, "
        f"{len(every.layouts) + len(every.pruned) - 1} left untried. `headroom plan --gpus 8` searches on without a "
        "time limit.")]
    assert at.error[0].value.startswith("**Recommendation:** Nothing fits the 1.0 GB budget on the 1 layout of 8 "
                                        "GPUs tried")


def test_a_search_says_what_forced_its_split(monkeypatch, tmp_path):
    """At a 1.2 GB budget no layout of 8 GPUs that keeps the whole model on each rank fits s=4096: the page says so
    under the chosen layout, as `headroom plan` does."""
    query = {"model": "bench-llama-small", "seq_len": "4096", "global_batch": "8", "gpus": "8", "budget": "1.2GB"}
    at = render_url(tmp_path, monkeypatch, query)
    captions = " ".join(c.value for c in at.caption)  # as Markdown: plain() escapes what would be markup
    assert plain("Forced by memory: no layout over fewer than 2 model-parallel ranks fits; the closest, tp 1, pp 1, "
                 "cp 1, dp 8, zero 3") in captions
