"""The roofline bounds what was measured: on the H200 reference run no point lies above the measured roof."""

from pathlib import Path

import pytest

from headroom.core.specs.hardware import get_hardware
from headroom.core.timing.roofline import attainable_flop_per_s
from headroom.dashboard import charts, data, roofs

REFERENCE_BUNDLE = Path(__file__).parent / "data" / "reference" / "nvidia-h200-2026-11-30.json.gz"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    from headroom.cli.dashboard import load_bundle

    url = load_bundle(REFERENCE_BUNDLE, tmp_path_factory.mktemp("bundle"))
    (device,) = data.devices(url)
    return data.matmul(url, device), data.elementwise(url, device), data.attention(url, device)


def test_every_measured_point_of_the_h200_lies_under_its_measured_roof(reference):
    """cuDNN's causal attention counted in full ran at 1,022 TFLOP/s, above the best bf16 matmul (776); an add
    moved 4,384 GB/s, above the copy the roof took (4,181)."""
    matmul, elementwise, attention = reference
    (peak, bandwidth), = roofs.roofs(None, matmul, elementwise, "bf16").values()
    assert (round(peak / 1e12, 1), round(bandwidth / 1e9, 1)) == (776.0, 4383.9)
    points = roofs.roofline_points(matmul[matmul["dtype"] == "bf16"], attention, elementwise)
    assert set(points["kind"]) >= {"matmul", "attention cudnn", "elementwise"} and set(points["dtype"]) == {"bf16"}
    # The points that set the roof lie on it: 1e-12 of rounding allowed, nothing more.
    over = [(p.label, p.tflop_per_s) for p in points.itertuples()
            if p.tflop_per_s * 1e12 > attainable_flop_per_s(p.intensity, peak, bandwidth) * (1 + 1e-12)]
    assert over == []
    cudnn = points[points["label"] == "bf16 b4 s2048 h32 d128"]
    assert cudnn.loc[cudnn["kind"] == "attention cudnn", "tflop_per_s"].round(0).tolist() == [511.0]



def test_every_dtype_of_the_h200_has_its_roof_and_its_points_lie_under_it(reference):
    """The H200 multiplied in fp32, tf32, fp16, bf16 and fp8: each dtype's points under that dtype's roofs, the
    datasheet's at the H200's dense peak for it, the measured one at its best matmul (fp8 1,365 TFLOP/s, fp32 51)."""
    matmul, elementwise, attention = reference
    h200 = get_hardware("h200")
    points = roofs.roofline_points(matmul, attention, elementwise)
    dtypes = roofs.present_dtypes(points)
    assert dtypes == ["fp32", "tf32", "fp16", "bf16", "fp8"]
    table = roofs.roof_table(h200, matmul, elementwise, dtypes)
    assert table.groupby("dtype").size().to_dict() == dict.fromkeys(dtypes, 2)  # a datasheet and a measured roof
    datasheet = table[table["source"] == "datasheet"].set_index("dtype")["peak_flop_per_s"]
    assert datasheet.to_dict() == {"fp32": 67e12, "tf32": 494.7e12, "fp16": 989.4e12, "bf16": 989.4e12,
                                   "fp8": 1978.9e12}
    measured = table[table["source"] == "measured"].set_index("dtype")["peak_flop_per_s"]
    assert measured.to_dict() == (matmul.groupby("dtype")["tflop_per_s"].max() * 1e12).to_dict()
    assert {d: round(v / 1e12) for d, v in measured.items()} == {"fp32": 51, "tf32": 385, "fp16": 686, "bf16": 776,
                                                                 "fp8": 1365}
    drawn = charts.roof_frame(table)
    assert drawn.groupby("roof")["tflop_per_s"].max().to_dict() == (table.set_index("roof")["peak_flop_per_s"]
                                                                     / 1e12).to_dict()
    # no matmul lies above its own dtype's measured roof; an fp8 one would lie above bf16's
    roof_of = {r.dtype: (r.peak_flop_per_s, r.bytes_per_s) for r in table[table["source"] == "measured"].itertuples()}
    mm = points[points["kind"] == "matmul"]
    over = [(p.dtype, p.label) for p in mm.itertuples()
            if p.tflop_per_s * 1e12 > attainable_flop_per_s(p.intensity, *roof_of[p.dtype]) * (1 + 1e-12)]
    assert over == []
    assert (mm.loc[mm["dtype"] == "fp8", "tflop_per_s"] * 1e12 > roof_of["bf16"][0]).any()
