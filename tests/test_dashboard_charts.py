"""Chart builders and the pages' logic, on real plans and a real smoke store."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

pytest.importorskip("altair")
import altair as alt  # noqa: E402
import pandas as pd  # noqa: E402

from headroom.core.specs.hardware import get_hardware  # noqa: E402
from headroom.core.timing.roofline import matmul_intensity, ridge_intensity  # noqa: E402
from headroom.core.units import GB  # noqa: E402
from headroom.dashboard import (  # noqa: E402
    calibration,
    charts,
    colours,
    data,
    history,
    plan_tables,
    planning,
    roofs,
)


def layers(chart) -> list[dict]:
    spec = chart.to_dict()
    return spec.get("layer", [spec])


def fields(layer: dict) -> dict[str, str]:
    return {channel: enc.get("field") for channel, enc in layer["encoding"].items() if isinstance(enc, dict)}


def legend_of(columns: int, title: str, orient: str = "bottom") -> dict:
    """What every legend is: under the plot (or above it), ``columns`` entries a row, every entry and label in full."""
    return {"title": title, "orient": orient, "direction": "horizontal", "columns": columns, "symbolLimit": 0,
            "labelLimit": 0}


def assert_reads_in_full(chart) -> None:
    """Drawn as SVG at the page's width; every axis with labels at full length, every legend `legend_of`."""
    spec = chart.to_dict()
    assert spec["usermeta"] == {"embedOptions": {"renderer": "svg"}}
    assert spec["autosize"] == {"type": "fit-x", "contains": "padding"}
    assert spec["padding"] in (charts.PADDING, charts.ROOM_ABOVE)
    axes: dict[str, list[dict]] = {"x": [], "y": []}
    for layer in spec.get("layer", [spec]):
        for channel, encoding in layer["encoding"].items():
            if channel in axes and "axis" in encoding:
                axes[channel].append(encoding["axis"])
            if channel in ("color", "shape", "strokeDash") and "field" in encoding:
                legend = encoding["legend"]
                assert legend == legend_of(legend["columns"], legend["title"], legend["orient"]), (channel, legend)
                assert legend["orient"] in ("bottom", "top")
    for channel, found in axes.items():
        assert found and all(axis["labelLimit"] == 0 for axis in found), (channel, found)


EIGHT_RANKS = planning.PlanInputs(model="llama2-7b", seq_len=4096, dp="8", zero="3", reshard_after_forward="off")
"""llama2-7b at 4096 tokens on eight data-parallel ranks, FSDP kept gathered to backward (plain PyTorch's ZeRO-2;
ZeRO-2 itself was the page's default before it took
``headroom plan``'s one GPU): the plan whose numbers these tests pin."""


@pytest.fixture(scope="module")
def default_plan():
    inputs = EIGHT_RANKS
    return planning.make_plan(inputs, planning.resolve_preset(inputs.model), *planning.datasheet_hardware(inputs.hardware))


