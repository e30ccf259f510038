"""The Plan page and ``headroom plan`` plan the same thing from the same inputs, defaults included (README: the
dashboard's plan and "the same plan from the command line"), and a CPU is described as a CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headroom.cli.main import build_parser
from headroom.cli.plan import plan_ask
from headroom.cli.train_flags import layout_from_args
from headroom.core.planning.ask import ONE_GPU
from headroom.core.planning.planner import default_budget, plan_to_dict
from headroom.core.specs.hardware import HARDWARE, get_hardware
from headroom.core.specs.interconnect import (
    FALLBACK_INTRA_NODE_LINK,
    INTER_NODE_LINK,
    get_link,
)
from headroom.core.specs.layout import Layout
from headroom.core.timing.step import datasheet_profile
from headroom.dashboard import plan_tables, planning

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

APP = str(Path(__file__).resolve().parents[1] / "dashboard" / "app.py")
README_PLAN = ("--model", "bench-llama-small", "--seq-len", "128", "--global-batch", "8", "--budget", "4GB",
               "--precision", "fp32")
"""README's quick start: "the same plan from the command line, on those measurements"."""


def cli_args(*flags: str):
    return build_parser().parse_args(["plan", "--model", planning.PlanInputs().model, "--global-batch", "64", *flags])


def test_the_page_takes_headroom_plans_defaults():
    args, inputs = cli_args(), planning.PlanInputs()
    assert planning.build_layout(inputs) == layout_from_args(args, **ONE_GPU) == Layout()  # one GPU, dp 1
    assert (inputs.seq_len, inputs.precision, inputs.optimizer, inputs.attention, inputs.stack) == \
        (args.seq_len, args.precision, args.optimizer, args.attention, plan_ask(args).train.stack) == \
        (2048, "amp-bf16", "adamw", "flash", "reference")
    assert inputs.hardware == planning.DATASHEET_PREFIX + args.hardware
    asked = plan_ask(args)  # the node size and links as the command resolves them (flags, --network, defaults)
    assert (inputs.gpus, inputs.gpus_per_node, inputs.interconnect or None, inputs.offload) == \
        (0, asked.gpus_per_node, asked.interconnect, args.offload)  # no interconnect: the generation's network
    assert asked.intra_node is None  # the card's own link, as the page has it
    assert args.gpus is None and args.budget is None and inputs.budget == ""  # no budget: the card's default
    # An axis given alone: the page fills the others as the command does (sp stays off under tp 2).
    for flags, axes in ((("--tp", "2"), {"tp": "2"}), (("--pp", "2", "--schedule", "interleaved"),
                                                      {"pp": "2", "schedule": "interleaved"}),
                        (("--dp", "8", "--zero", "2"), {"dp": "8", "zero": "2"})):
        assert planning.build_layout(inputs.with_(**axes)) == layout_from_args(cli_args(*flags), **ONE_GPU), flags


def test_the_default_page_plan_is_the_commands(run_cli):
    inputs = planning.PlanInputs()
    page = planning.make_plan(inputs, planning.resolve_preset(inputs.model), *planning.datasheet_hardware(inputs.hardware))
    result = run_cli("plan", "--model", inputs.model, "--global-batch", str(inputs.global_batch), "--json", "--top", "0")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == json.loads(json.dumps(plan_to_dict(page, None)))
    assert page.recommendation is not None and page.recommendation.layout == Layout()


def render_readme_plan(url: str, device: str, monkeypatch, **more: str) -> AppTest:
    monkeypatch.setenv("HEADROOM_DB", url)
    at = AppTest.from_file(APP, default_timeout=120)
    flags = dict(zip(README_PLAN[::2], README_PLAN[1::2], strict=True))
    at.query_params.update({flag.removeprefix("--").replace("-", "_"): value for flag, value in flags.items()}
                           | {"hardware": planning.MEASURED_PREFIX + device} | more)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_the_readme_plan_is_the_same_on_the_page_and_the_command_line(smoke_store, run_cli, monkeypatch):
    from headroom.db.hardware import resolve_hardware

    at = render_readme_plan(smoke_store.url, smoke_store.device_name, monkeypatch)
    inputs = planning.PlanInputs(model="bench-llama-small", seq_len=128, global_batch=8, budget="4GB",
                                 precision="fp32", hardware=planning.MEASURED_PREFIX + smoke_store.device_name)
    page = planning.make_plan(inputs, planning.resolve_preset(inputs.model),
                              *resolve_hardware(smoke_store.device_name, smoke_store.url, source="measured"))
    assert [str(s.value) for s in at.success] == [f"**Recommendation:** {plan_tables.recommendation_text(page)}"]
    result = run_cli("plan", *README_PLAN, "--hardware", "latest", "--db", smoke_store.url, "--json", "--top", "0")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == json.loads(json.dumps(plan_to_dict(page, None)))


def test_a_cpu_is_described_as_a_cpu(smoke_store, monkeypatch):
    """Two ranks of the smoke store's CPU: no "GPUs a node on PCIe", and the link between them is called a
    stand-in (it was "8 GPUs a node on PCIe 4.0 x16")."""
    from headroom.dashboard.text import plain

    at = render_readme_plan(smoke_store.url, smoke_store.device_name, monkeypatch, dp="2")
    header = next(str(m.value) for m in at.markdown if str(m.value).startswith("**bench-llama-small**"))
    assert header.endswith("tp 1, pp 1, cp 1, dp 2, zero 0 (2 devices), fp32, adamw, reference stack on "
                           f"**{plain(smoke_store.device_name)}** (measured), budget 4.0 GB per device")
    clusters = [str(c.value) for c in at.caption if str(c.value).startswith("Cluster:")]
    assert clusters == [
        f"Cluster: 8 ranks a node on the CPU {plain(smoke_store.device_name)}, no GPU: "
        f"{get_link(FALLBACK_INTRA_NODE_LINK).name} assumed between them, a stand-in (a CPU has no datasheet link, "
        f"and the store holds no collectives measured on it); nodes on {get_link('ib-ndr').name}."]
    assert "GPU" not in " ".join(str(s.value) for s in at.success)
    assert any(str(c.value).endswith("GB runtime reserve. GB = 1e9 bytes.") for c in at.caption)


@pytest.mark.parametrize("hardware", [hw.key for hw in HARDWARE])
def test_on_every_datasheet_device_the_page_and_the_command_default_alike(hardware, run_cli):
    """The budget follows the card (80 GB, or all of a smaller one) and the network between nodes the GPU's
    generation, on the page as in `headroom plan`: the same request, hardware and cluster in the JSON."""
    inputs = planning.PlanInputs(model="bench-llama-tiny", seq_len=64, global_batch=16, gpus=16,
                                 hardware=planning.DATASHEET_PREFIX + hardware)
    page = plan_to_dict(planning.make_plan(inputs, planning.resolve_preset(inputs.model),
                                           *planning.datasheet_hardware(inputs.hardware)))
    result = run_cli("plan", "--model", "bench-llama-tiny", "--seq-len", "64", "--global-batch", "16", "--gpus", "16",
                     "--hardware", hardware, "--json")
    assert result.returncode in (0, 3), result.stderr
    command = json.loads(result.stdout)
    assert command["request"] == page["request"] and command["hardware"] == page["hardware"]
    profile = datasheet_profile(get_hardware(hardware))
    assert page["request"]["budget_bytes"] == default_budget(profile) == min(80 * 10**9, profile.memory_bytes)
    assert page["hardware"]["cluster"]["inter"] == INTER_NODE_LINK[hardware]
