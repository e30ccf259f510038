"""The Calibration page marks the noisy steps that the step-time factor leaves out, so its table counts the
steps the factor uses (headroom.core.measured.calibration: a busy host, or repetitions spread more than their median).
Its two kinds of table say which predictions they compare with: the ones stored with each step (no factor, by
policy), and today's core's with the factor plans apply (in-sample); "-" where nothing was measured."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import pandas as pd
import pytest

from headroom.core.specs.config import TrainConfig
from headroom.core.specs.run_config import RunConfig
from headroom.dashboard.planning import PlanInputs
from headroom.db.models import TrainStepResult
from headroom.db.store import open_store
from tests.db_support import LLAMA2_7B, fingerprint, results

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

APP = str(Path(__file__).resolve().parents[1] / "dashboard" / "app.py")
DEVICE = "NVIDIA H100 80GB HBM3"
BUSY = "the agent found the host busy"
SPREAD = "its steps spread 160% of their median"


def step(micro_batch: int, median_s: float, min_s: float, max_s: float, predicted_s: float,
         busy: bool | None = None) -> TrainStepResult:
    return TrainStepResult(
        model_name="llama2-7b", model_spec=LLAMA2_7B, seq_len=4096, micro_batch=micro_batch,
        samples_s=[min_s, median_s, max_s], median_s=median_s, min_s=min_s, max_s=max_s,
        tokens_per_s=4096 * micro_batch / median_s, peak_allocated_bytes=60_000_000_000 * micro_batch,
        predicted_peak_bytes=50_000_000_000 * micro_batch, predicted_step_time_s=predicted_s,
        details=None if busy is None else {"host": {"busy": busy}})


STEPS = [step(1, 1.0, 0.98, 1.05, 0.8, busy=False),  # kept: measured / predicted 1.25
         step(2, 1.5, 1.49, 1.52, 1.0, busy=True),  # the agent found the host busy
         step(4, 1.0, 0.9, 2.5, 1.2)]  # (2.5 - 0.9) / 1.0 = 160% of its median, on a row from before the verdict


@pytest.fixture(scope="module")
def store_url(tmp_path_factory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('calibration') / 'results.db'}"
    with open_store(url, mode="write") as store:
        with store.recording(fingerprint(), suite="standard", benchmark_version="1") as run_id:
            for result in [*results(0), *STEPS]:
                store.add_result(run_id, result)
    return url


def test_the_step_time_table_leaves_out_and_counts_the_noisy_steps_as_the_factor_does(store_url, monkeypatch):
    monkeypatch.setenv("HEADROOM_DB", store_url)
    at = AppTest.from_file(APP, default_timeout=120)
    at.switch_page("views/calibration.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    memory, time, steps, factors = (frame.value for frame in at.dataframe)  # steps: in the expander
    assert memory.to_dict("records") == [  # bytes do not depend on a busy host: every step counts
        {"device": DEVICE, "policy": "none", "steps": 3, "measured / predicted (median)": pytest.approx(1.2),
         "median |error|": pytest.approx(0.2), "worst |error|": pytest.approx(0.2)}]
    assert time.to_dict("records") == [
        {"device": DEVICE, "policy": "none", "steps": 1, "measured / predicted (median)": pytest.approx(1.25),
         "median |error|": pytest.approx(0.25), "worst |error|": pytest.approx(0.25), "noisy, left out": 2}]
    links = [PlanInputs.from_query(dict(parse_qsl(urlsplit(link).query))) for link in steps["plan"]]
    assert [(i.model, i.hardware, i.run_config()) for i in links] == [
        ("llama2-7b", f"measured: {DEVICE}", RunConfig(train=TrainConfig(seq_len=4096, micro_batch=micro)))
        for micro in (1, 2, 4)]
    assert all(urlsplit(link).path == "/" for link in steps["plan"])  # the Plan page, the app's default
    step_time = factors[factors["quantity"] == "step time"].iloc[0]
    assert (step_time["steps used"], step_time["left out"]) == (1, 2)  # the factor's own count
    assert factors.to_dict("records")[2] == {  # one GPU: no communication measured
        "quantity": "communication", "steps used": 0, "factor (measured / predicted)": "-", "applied": "no",
        "median |error| before": "-", "median |error| after (in-sample)": "-", "error range after (in-sample)": "-",
        "left out": 0}
    markdown = [m.value for m in at.markdown]
    assert markdown[:2] == [
        f"**{title} against the prediction stored with each step (no factor): error by device and policy**"
        for title in ("Peak memory", "Step time")]
    confidence = markdown[2].split("\n")
    assert confidence[:2] == ["**Confidence:**",
                              f"- Measured on {DEVICE}: 3 steps. Models: llama2-7b. GPUs: 1. Policies: none."]
    assert confidence[-1] == "- Communication: -."
    assert ("Today's core predicts every step again with the device's measured profile. Steps the agent flagged (a "
            "busy host, repetitions that disagree) are left out. Outliers (more than 2x from the median) are left out. "
            "The median measured / predicted of the rest is the factor plans multiply by. A factor beyond 2x is not "
            "applied. The error after the factor is in-sample: the factor is fitted on the same steps. The tables above "
            "differ: they compare each step with the prediction stored when it ran, by policy, with no factor.") in [
        c.value for c in at.caption]
    assert dict(zip(steps["label"], steps["noisy"], strict=True)) == {
        f"llama2-7b s4096 micro {micro} x1 none amp-bf16": why for micro, why in ((1, ""), (2, BUSY), (4, SPREAD))}
    assert ("2 of 3 measured steps' times are noisy (the agent found the host busy, or the slowest repetition took "
            "more than its median again): the step-time statistics leave them out, as the factor plans apply does. "
            "Memory counts every step: bytes do not depend on a busy host.") in [c.value for c in at.caption]


def test_noisy_follows_the_cores_rule():
    from headroom.dashboard.calibration import error_stats, noisy, time_points

    train = pd.DataFrame({
        "device_name": ["gpu"] * 4, "model_name": ["m"] * 4, "seq_len": [8] * 4, "micro_batch": [1, 2, 4, 8],
        "accumulation_steps": [1] * 4, "recompute": ["none"] * 4, "precision": ["fp32"] * 4,
        "optimizer": ["adamw"] * 4, "attention": ["flash"] * 4, "fp8": ["off"] * 4, "compile": [False] * 4,
        "dropout": [None] * 4, "stack": [None] * 4, "layout": [None] * 4,
        "median_s": [1.0, 1.0, 1.0, 1.0], "min_s": [0.9, 0.5, 0.9, None], "max_s": [1.1, 1.5, 2.5, None],
        "host_busy": [None, float("nan"), False, True],
        "predicted_step_time_s": [0.5, 1.0, 2.0, 4.0]})
    assert list(noisy(train)) == ["", "", SPREAD, BUSY]  # a spread of exactly its median is not beyond it
    stats = error_stats(time_points(train))
    assert stats.to_dict("records") == [
        {"device": "gpu", "policy": "none", "steps": 2, "measured / predicted (median)": pytest.approx(1.5),
         "median |error|": pytest.approx(0.5), "worst |error|": pytest.approx(1.0), "noisy, left out": 2}]


def test_the_factor_table_reads_a_dash_where_nothing_was_fitted_or_applied():
    from headroom.core.measured.calibration import Observation, calibrate
    from headroom.dashboard.calibration import FACTOR_COLUMNS, factor_table

    # Peak memory 1.1x, 1.2x and 1.4x its prediction; step time 3x (beyond 2x: not applied); a ledger check.
    fit = calibrate("gpu", [Observation(10.0, 10.0 * r, 1.0, 3.0, f"s{i}", predicted_activation_bytes=5.0,
                                        measured_activation_bytes=5.0) for i, r in enumerate((1.1, 1.2, 1.4))])
    table = factor_table(fit)
    assert list(table.columns) == FACTOR_COLUMNS
    assert table.to_dict("records") == [
        {"quantity": "peak memory", "steps used": 3, "factor (measured / predicted)": "x1.200", "applied": "yes",
         "median |error| before": "20.0%", "median |error| after (in-sample)": "8.3%",  # |1.1 / 1.2 - 1|
         "error range after (in-sample)": "-8.3% to +16.7%", "left out": 0},
        {"quantity": "step time", "steps used": 3, "factor (measured / predicted)": "x3.000", "applied": "no",
         "median |error| before": "200.0%", "median |error| after (in-sample)": "-",
         "error range after (in-sample)": "-", "left out": 0},
        {"quantity": "communication", "steps used": 0, "factor (measured / predicted)": "-", "applied": "no",
         "median |error| before": "-", "median |error| after (in-sample)": "-", "error range after (in-sample)": "-",
         "left out": 0},
        {"quantity": "saved activations (check only)", "steps used": 3, "factor (measured / predicted)": "x1.000",
         "applied": "no", "median |error| before": "0.0%", "median |error| after (in-sample)": "-",
         "error range after (in-sample)": "-", "left out": 0}]
    one = factor_table(calibrate("gpu", [Observation(None, None, 1.0, 1.2, "one step")])).to_dict("records")[1]
    assert (one["factor (measured / predicted)"], one["median |error| after (in-sample)"],
            one["error range after (in-sample)"]) == ("x1.200", "0% by construction (one step)", "-")


def test_the_confidence_shows_stored_names_as_text_one_topic_an_item():
    from headroom.core.measured.calibration import Observation, calibrate
    from headroom.dashboard.text import confidence_markdown, plain

    forged = "[click](https://x.example)"
    fit = calibrate(forged, [Observation(None, None, 1.0, 1.0, "s", model=forged, gpus=1, policy="*none*")])
    assert confidence_markdown(fit).split("\n")[:2] == [
        "**Confidence:**",
        f"- Measured on {plain(forged)}: 1 step. Models: {plain(forged)}. GPUs: 1. Policies: \\*none\\*."]


def test_each_steps_link_carries_its_layout_stack_and_dropout_as_the_store_holds_them():
    """The layout's JSON text, and the dropout and stack its stored prediction was made for, read back into the
    configuration the link pins; a model that is no preset, a policy today's core cannot read, or a sharding stage the
    step's stack does not run (torchtitan's ZeRO-1, measured by an older agent over its own DDP) has none."""
    from headroom.core.specs.layout import Layout
    from headroom.core.specs.recompute import parse_policy
    from headroom.dashboard.calibration import plan_links

    wide = Layout(tp=2, sp=True, dp=8, zero=3)
    rows = [("llama3.2-1b", 2048, "full", None, "torchtitan", wide, 4, False),
            ("gpt2-small", 1024, "none", 0.1, None, None, 1, False),
            ("llama3.2-1b", 2048, "full", None, None, None, 1, True),  # compiled (revision 0007's column)
            ("my-own-model", 2048, "none", None, None, None, 1, False),
            ("llama3.2-1b", 2048, "sometimes", None, None, None, 1, False),
            ("llama3.2-1b", 2048, "full", None, "torchtitan", Layout(dp=2, zero=1), 1, False)]
    train = pd.DataFrame([{
        "device_name": DEVICE, "model_name": model, "seq_len": seq, "micro_batch": 1, "accumulation_steps": accum,
        "recompute": policy, "attention": "flash", "precision": "bf16-pure" if compiled else "amp-bf16",
        "optimizer": "adamw", "fp8": "off",
        "compile": compiled, "dropout": dropout, "stack": stack,
        "layout": None if layout is None else json.dumps(asdict(layout))}
        for model, seq, policy, dropout, stack, layout, accum, compiled in rows])
    links = list(plan_links(train))
    assert links[3:] == [None, None, None]
    shared = [PlanInputs.from_query(dict(parse_qsl(urlsplit(link).query))) for link in links[:3]]
    assert [(i.model, i.gpus_per_node, i.run_config()) for i in shared] == [
        ("llama3.2-1b", 16, RunConfig(train=TrainConfig(seq_len=2048, recompute=parse_policy("full"),
                                                        stack="torchtitan", layout=wide), accumulation_steps=4)),
        ("gpt2-small", 8, RunConfig(train=TrainConfig(seq_len=1024, dropout=0.1))),
        ("llama3.2-1b", 8, RunConfig(train=TrainConfig(seq_len=2048, recompute=parse_policy("full"),
                                                       precision="bf16-pure", compile=True)))]