def test_peak_bar_stacks_components_up_to_the_required_bytes_against_the_budget(default_plan):
    shown = plan_tables.shown_candidates(default_plan)
    frame = plan_tables.peak_components_frame(default_plan, shown)
    for candidate in shown:  # components + margin add up to what must fit
        total = frame.loc[frame["candidate"] == candidate.label, "gb"].sum()
        assert total == pytest.approx(candidate.required_bytes / GB, rel=1e-9)
    chart = charts.build_peak_bar_chart(frame, 80.0)
    assert isinstance(chart, alt.LayerChart)
    bars, rule, label = layers(chart)
    assert bars["mark"]["type"] == "bar" and fields(bars)["color"] == "component" and fields(bars)["y"] == "candidate"
    assert bars["encoding"]["x"]["stack"] == "zero"
    assert rule["mark"]["type"] == "rule" and fields(rule)["x"] == "budget_gb"
    assert label["mark"]["type"] == "text" and label["mark"]["text"] == "budget 80 GB" and fields(label)["x"] == "budget_gb"
    assert chart.to_dict()["padding"] == {"top": 22, "left": 5, "right": 8, "bottom": 5}  # room for the label
    # above the plot, on the side of the rule with room: left of it in the plot's right half (80 of 80.3 GB)
    assert {k: label["mark"][k] for k in ("align", "dx", "dy", "y", "baseline")} == \
        {"align": "right", "dx": -4, "dy": -4, "y": 0, "baseline": "bottom"}
    _, _, low_label = layers(charts.build_peak_bar_chart(frame, 20.0))
    assert (low_label["mark"]["text"], low_label["mark"]["align"], low_label["mark"]["dx"]) == ("budget 20 GB", "left", 4)
    assert charts.budget_text(24 * 2**30 / 1e9) == "budget 25.77 GB"
    assert_reads_in_full(chart)
    assert bars["encoding"]["color"]["legend"] == legend_of(4, "component")
    # the legend names what the bars hold, in plain words and stacking order, each in its fixed colour
    held = [charts.plain_name(name) for name in frame.loc[frame["gb"] > 0, "component"].unique()]
    scale = bars["encoding"]["color"]["scale"]
    assert scale["domain"] == [name for name in colours.MEMORY if name in held]
    assert scale["range"] == [colours.MEMORY[name] for name in scale["domain"]]
    assert {"parameters", "optimizer states", "gathered parameters", "activations", "margin"} <= set(scale["domain"])
    # 0 GB: FSDP gathers bf16 units, so autocast keeps no weight copies
    assert "weight_copies" not in scale["domain"] and "weight copies" not in scale["domain"]


def test_the_memory_chart_shows_the_fitting_candidates_and_the_closest_rejected_one(default_plan):
    shown = plan_tables.shown_candidates(default_plan)
    closest = min(default_plan.rejected, key=lambda c: c.required_bytes)
    assert plan_tables.closest_rejected(default_plan) is closest
    assert shown == [*default_plan.candidates[:5], closest]
    assert closest.label == "micro 2 x accum 4, selective" and round(closest.required_bytes / GB, 1) == 80.3
    drawn = plan_tables.peak_components_frame(default_plan, shown).drop_duplicates("order")["candidate"]
    assert list(drawn)[-1] == closest.label
    assert plan_tables.shown_text(default_plan, shown) == (
        "The 5 fastest fitting candidates, and the closest rejected candidate, micro 2 x accum 4, selective, needs "
        "80.3 GB, 0.3 GB over the budget.")


def test_when_nothing_fits_the_memory_chart_shows_the_candidate_the_advice_names():
    inputs = EIGHT_RANKS.with_(budget="20GB")
    tight = planning.make_plan(inputs, planning.resolve_preset(inputs.model), *planning.datasheet_hardware(inputs.hardware))
    assert tight.recommendation is None
    closest = plan_tables.closest_rejected(tight)
    assert f"the closest candidate ({closest.label}) needs {closest.required_bytes / GB:.1f} GB" in tight.advice[0]
    assert plan_tables.shown_candidates(tight) == [closest]
    assert plan_tables.shown_text(tight, [closest]).startswith(f"Nothing fits: the closest rejected candidate, "
                                                             f"{closest.label}, needs")
    # the scatter spans the budget to a bit beyond the closest candidate
    span = max(closest.required_bytes / GB - 20, 2.0)
    assert plan_tables.decision_window(tight) == pytest.approx((20 - 0.1 * span, closest.required_bytes / GB + 0.5 * span))


