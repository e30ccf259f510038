"""Benchmark inputs on a CPU: one drawn tile of standard normal values, repeated over the whole tensor."""

import pytest

torch = pytest.importorskip("torch")
from headroom.agent.operands import TILE_ELEMENTS, random_normal  # noqa: E402

CPU = torch.device("cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_large_tensor_is_one_normal_tile_repeated_to_the_last_element(dtype):
    shape = (3, 700_001)  # 2.0 tiles: two whole repeats and a partial one
    x = random_normal(*shape, dtype=dtype, device=CPU)
    assert x.shape == shape and x.dtype == dtype and x.is_contiguous()
    flat = x.view(-1)
    tile = flat[:TILE_ELEMENTS]
    assert torch.equal(flat[TILE_ELEMENTS:2 * TILE_ELEMENTS], tile)
    rest = flat[2 * TILE_ELEMENTS:]
    assert rest.numel() == 3 * 700_001 - 2 * TILE_ELEMENTS and torch.equal(rest, tile[:rest.numel()])
    values = tile.float()
    assert abs(values.mean().item()) < 0.01 and abs(values.std().item() - 1) < 0.01  # 2^20 standard normal draws


def test_a_tensor_smaller_than_a_tile_is_drawn_whole():
    x = random_normal(4, 5, dtype=torch.float32, device=CPU)
    assert x.shape == (4, 5) and len(set(x.view(-1).tolist())) == 20
