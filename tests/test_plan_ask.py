"""headroom.core.planning.ask: the one place a plan's question becomes the planner's request, so that
``headroom plan`` and the dashboard's Plan page cannot take different defaults."""

from __future__ import annotations

import pytest

from headroom.cli.main import build_parser
from headroom.cli.plan import plan_request
from headroom.core.planning.ask import PlanAsk
from headroom.core.planning.planner import DEFAULT_BUDGET_BYTES
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.hardware import HARDWARE, get_hardware
from headroom.core.specs.layout import Layout
from headroom.core.specs.presets import get_preset
from headroom.core.specs.recompute import parse_policy
from headroom.core.timing.step import datasheet_profile
from headroom.core.units import GB
from headroom.dashboard import planning

MODEL = planning.PlanInputs().model
TP2 = TrainConfig(seq_len=2048, layout=Layout(tp=2))
CASES = [
    ((), {}),
    (("--budget", "40GB"), {"budget": "40GB"}),
    (("--gpus", "16"), {"gpus": 16}),
    (("--gpus", "16", "--tp", "2", "--gpus-per-node", "4", "--interconnect", "roce-400g"),
     {"gpus": 16, "tp": "2", "gpus_per_node": 4, "interconnect": "roce-400g"}),
    (("--dp", "2", "--zero", "3"), {"dp": "2", "zero": "3"}),
    (("--micro-batch", "2", "--recompute", "full"), {"micro_batch": "2", "recompute": "full"}),
    (("--seq-len", "4096", "--precision", "bf16-pure", "--optimizer", "sgd", "--stack", "torchtitan", "--offload"),
     {"seq_len": 4096, "precision": "bf16-pure", "optimizer": "sgd", "stack": "torchtitan", "offload": True}),
]


def cli_request(profile, hardware: str, *flags: str):
    args = build_parser().parse_args(["plan", "--model", MODEL, "--global-batch", "64",
                                      "--hardware", hardware, *flags])
    return plan_request(args, profile)


@pytest.mark.parametrize("hw", HARDWARE, ids=lambda hw: hw.key)
def test_the_command_and_the_page_ask_the_same_on_every_datasheet_device(hw):
    profile = datasheet_profile(hw)
    spec = get_preset(MODEL)
    for flags, page in CASES:
        inputs = planning.PlanInputs(hardware=planning.DATASHEET_PREFIX + hw.key, **page)
        assert cli_request(profile, hw.key, *flags) == planning.build_request(inputs, spec, profile), flags


def test_left_out_settings_take_the_products_defaults():
    spec = get_preset("llama3-8b")
    h200, a100_40 = datasheet_profile(get_hardware("h200")), datasheet_profile(get_hardware("a100-sxm-40gb"))
    one = PlanAsk(global_batch=8).request(spec, h200)
    assert (one.budget_bytes, one.cluster, one.gpus, one.pinned) == (DEFAULT_BUDGET_BYTES, None, None, frozenset())
    assert (one.train.seq_len, one.train.precision, one.train.layout) == (2048, "amp-bf16", Layout())
    assert PlanAsk(global_batch=8).request(spec, a100_40).budget_bytes == a100_40.memory_bytes == 40 * GB
    searched = PlanAsk(global_batch=64, gpus=16, train=TP2, pinned=frozenset({"tp"})).request(spec, h200)
    assert (searched.gpus, searched.pinned, searched.cluster) == (16, frozenset({"tp"}), h200.cluster(8, None))
    # Pinned axes mean nothing without a search: the one layout is planned as given.
    assert PlanAsk(global_batch=8, train=TP2, pinned=frozenset({"tp"})).request(spec, h200).pinned == \
        frozenset()
    pins = PlanAsk(global_batch=8, micro_batch=2, recompute=parse_policy("full")).request(spec, h200)
    assert (pins.micro_batch, pins.accumulation, str(pins.recompute)) == (2, None, "full")