def test_the_pareto_front_of_a_hand_made_frame():
    """On the front: faster than every row needing less memory; of rows needing the same memory, only the
    fastest; rows equal in both, together."""
    table = pd.DataFrame({
        "candidate": ["a", "b", "c", "d", "e", "f", "g", "h", "i"],
        "required_gb": [10.0, 10.0, 15.0, 20.0, 20.0, 30.0, 40.0, 40.0, 50.0],
        "tokens_per_s": [5.0, 3.0, 5.0, 8.0, 8.0, 7.0, 9.0, 2.0, 9.0],
    }, index=[7, 3, 9, 1, 0, 4, 2, 8, 6])  # an index out of order: the result is aligned to it, not to positions
    front = plan_tables.pareto_front(table)
    assert front.dtype == bool and list(front.index) == list(table.index)
    # a: lightest and fastest at 10 GB; b: slower at the same memory; c: no faster than a on more memory;
    # d and e: equal in both, both on it; f: slower than d on more; g: fastest of 40 GB, h slower at the same
    # memory; i: only as fast as g on more memory
    assert table.loc[front, "candidate"].tolist() == ["a", "d", "e", "g"]
    single = pd.DataFrame({"required_gb": [12.5], "tokens_per_s": [100.0]}, index=[5])
    assert plan_tables.pareto_front(single).tolist() == [True]
    assert plan_tables.pareto_front(table.iloc[:0]).tolist() == []
    assert plan_tables.pareto_front(table, memory="tokens_per_s", throughput="required_gb").any()  # any two columns


def test_the_front_of_a_real_plan_is_what_the_scatter_draws(default_plan):
    table = plan_tables.candidates_frame(default_plan)
    front = plan_tables.pareto_front(table)
    # checked against the definition, pair by pair: nothing on the front is dominated, everything off it is
    x, y = table["required_gb"].to_numpy(), table["tokens_per_s"].to_numpy()
    dominated = [any(x[j] <= x[i] and y[j] >= y[i] and (x[j] < x[i] or y[j] > y[i]) for j in range(len(table)))
                 for i in range(len(table))]
    assert front.tolist() == [not d for d in dominated]
    assert 1 < front.sum() < len(table)
    recommended = table["rank"] == 1
    assert front[recommended].all()  # the fastest fitting candidate: nothing fitting is faster, nothing lighter
    window = plan_tables.decision_window(default_plan)
    inside = plan_tables.in_window(table, window)
    drawn = table.assign(front=front)[inside]
    chart = charts.build_candidates_chart(drawn, 80.0, window)
    step, points, rule, label = layers(chart)
    spec = chart.to_dict()
    data_of = {name: pd.DataFrame(rows) for name, rows in spec["datasets"].items()}
    on_front = data_of[points["data"]["name"]]
    assert on_front["candidate"].tolist() == drawn.loc[drawn["front"]].sort_values(
        ["required_gb", "tokens_per_s"], ascending=[True, False])["candidate"].tolist()
    assert step["data"] == points["data"]  # the step line joins those points, in order of memory
    assert step["mark"] == {"type": "line", "interpolate": "step-after", "strokeWidth": 1.5,
                            "color": colours.MARK["front"]}
    assert fields(step)["x"] == "required_gb" and fields(step)["y"] == "tokens_per_s"
    assert fields(points)["color"] == "fits" and fields(points)["shape"] == "recompute"
    assert points["encoding"]["color"]["scale"] == {"domain": ["fits", "rejected"],
                                                    "range": [colours.FIT["fits"], colours.FIT["rejected"]]}
    assert fields(rule)["x"] == "budget_gb" and label["mark"]["text"] == "budget 80 GB"
    assert rule["mark"]["color"] == label["mark"]["color"] == colours.MARK["limit"]
    assert_reads_in_full(chart)
    assert points["encoding"]["color"]["legend"] == legend_of(2, "fits the budget")
    assert points["encoding"]["shape"]["legend"] == legend_of(4, "recompute")
    # the toggle: every other candidate in the window, grey, behind the front
    with_cloud = charts.build_candidates_chart(drawn, 80.0, window, cloud=True)
    behind, *rest = layers(with_cloud)
    assert rest == layers(chart)
    assert behind["mark"]["color"] == colours.MARK["other candidates"] and "color" not in behind["encoding"]
    behind_rows = pd.DataFrame(with_cloud.to_dict()["datasets"][behind["data"]["name"]])
    assert sorted(behind_rows["candidate"]) == sorted(drawn.loc[~drawn["front"], "candidate"])
    assert len(behind_rows) + len(on_front) == len(drawn)


