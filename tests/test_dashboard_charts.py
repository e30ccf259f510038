"""Chart builders and the pages' logic, on real plans and a real smoke store."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

pytest.importorskip("altair")
import altair as alt  # noqa: E402
import pandas as pd  # noqa: E402

from core.hardware import get_hardware  # noqa: E402
from core.roofline import matmul_intensity, ridge_intensity  # noqa: E402
from core.units import GB  # noqa: E402
from dashboard import calibration, charts, data, history, planning, roofs  # noqa: E402


def layers(chart) -> list[dict]:
    spec = chart.to_dict()
    return spec.get("layer", [spec])


def fields(layer: dict) -> dict[str, str]:
    return {channel: enc.get("field") for channel, enc in layer["encoding"].items() if isinstance(enc, dict)}


@pytest.fixture(scope="module")
def default_plan():
    inputs = planning.PlanInputs()
    return planning.make_plan(inputs, planning.resolve_preset(inputs.model), *planning.datasheet_hardware(inputs.hardware))


def test_peak_bar_stacks_components_up_to_the_required_bytes_against_the_budget(default_plan):
    shown = planning.shown_candidates(default_plan)
    frame = planning.peak_components_frame(default_plan, shown)
    for candidate in shown:  # components + margin add up to what must fit
        total = frame.loc[frame["candidate"] == candidate.label, "gb"].sum()
        assert total == pytest.approx(candidate.required_bytes / GB, rel=1e-9)
    chart = charts.build_peak_bar_chart(frame, 80.0)
    assert isinstance(chart, alt.LayerChart)
    bars, rule = layers(chart)
    assert bars["mark"]["type"] == "bar" and fields(bars)["color"] == "component" and fields(bars)["y"] == "candidate"
    assert bars["encoding"]["x"]["stack"] == "zero"
    assert rule["mark"]["type"] == "rule" and fields(rule)["x"] == "budget_gb"


def test_candidates_chart_shows_fitting_and_rejected(default_plan):
    table = planning.candidates_frame(default_plan)
    assert set(table["fits"]) == {"fits", "rejected"}
    assert (table.loc[table["fits"] == "rejected", "rejection"].str.contains("over the")).all()
    points, rule = layers(charts.build_candidates_chart(table, 80.0))
    assert fields(points)["x"] == "required_gb" and fields(points)["y"] == "tokens_per_s"
    assert fields(points)["color"] == "fits" and fields(points)["shape"] == "recompute"
    assert fields(rule)["x"] == "budget_gb"


def test_roofline_is_log_log_and_its_roofs_meet_at_the_ridge():
    h100 = get_hardware("h100-sxm")
    frame = charts.roof_frame({"datasheet bf16": (h100.peak("bf16"), h100.hbm_bytes_per_s)})
    ridge = ridge_intensity(h100.peak("bf16"), h100.hbm_bytes_per_s)
    at_ridge = frame.loc[frame["intensity"] == ridge, "tflop_per_s"].iloc[0]
    assert at_ridge == pytest.approx(989.4)
    assert frame["tflop_per_s"].max() == pytest.approx(989.4)
    points = pd.DataFrame({"kind": ["matmul bf16"], "label": ["1024^3"],
                           "intensity": [matmul_intensity(1024, 1024, 1024)], "tflop_per_s": [700.0]})
    for layer in layers(charts.build_roofline_chart(frame, points)):
        assert layer["encoding"]["x"]["scale"]["type"] == "log"
        assert layer["encoding"]["y"]["scale"]["type"] == "log"
        assert fields(layer)["x"] == "intensity" and fields(layer)["y"] == "tflop_per_s"


def test_hardware_charts_from_the_smoke_store(smoke_store):
    url, _ = smoke_store
    (device,) = data.devices(url)
    matmul, elementwise, attention = data.matmul(url, device), data.elementwise(url, device), data.attention(url, device)
    points = roofs.roofline_points(matmul, attention, elementwise)
    assert {"elementwise"} < set(points["kind"]) and any(k.startswith("matmul ") for k in points["kind"])
    assert any(k.startswith("attention ") for k in points["kind"])
    roof = roofs.roofs(None, matmul, elementwise, "fp32")
    assert list(roof) == ["measured fp32"]  # a CPU has no datasheet roof
    peak, bandwidth = roof["measured fp32"]
    assert peak == pytest.approx(matmul.loc[matmul["dtype"] == "fp32", "tflop_per_s"].max() * 1e12)
    assert bandwidth == pytest.approx(elementwise.loc[elementwise["op"] == "copy", "gb_per_s"].max() * 1e9)
    size = charts.build_matmul_size_chart(matmul).to_dict()
    assert size["encoding"]["x"]["scale"]["type"] == "log" and size["encoding"]["y"]["scale"]["type"] == "log"
    assert size["encoding"]["x"]["field"] == "flops" and size["encoding"]["color"]["field"] == "dtype"
    bandwidth_chart = charts.build_bandwidth_chart(elementwise)
    assert fields(layers(bandwidth_chart)[0])["x"] == "op"
    h100_bars = charts.build_bandwidth_chart(elementwise, 3350.0)
    assert fields(layers(h100_bars)[1])["y"] == "gb_per_s"


def test_calibration_points_and_chart_from_the_smoke_store(smoke_store):
    url, _ = smoke_store
    train = data.train_steps(url)
    memory, time = calibration.memory_points(train), calibration.time_points(train)
    assert len(memory) == len(train) and set(memory["basis"]) == {"saved activations"}  # CPU: no allocator stats
    assert (time["measured"] == train["median_s"].values).all()
    assert (time["ratio"] == time["measured"] / time["predicted"]).all()  # one convention: measured / predicted
    assert (time["error"] == time["ratio"] - 1).all()
    stats = calibration.error_stats(time)
    assert stats["steps"].sum() == len(time) and list(stats.columns) == calibration.STATS_COLUMNS
    dots_layers = layers(charts.build_calibration_chart(memory, "GB"))
    diagonal, dots = dots_layers
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


def test_key_figures_of_the_smoke_run(smoke_store):
    url, report = smoke_store
    figures = history.key_figures(data.runs(url), data.matmul(url), data.elementwise(url), data.train_steps(url))
    assert len(figures) == 1
    row = figures.iloc[0]
    matmul = data.matmul(url)
    assert row["matmul bf16 TFLOP/s"] == pytest.approx(matmul.loc[matmul["dtype"] == "bf16", "tflop_per_s"].max())
    assert row["copy GB/s"] > 0 and row["train tokens/s"] > 0
    table = history.side_by_side(figures, [int(row["run_id"])])
    assert "train tokens/s" in table.index


def test_query_string_round_trip():
    inputs = planning.PlanInputs(model="gpt2-xl", budget="24GiB", dp="2", offload=True, gpus=64, tp="8", sp="off",
                                 interconnect="ib-hdr")
    assert planning.PlanInputs.from_query(inputs.to_query()) == inputs
    assert planning.PlanInputs.from_query({"dp": "many", "seq_len": "1024"}) == planning.PlanInputs(seq_len=1024)
    # pins are normalised; unreadable ones keep their default (auto), as every other malformed value does
    assert planning.PlanInputs.from_query({"tp": " 04", "sp": "true", "schedule": "Interleaved", "zero": ""}) == \
        planning.PlanInputs(tp="4", sp="on", schedule="interleaved", zero="auto")
    assert planning.PlanInputs.from_query({"sp": "maybe", "schedule": "zigzag"}) == planning.PlanInputs()


def test_a_new_run_or_result_shows_on_the_next_read_without_clearing_a_cache(tmp_path):
    """Cached queries key on the store's version: a second read is served from the cache, and a run
    recorded since, or a result added to a run still running, is in the next read."""
    from db.models import MatmulResult
    from db.store import open_store
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
