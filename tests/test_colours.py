"""One colour per meaning: every chart takes its colours from headroom.dashboard.colours, and no colour is given
to two meanings (nor to two that look alike)."""

from __future__ import annotations

import inspect
import itertools
import json
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

pytest.importorskip("altair")
import pandas as pd  # noqa: E402

from headroom.core.specs.hardware import DTYPES  # noqa: E402
from headroom.dashboard import charts, colours, plan_tables, planning  # noqa: E402

DASHBOARD = Path(charts.__file__).parent
FIELD_MEANINGS = {"component": colours.MEMORY, "term": colours.TIME, "dtype": colours.DTYPE, "fits": colours.FIT}
"""A colour scale's field -> the table its colours must come from (``device`` is `colours.device_colours`)."""


def every_colour() -> list[tuple[str, str, str]]:
    """(family, meaning, hex) for every colour the module gives."""
    return [(family, name, colour.lower()) for family, table in colours.MEANINGS.items()
            for name, colour in table.items()]


def test_no_colour_is_given_to_two_meanings():
    found: dict[str, list[str]] = {}
    for family, name, colour in every_colour():
        found.setdefault(colour, []).append(f"{family}: {name}")
    assert {colour: names for colour, names in found.items() if len(names) > 1} == {}
    assert all(re.fullmatch(r"#[0-9a-f]{6}", colour) for _, _, colour in every_colour())


def lab(colour: str) -> tuple[float, float, float]:
    """CIELAB (D65) of an sRGB hex colour, by the sRGB and CIE 1976 formulas."""
    linear = [(c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4)
              for c in (int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5))]
    r, g, b = linear
    xyz = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047, 0.2126 * r + 0.7152 * g + 0.0722 * b, \
        (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883
    fx, fy, fz = (t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116 for t in xyz)
    return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)


def test_no_two_meanings_look_alike():
    """Any two colours at least 10 apart in CIELAB (ΔE*ab; 2.3 is a just-noticeable difference)."""
    # sRGB's white, red and blue in CIELAB, as published (Lindbloom's calculator), to the matrix's 4 digits
    assert lab("#ffffff") == pytest.approx((100, 0, 0), abs=0.05)
    assert lab("#ff0000") == pytest.approx((53.24, 80.09, 67.20), abs=0.05)
    assert lab("#0000ff") == pytest.approx((32.30, 79.19, -107.86), abs=0.05)
    close = [(a[:2], b[:2], round(d, 1)) for a, b in itertools.combinations(every_colour(), 2)
             if (d := sum((p - q) ** 2 for p, q in zip(lab(a[2]), lab(b[2]), strict=True)) ** 0.5) < 10]
    assert close == []


def test_the_tables_cover_what_the_charts_name():
    assert tuple(colours.TIME) == plan_tables.TIME_TERMS
    assert tuple(colours.DTYPE) == DTYPES
    inputs = planning.PlanInputs(model="bench-llama-small", seq_len=128, global_batch=8, budget="2GB")
    plan = planning.make_plan(inputs, planning.resolve_preset(inputs.model),
                              *planning.datasheet_hardware(inputs.hardware))
    drawn = plan_tables.peak_components_frame(plan, [*plan.candidates, *plan.rejected])
    assert set(drawn["component"].map(charts.plain_name)) <= set(colours.MEMORY)
    assert {"forward transient", "backward transient", "optimizer transient", "margin"} <= set(colours.MEMORY)
    assert colours.device_colours(["b", "a", "b"]) == {"a": colours.DEVICES[0], "b": colours.DEVICES[1]}


def test_a_device_keeps_its_colour_whichever_others_a_chart_draws():
    """The History page draws the devices picked, the Calibration page those with training steps: each device
    takes its place among the store's devices."""
    store = ["NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    history = charts.build_timeline_chart(pd.DataFrame({
        "device": [store[2], store[0]], "started_at": pd.to_datetime(["2026-01-01", "2026-01-02"], utc=True),
        "value": [1.0, 2.0], "drop": [False, False], "figure": ["bf16"] * 2, "hostname": ["h"] * 2,
        "uuid": ["u1", "u2"], "change": [0.0, 0.0]}), store)
    calibration = charts.build_calibration_chart(pd.DataFrame({
        "device": [store[2]], "policy": ["none"], "label": ["s"], "predicted": [1.0], "measured": [1.1],
        "error": [0.1]}), "s", store)
    scales = [_colour_scale(history), _colour_scale(calibration)]
    assert scales == [{"domain": [store[0], store[2]], "range": [colours.DEVICES[0], colours.DEVICES[2]]},
                      {"domain": [store[2]], "range": [colours.DEVICES[2]]}]
    # A store of more devices than colours: two drawn together that share one take the drawn order instead.
    many = [f"device {i:02d}" for i in range(len(colours.DEVICES) + 1)]
    assert colours.device_colours([many[0], many[-1]], many) == {many[0]: colours.DEVICES[0],
                                                                 many[-1]: colours.DEVICES[1]}
    assert colours.device_colours([many[1], many[-1]], many) == {many[1]: colours.DEVICES[1],
                                                                 many[-1]: colours.DEVICES[0]}