def test_the_scatter_zooms_to_where_the_choice_is_made(default_plan):
    table = plan_tables.candidates_frame(default_plan)
    lightest = min(c.required_bytes for c in default_plan.candidates) / GB
    assert round(lightest, 2) == 34.67
    span = 80 - lightest
    window = plan_tables.decision_window(default_plan)
    assert window == pytest.approx((lightest - 0.1 * span, 80 + 0.5 * span))
    assert window == pytest.approx((30.13, 102.67), abs=0.01)
    inside = plan_tables.in_window(table, window)
    drawn = table[inside]
    assert (drawn["fits"] == "fits").sum() == len(default_plan.candidates)  # every fitting candidate
    # and the nearest rejected ones (80.3, 80.4 and 98.0 GB); the 128.2 GB one and the heavier ones are off-chart
    assert sorted(drawn.loc[drawn["fits"] == "rejected", "required_gb"].round(1)) == [80.3, 80.4, 98.0]
    assert (~inside).sum() == 5
    _, points, _, _ = layers(charts.build_candidates_chart(drawn.assign(front=True), 80.0, window))
    assert points["encoding"]["x"]["scale"] == {"domain": list(window), "nice": False}
    assert points["encoding"]["y"]["scale"] == {"zero": False}


def test_the_tables_carry_what_breaks_the_budget_and_leave_a_rank_only_where_one_fits(default_plan):
    table = plan_tables.candidates_frame(default_plan)
    assert str(table["rank"].dtype) == "Int64"  # 1, 2, ... and an empty cell, never 1.0 or None
    assert list(table["rank"].dropna()) == list(range(1, len(default_plan.candidates) + 1))
    rejected = table[table["fits"] == "rejected"]
    assert rejected["rank"].isna().all() and table.loc[table["fits"] == "fits", "over_gb"].isna().all()
    assert list(rejected["over_gb"]) == pytest.approx(list(rejected["required_gb"] - 80), rel=1e-12)
    assert [reason.endswith(": " + term) for reason, term in zip(rejected["rejection"], rejected["broken_by"])] == \
        [True] * len(rejected)
    closest = rejected.loc[rejected["required_gb"].idxmin()]
    assert closest["broken_by"] == "activations (40.5 GB) break it on top of 13.5 GB static"
    assert str(plan_tables.layouts_frame(default_plan)["rank"].dtype) == "Int64"


def test_another_plan_differs_by_its_model_budget_or_hardware(default_plan):
    inputs = EIGHT_RANKS
    same = planning.SAME
    assert planning.compared_inputs(inputs, same, "", same) is None
    assert planning.compared_inputs(inputs, "llama2-7b", "  ", "datasheet: h100-sxm") is None  # nothing differs
    assert planning.compared_inputs(inputs, same, "40GB", same) == inputs.with_(budget="40GB")
    assert planning.compared_inputs(inputs, "llama3-8b", "", "datasheet: h200") == \
        inputs.with_(model="llama3-8b", hardware="datasheet: h200")
    custom = inputs.with_(source="dimensions")
    assert planning.compared_inputs(custom, "llama2-7b", "", same) == inputs  # a preset replaces the dimensions
    best = default_plan.recommendation
    assert plan_tables.plan_title(default_plan) == "llama2-7b on h100-sxm (datasheet), budget 80.0 GB"
    assert plan_tables.plan_figures(default_plan) == {
        "recommendation": plan_tables.recommendation_text(default_plan), "tokens/s": f"{best.tokens_per_s:,.0f}",
        "step time": f"{best.step_time_s:.3f} s", "MFU": f"{best.utilization.mfu:.1%}", "needs per GPU": "65.2 GB"}
    tokens_per_step = best.config.micro_batch * best.accumulation_steps * best.layout.dp * best.config.seq_len
    assert best.tokens_per_s == pytest.approx(tokens_per_step / best.step_time_s, rel=1e-12)
    tighter, nothing = (planning.make_plan(other, planning.resolve_preset(other.model),
                                           *planning.datasheet_hardware(other.hardware))
                        for other in (inputs.with_(budget="60GB"), inputs.with_(budget="30GB")))
    change = tighter.recommendation.tokens_per_s / best.tokens_per_s - 1
    assert plan_tables.tokens_per_s_change(default_plan, tighter) == f"{change:+.1%}" and change < 0
    assert nothing.recommendation is None and plan_tables.tokens_per_s_change(default_plan, nothing) is None
    assert plan_tables.plan_figures(nothing) == {
        "recommendation": "Nothing fits the 30.0 GB budget", "tokens/s": "nothing fits", "step time": "-",
        "MFU": "-", "needs per GPU": "-"}
    assert [plan_tables.tokens_text(x) for x in (57084.9, 999_999.4, 9_165_052.0)] == ["57,085", "999,999", "9.17 M"]


