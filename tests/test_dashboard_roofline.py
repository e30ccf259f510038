"""The roofline bounds what was measured: on the H200 reference run no point lies above the measured roof."""

from pathlib import Path

import pytest

from headroom.core.timing.roofline import attainable_flop_per_s
from headroom.dashboard import data, roofs

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
    assert set(points["kind"]) >= {"matmul bf16", "attention cudnn", "elementwise"}
    # The points that set the roof lie on it: 1e-12 of rounding allowed, nothing more.
    over = [(p.label, p.tflop_per_s) for p in points.itertuples()
            if p.tflop_per_s * 1e12 > attainable_flop_per_s(p.intensity, peak, bandwidth) * (1 + 1e-12)]
    assert over == []
    cudnn = points[points["label"] == "bf16 b4 s2048 h32 d128"]
    assert cudnn.loc[cudnn["kind"] == "attention cudnn", "tflop_per_s"].round(0).tolist() == [511.0]