def _colour_scale(chart) -> dict:
    """The device colour scale of a chart's layer that draws the devices."""
    layers = chart.to_dict()["layer"]
    return next(layer["encoding"]["color"]["scale"] for layer in layers
                if layer.get("encoding", {}).get("color", {}).get("field") == "device")
    assert colours.domain_range(colours.FIT, ["rejected", "new"]) == (["rejected", "new"],
                                                                      [colours.FIT["rejected"], colours.UNLISTED])


def sample_charts() -> dict[str, object]:
    """Every chart builder, on a small frame of its own."""
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    memory = pd.DataFrame({"candidate": ["a"] * 4, "order": [0] * 4, "gb": [1.0, 2.0, 3.0, 0.5],
                           "component": ["parameters", "activations", "backward_transient", "margin"]})
    candidates = pd.DataFrame({"candidate": ["a", "b", "c"], "required_gb": [10.0, 20.0, 30.0],
                               "tokens_per_s": [5.0, 9.0, 4.0], "fits": ["fits", "fits", "rejected"],
                               "recompute": ["none", "full", "full"], "rejection": ["", "", "over"],
                               "front": [True, True, False]})
    terms = pd.DataFrame([{"row": "x", "order": 0, "term": term, "term_order": i, "seconds": 0.1}
                          for i, term in enumerate(plan_tables.TIME_TERMS)])
    roofs = pd.DataFrame({"roof": ["datasheet fp8", "measured bf16"], "source": ["datasheet", "measured"],
                          "dtype": ["fp8", "bf16"], "peak_flop_per_s": [2e15, 7e14], "bytes_per_s": [3e12, 3e12]})
    points = pd.DataFrame({"kind": ["matmul", "elementwise"], "dtype": ["fp8", "bf16"], "label": ["m", "add"],
                           "intensity": [500.0, 0.2], "tflop_per_s": [1500.0, 0.5]})
    matmul = pd.DataFrame({"dtype": ["fp32", "bf16"], "flops": [1e9, 1e9], "tflop_per_s": [40.0, 600.0]})
    elementwise = pd.DataFrame({"op": ["add", "copy"], "dtype": ["bf16", "fp32"], "gb_per_s": [3000.0, 2900.0]})
    timeline = pd.DataFrame({"device": ["gpu-b", "gpu-a", "gpu-b"], "hostname": ["h"] * 3, "uuid": ["u1", "u2", "u3"],
                             "started_at": [start, start, start + timedelta(days=1)], "value": [1.0, 2.0, 0.5],
                             "drop": [False, False, True], "change": [0.0, 0.0, -0.5], "figure": ["f"] * 3})
    calibration = pd.DataFrame({"predicted": [1.0, 2.0], "measured": [1.1, 1.9], "device": ["gpu-b", "gpu-a"],
                                "policy": ["none", "full"], "label": ["x", "y"], "error": [0.1, -0.05]})
    return {
        "build_peak_bar_chart": charts.build_peak_bar_chart(memory, 5.0),
        "build_candidates_chart": charts.build_candidates_chart(candidates, 25.0, (5.0, 35.0), cloud=True),
        "build_step_time_chart": charts.build_step_time_chart(terms),
        "build_roofline_chart": charts.build_roofline_chart(charts.roof_frame(roofs), points),
        "build_matmul_size_chart": charts.build_matmul_size_chart(matmul),
        "build_bandwidth_chart": charts.build_bandwidth_chart(elementwise, 3350.0),
        "build_timeline_chart": charts.build_timeline_chart(timeline),
        "build_calibration_chart": charts.build_calibration_chart(calibration, "GB"),
    }


def test_every_chart_takes_its_colours_from_the_module():
    built = sample_charts()
    builders = {name for name, _ in inspect.getmembers(charts, inspect.isfunction) if name.startswith("build_")}
    assert set(built) == builders, "a chart builder this test does not draw"
    known = {colour for _, _, colour in every_colour()}
    for name, chart in built.items():
        spec = chart.to_dict()
        assert "scheme" not in json.dumps(spec), name  # no Vega palette: it would repeat our colours' meanings
        scales = 0
        for layer in spec.get("layer", [spec]):
            mark = layer["mark"] if isinstance(layer["mark"], dict) else {}
            for key in ("color", "fill", "stroke"):
                assert mark.get(key) is None or mark[key].lower() in known, (name, key, mark[key])
            color = layer["encoding"].get("color")
            if color is None:
                continue
            if "value" in color:
                assert color["value"].lower() in known, (name, color)
                continue
            scale, field = color["scale"], color["field"]
            expected = colours.device_colours(scale["domain"]) if field == "device" else FIELD_MEANINGS[field]
            assert scale["range"] == [expected[d] for d in scale["domain"]], (name, field)
            scales += 1
        assert scales >= 1, name


def test_no_colour_is_written_outside_the_module():
    """The charts' and the pages' code names colours only through headroom.dashboard.colours."""
    literal = re.compile(r"#[0-9a-fA-F]{3,8}\b|\b(?:color|colour|fill|stroke)\s*=\s*[\"']|scheme\s*=")
    sources = [DASHBOARD / "charts.py", DASHBOARD / "roofs.py", *sorted((DASHBOARD / "views").glob("*.py"))]
    assert {str(path.name): found for path in sources if (found := literal.findall(path.read_text()))} == {}