def test_roofline_is_log_log_and_its_roofs_meet_at_the_ridge():
    h100 = get_hardware("h100-sxm")
    table = roofs.roof_table(h100, pd.DataFrame(columns=["dtype", "tflop_per_s"]), pd.DataFrame(), ["bf16"])
    frame = charts.roof_frame(table)
    ridge = ridge_intensity(h100.peak("bf16"), h100.hbm_bytes_per_s)
    at_ridge = frame.loc[frame["intensity"] == ridge, "tflop_per_s"].iloc[0]
    assert at_ridge == pytest.approx(989.4)
    assert frame["tflop_per_s"].max() == pytest.approx(989.4)
    points = pd.DataFrame({"kind": ["matmul"], "dtype": ["bf16"], "label": ["1024^3"],
                           "intensity": [matmul_intensity(1024, 1024, 1024)], "tflop_per_s": [700.0]})
    roofline = charts.build_roofline_chart(frame, points)
    for layer in layers(roofline):
        assert layer["encoding"]["x"]["scale"]["type"] == "log"
        assert layer["encoding"]["y"]["scale"]["type"] == "log"
        assert fields(layer)["x"] == "intensity" and fields(layer)["y"] == "tflop_per_s"
    assert_reads_in_full(roofline)
    lines, dots = layers(roofline)
    assert lines["encoding"]["strokeDash"]["legend"] == legend_of(2, "roof")
    assert lines["encoding"]["strokeDash"]["scale"] == {"domain": ["datasheet"], "range": [[1, 0]]}  # solid
    # one legend of dtypes, lines and points alike, in the dtype's colour; one of kinds, by shape
    assert lines["encoding"]["color"] == dots["encoding"]["color"]
    assert dots["encoding"]["color"]["legend"] == legend_of(5, "dtype")
    assert dots["encoding"]["color"]["scale"] == {"domain": ["bf16"], "range": [colours.DTYPE["bf16"]]}
    assert dots["encoding"]["shape"]["legend"] == legend_of(4, "measured")
    assert dots["mark"] == {"type": "point", "filled": True, "size": 110, "opacity": 1}


def test_each_dtype_is_drawn_against_its_own_roof():
    """Matmuls in fp8, bf16 and fp32 on an H100: a datasheet roof per dtype at its peak, a measured roof per dtype
    at its best rate, in that dtype's colour, never the bf16 roof for all."""
    h100 = get_hardware("h100-sxm")
    matmul = pd.DataFrame({"dtype": ["fp8", "fp8", "bf16", "fp32"], "m": [4096, 8192, 4096, 4096],
                           "n": [4096, 8192, 4096, 4096], "k": [4096, 8192, 4096, 4096], "batch": [1, 1, 1, 1],
                           "tflop_per_s": [1200.0, 1400.5, 700.25, 48.0]})
    elementwise = pd.DataFrame({"op": ["add"], "dtype": ["bf16"], "elements": [2**28], "bytes_moved": [3 * 2**29],
                                "median_s": [3 * 2**29 / 3.0e12], "gb_per_s": [3000.0]})
    points = roofs.roofline_points(matmul, pd.DataFrame(), elementwise)
    assert sorted(set(points["kind"])) == ["elementwise", "matmul"]
    dtypes = roofs.present_dtypes(points)
    assert dtypes == ["fp32", "bf16", "fp8"]  # the datasheet's order
    table = roofs.roof_table(h100, matmul, elementwise, dtypes)
    assert list(table.columns) == roofs.ROOF_COLUMNS
    assert table[["roof", "source", "dtype"]].values.tolist() == [
        ["datasheet fp32", "datasheet", "fp32"], ["measured fp32", "measured", "fp32"],
        ["datasheet bf16", "datasheet", "bf16"], ["measured bf16", "measured", "bf16"],
        ["datasheet fp8", "datasheet", "fp8"], ["measured fp8", "measured", "fp8"]]
    peaks = table.set_index("roof")["peak_flop_per_s"]
    assert peaks.to_dict() == {"datasheet fp32": 67e12, "measured fp32": 48.0e12, "datasheet bf16": 989.4e12,
                               "measured bf16": 700.25e12, "datasheet fp8": 1978.9e12, "measured fp8": 1400.5e12}
    assert set(table.loc[table["source"] == "datasheet", "bytes_per_s"]) == {3.35e12}
    assert set(table.loc[table["source"] == "measured", "bytes_per_s"]) == {3000.0e9}
    # the frame the chart draws: each roof levels off at its own peak, exactly
    drawn = charts.roof_frame(table)
    assert drawn.groupby("roof", sort=False)["tflop_per_s"].max().to_dict() == (peaks / 1e12).to_dict()
    assert drawn.groupby("roof")["dtype"].unique().map(list).to_dict() == table.set_index("roof")["dtype"].map(
        lambda d: [d]).to_dict()
    _, dots = layers(charts.build_roofline_chart(drawn, points))
    assert dots["encoding"]["color"]["scale"] == {"domain": dtypes, "range": [colours.DTYPE[d] for d in dtypes]}
    # a CPU: no datasheet, a measured roof for each dtype it multiplied in and none for the others
    cpu = roofs.roof_table(None, matmul[matmul["dtype"] != "fp8"], elementwise, dtypes)
    assert cpu["roof"].tolist() == ["measured fp32", "measured bf16"]


def test_hardware_charts_from_the_smoke_store(smoke_store):
    url = smoke_store.url
    (device,) = data.devices(url)
    matmul, elementwise, attention = data.matmul(url, device), data.elementwise(url, device), data.attention(url, device)
    points = roofs.roofline_points(matmul, attention, elementwise)
    assert {"elementwise", "matmul"} < set(points["kind"]) and any(k.startswith("attention ") for k in points["kind"])
    assert set(points["dtype"]) <= set(colours.DTYPE)
    # every dtype multiplied in has its measured roof, at its best rate
    table = roofs.roof_table(None, matmul, elementwise, roofs.present_dtypes(points))
    measured = sorted(set(matmul["dtype"]))
    assert sorted(table["dtype"]) == measured and set(table["source"]) == {"measured"}
    assert table.set_index("dtype")["peak_flop_per_s"].to_dict() == \
        (matmul.groupby("dtype")["tflop_per_s"].max() * 1e12).to_dict()
    roof = roofs.roofs(None, matmul, elementwise, "fp32")
    assert list(roof) == ["measured fp32"]  # a CPU has no datasheet roof
    peak, bandwidth = roof["measured fp32"]
    assert peak == pytest.approx(matmul.loc[matmul["dtype"] == "fp32", "tflop_per_s"].max() * 1e12)
    assert bandwidth == pytest.approx(elementwise["gb_per_s"].max() * 1e9)
    size_chart = charts.build_matmul_size_chart(matmul)
    size = size_chart.to_dict()
    assert size["encoding"]["x"]["scale"]["type"] == "log" and size["encoding"]["y"]["scale"]["type"] == "log"
    assert size["encoding"]["x"]["field"] == "flops" and size["encoding"]["color"]["field"] == "dtype"
    assert size["encoding"]["x"]["axis"] == {"labelLimit": 0, "format": "~s"}  # 1G, 10G, 1T: not 1,000,000,000
    assert size["mark"]["point"] == {"filled": True, "size": 110, "opacity": 1}
    bandwidth_chart = charts.build_bandwidth_chart(elementwise)
    assert fields(layers(bandwidth_chart)[0])["x"] == "op"
    h100_bars = charts.build_bandwidth_chart(elementwise, 3350.0)
    assert fields(layers(h100_bars)[1])["y"] == "gb_per_s"
    assert layers(h100_bars)[2]["mark"]["text"] == "datasheet 3,350 GB/s"
    for chart in (size_chart, bandwidth_chart, h100_bars):
        assert_reads_in_full(chart)


def test_calibration_points_and_chart_from_the_smoke_store(smoke_store):
    url = smoke_store.url
    train = data.train_steps(url)
    memory, time = calibration.memory_points(train), calibration.time_points(train)
    assert len(memory) == len(train) and set(memory["basis"]) == {"saved activations"}  # CPU: no allocator stats
    assert (time["measured"] == train["median_s"].values).all()
    assert (time["ratio"] == time["measured"] / time["predicted"]).all()  # one convention: measured / predicted
    assert (time["error"] == time["ratio"] - 1).all()
    stats = calibration.error_stats(time)
    assert list(stats.columns) == [*calibration.STATS_COLUMNS, calibration.NOISY_COLUMN]
    assert stats["steps"].sum() + stats[calibration.NOISY_COLUMN].sum() == len(time)  # kept, or noisy and left out
    assert stats[calibration.NOISY_COLUMN].sum() == time["noisy"].astype(bool).sum()
    memory_chart = charts.build_calibration_chart(memory, "GB")
    assert_reads_in_full(memory_chart)
    diagonal, dots = layers(memory_chart)
    assert dots["encoding"]["shape"]["legend"] == legend_of(3, "policy")
    assert dots["encoding"]["color"]["legend"] == legend_of(2, "device", "top")  # half a page: a side each
    assert diagonal["mark"]["type"] == "line" and fields(dots)["x"] == "measured" and fields(dots)["y"] == "predicted"
    assert dots["encoding"]["x"]["scale"]["type"] == "log"


def test_a_drop_of_more_than_five_percent_against_the_previous_median_is_flagged():
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    values = {"box-a": [100.0, 102.0, 98.0, 96.0, 90.0], "box-b": [50.0, 48.0, 47.6, 60.0, 56.0]}
    rows = [{"device": d, "hostname": d, "uuid": f"{d}-{i}", "started_at": start + timedelta(days=i), "v": v}
            for d, vs in values.items() for i, v in enumerate(vs)]
    line = history.timeline(pd.DataFrame(rows), "v")
    flagged = set(line.loc[line["drop"], "uuid"])
    # box-a: 90 vs median(100, 102, 98, 96) = 99 is -9%; 96 vs 100 is -4%. box-b: 47.6 vs 49 is -2.9%,
    # 56 vs median(50, 48, 47.6, 60) = 49 is a rise.
    assert flagged == {"box-a-4"}
    assert line.loc[line["uuid"] == "box-a-4", "change"].iloc[0] == pytest.approx(90 / 99 - 1)
    chart = charts.build_timeline_chart(line)
    assert fields(layers(chart)[0])["x"] == "started_at"
    assert_reads_in_full(chart)


def test_a_timeline_of_one_run_reads_as_a_date_not_milliseconds():
    started = datetime(2026, 12, 1, 16, 9, 40, 374821, tzinfo=timezone.utc)
    one = history.timeline(pd.DataFrame([{"device": "box", "hostname": "box", "uuid": "u", "started_at": started,
                                          "v": 1.0}]), "v")
    x = layers(charts.build_timeline_chart(one))[0]["encoding"]["x"]
    assert x["axis"] == {"format": "%Y-%m-%d %H:%M", "labelLimit": 0, "labelOverlap": True, "tickCount": 5}
    # two hours around the run, not the zero-width span Vega would tick in milliseconds (".374")
    assert x["scale"]["domain"] == ["2026-12-01T15:09:40.374821+00:00", "2026-12-01T17:09:40.374821+00:00"]
    later = pd.Timestamp(started) + pd.Timedelta(days=3)
    assert charts.time_domain(pd.Series([pd.Timestamp(started), later])) == \
        [pd.Timestamp(started).isoformat(), later.isoformat()]  # a span of days is kept as it is


def test_key_figures_of_the_smoke_run(smoke_store):
    url = smoke_store.url
    figures = history.key_figures(data.runs(url), data.matmul(url), data.elementwise(url), data.train_steps(url))
    assert len(figures) == 1
    row = figures.iloc[0]
    matmul = data.matmul(url)
    assert row["matmul bf16 TFLOP/s"] == pytest.approx(matmul.loc[matmul["dtype"] == "bf16", "tflop_per_s"].max())
    assert row["copy GB/s"] > 0 and row["train tokens/s"] > 0
    table = history.side_by_side(figures, [int(row["run_id"])])
    assert "train tokens/s" in table.index
    # plain row names, dates to the minute, numbers rounded with separators, "-" for nothing recorded (a CPU)
    assert list(table.index) == ["device", "host", "started (UTC)", "suite", "status", "driver", "CUDA", "torch",
                                 *history.FIGURES]
    (column,) = table.columns
    assert table.loc["started (UTC)", column] == f"{row['started_at']:%Y-%m-%d %H:%M}"
    assert table.loc["driver", column] == "-" and table.loc["CUDA", column] == "-"
    assert table.loc["copy GB/s", column] == f"{row['copy GB/s']:,.4g}"
    assert not table.isin(["None", "nan", "NaT"]).any().any()


def test_cells_side_by_side_read_at_a_glance():
    assert [history.cell_text(v) for v in (None, float("nan"), 0.0018299456270156758, 11.172826878747529,
                                           57084.91, pd.Timestamp("2026-12-01 16:09:40.374821+00:00"), "smoke")] == \
        ["-", "-", "0.00183", "11.17", "57,085", "2026-12-01 16:09", "smoke"]


def test_query_string_round_trip():
    inputs = planning.PlanInputs(model="gpt2-xl", budget="24GiB", dp="2", offload=True, gpus=64, tp="8", sp="off",
                                 interconnect="ib-hdr")
    assert planning.PlanInputs.from_query(inputs.to_query()) == inputs
    assert planning.PlanInputs.from_query({"dp": "many", "seq_len": "1024"}) == planning.PlanInputs(seq_len=1024)
    # pins are normalised; unreadable ones keep their default (auto), as every other malformed value does
    assert planning.PlanInputs.from_query({"tp": " 04", "sp": "true", "schedule": "Interleaved", "zero": ""}) == \
        planning.PlanInputs(tp="4", sp="on", schedule="interleaved", zero="auto")
    assert planning.PlanInputs.from_query({"sp": "maybe", "schedule": "zigzag", "stack": "deepspeed"}) == \
        planning.PlanInputs()
    assert planning.PlanInputs.from_query({"stack": "torch"}).stack == "reference"  # the stack's former name


def test_a_new_run_or_result_shows_on_the_next_read_without_clearing_a_cache(tmp_path):
    """Cached queries key on the store's version: a second read is served from the cache, and a run
    recorded since, or a result added to a run still running, is in the next read."""
    from headroom.db.models import MatmulResult
    from headroom.db.store import open_store
    from tests.db_support import fingerprint, record_run, results

    url = f"sqlite:///{tmp_path / 'store.db'}"
    with open_store(url, mode="write") as store:
        record_run(store, seed=0)
    first = data.runs(url)
    assert len(first) == 1
    version = data.store_version(url)
    assert data.store_version(url) == version  # nothing changed: the same key, the cached frame
    with open_store(url, mode="write") as store:
        record_run(store, seed=1)
        assert len(data.runs(url)) == 2 and data.store_version(url) != version
        with store.recording(fingerprint(), suite="standard", benchmark_version="1") as run_id:
            matmuls = len(data.matmul(url))
            store.add_result(run_id, next(r for r in results(2) if isinstance(r, MatmulResult)))
            assert len(data.matmul(url)) == matmuls + 1
            assert "running" in set(data.runs(url)["status"])
    assert set(data.runs(url)["status"]) == {"completed"}
