"""Every dashboard page under Streamlit's AppTest: empty, outdated and smoke-filled stores; the plan reacts."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from headroom.dashboard import plan_tables, planning, widths
from headroom.dashboard.text import plain

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from headroom.db.store import open_store  # noqa: E402

APP = str(Path(__file__).resolve().parents[1] / "dashboard" / "app.py")
PAGES = ("plan", "hardware", "history", "calibration")
OLD_STORE = Path(__file__).parent / "fixtures" / "db" / "store-0001.db"
EIGHT_RANKS = {"model": "llama2-7b", "seq_len": "4096", "dp": "8", "zero": "3", "reshard_after_forward": "off"}
"""llama2-7b at 4096 tokens on eight data-parallel ranks, FSDP kept gathered to backward (plain PyTorch's ZeRO-2;
ZeRO-2 itself was the page's default before it took
``headroom plan``'s one GPU): the plan whose tables these tests pin."""


def render(page: str, url: str, monkeypatch, query: dict[str, str] | None = None) -> AppTest:
    monkeypatch.setenv("HEADROOM_DB", url)
    at = AppTest.from_file(APP, default_timeout=120)
    if query:
        at.query_params.update(query)
    if page != "plan":
        at.switch_page(f"views/{page}.py")
    at.run()
    assert not at.exception, f"{page}: {[e.value for e in at.exception]}"
    return at


def texts(at: AppTest) -> str:
    """Everything the page wrote as text: markdown, captions, alerts, code, titles."""
    parts = [e.value for kind in ("markdown", "caption", "info", "success", "warning", "error", "code", "title",
                                  "subheader") for e in at.get(kind)]
    return "\n".join(str(p) for p in parts)


def recommendation(at: AppTest) -> str:
    shown = [str(e.value) for e in (*at.success, *at.error) if "Recommendation" in str(e.value)]
    assert len(shown) == 1, texts(at)
    return shown[0]


@pytest.mark.parametrize("page", PAGES)
def test_every_page_runs_without_a_store(page, tmp_path, monkeypatch):
    path = tmp_path / "results.db"
    at = render(page, str(path), monkeypatch)
    shown = texts(at)
    if page == "plan":
        assert "micro-batch" in recommendation(at)  # planning from datasheets still works
        assert "planning from datasheets" in shown
    else:  # the command that fills the store the page shows, --db included
        assert f"headroom agent run --suite quick --db sqlite:///{path}" in shown
    assert not path.exists(), "the dashboard must never create a store"


@pytest.mark.parametrize("page", PAGES)
def test_every_page_runs_on_an_empty_store(page, tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'results.db'}"
    open_store(url, mode="write").close()
    at = render(page, url, monkeypatch)
    if page == "plan":
        assert "micro-batch" in recommendation(at)
    else:
        assert f"headroom agent run --suite quick --db {url}" in texts(at)


@pytest.mark.parametrize("page", PAGES)
def test_an_outdated_store_shows_the_upgrade_command(page, tmp_path, monkeypatch):
    path = tmp_path / "old.db"
    shutil.copy(OLD_STORE, path)
    before = path.read_bytes()
    at = render(page, f"sqlite:///{path}", monkeypatch)
    assert f"headroom db upgrade --db 'sqlite:///{path}'" in [c.value for c in at.code]
    assert path.read_bytes() == before, "a reader must not migrate"


@pytest.mark.parametrize("page", PAGES)
def test_every_page_runs_on_the_smoke_store(page, smoke_store, monkeypatch):
    url = smoke_store.url
    at = render(page, url, monkeypatch)
    shown = texts(at)
    assert "headroom agent run" not in shown
    charts = at.get("vega_lite_chart")
    if page == "hardware":
        assert len(charts) == 3  # roofline, TFLOP/s by size, bandwidth by op
        assert re.search(r"\*\*measured (fp32|bf16)\*\* roof: [0-9.]+ TFLOP/s", shown), shown
    elif page == "history":
        assert len(charts) == 1 and len(at.dataframe) >= 1
        assert "drop of more than 5%" in shown
        runs = at.dataframe[0].value  # side by side: plain row names, "-" where a CPU has no driver
        assert {"started (UTC)", "driver", "CUDA", "torch"} <= set(runs.index)
        assert not runs.isin(["None", "nan"]).any().any() and (runs.loc["driver"] == "-").all()
    elif page == "calibration":
        assert len(charts) == 2
        stats = at.dataframe[0].value
        assert set(stats["policy"]) >= {"none", "full"} and (stats["steps"] > 0).all()
        config = json.loads(at.dataframe[0].proto.columns)
        assert config["measured / predicted (median)"] == {"label": "measured / predicted",
                                                           "type_config": {"type": "number", "format": "x%.3f"}}
        assert config["worst |error|"] == {"label": "worst |error|",
                                           "type_config": {"type": "number", "format": "percent", "step": 0.0001}}
        assert not re.findall(r"\b[a-z]+_[a-z_]+\b|\w+\(\)", shown), shown  # no function or field names
    elif page == "plan":  # time by term, memory per rank kind, peak by component, every candidate
        assert len(charts) == 4 and "micro-batch" in recommendation(at)


def test_planning_on_a_measured_device_is_calibrated(smoke_store, monkeypatch):
    url = smoke_store.url
    at = render("plan", url, monkeypatch)
    measured = [o for o in at.selectbox(key="plan_hardware").options if o.startswith("measured: ")]
    assert measured, "the store's device is offered as hardware"
    at.selectbox(key="plan_model").set_value("bench-llama-small")
    at.selectbox(key="plan_hardware").set_value(measured[0])
    at.number_input(key="plan_seq_len").set_value(128)
    at.run()
    assert not at.exception
    assert "micro-batch" in recommendation(at)
    # The store's calibration reaches the page. Which of its steps count for time depends on how busy this
    # machine was while the smoke store measured them; the CPU's memory wording and its ledger check do not.
    shown = texts(at)
    assert "Uncalibrated" not in shown and "\n- Step time: " in shown
    assert "\n- Peak memory: - (no allocator statistics on this device).\n" in shown
    assert "\n- Saved activations (a check of the ledger, not applied): measured/predicted x1.000 over" in shown
    # What the smoke suite measured, and this plan beside it: one device, a policy the suite ran.
    assert (f"**Confidence:**\n- Measured on {plain(smoke_store.device_name)}: 10 steps. Models: bench-llama-small. "
            "Devices: 1. Policies: every-2, full, none, op-selective, selective.\n- This plan: bench-llama-small, "
            "1 device, policy ") in shown
    assert ": inside what was measured.\n" in shown


def test_the_plan_tables_show_plain_names_units_and_separators(tmp_path, monkeypatch):
    at = render("plan", str(tmp_path / "none.db"), monkeypatch, EIGHT_RANKS)
    ranked = next(d for d in at.dataframe if "headroom_gb" in d.value.columns)
    rejected = next(d for d in at.dataframe if "broken_by" in d.value.columns)
    config = json.loads(ranked.proto.columns)
    assert {name: config[name]["label"] for name in ranked.value.columns} == {
        "rank": "rank", "candidate": "candidate", "micro_batch": "micro-batch", "accumulation": "accumulation",
        "recompute": "recompute", "tokens_per_s": "tokens/s", "step_time_s": "step (s)", "peak_gb": "peak (GB)",
        "required_gb": "needs (GB)", "headroom_gb": "headroom (GB)"}
    number = {name: config[name]["type_config"]["format"] for name in ranked.value.columns
              if config[name]["type_config"]["type"] == "number"}
    assert number == {"rank": "%,d", "micro_batch": "%,d", "accumulation": "%,d", "tokens_per_s": "%,.0f",
                      "step_time_s": "%,.4g", "peak_gb": "%,.1f", "required_gb": "%,.1f", "headroom_gb": "%,.1f"}
    assert ranked.proto.placeholder == rejected.proto.placeholder == "-"  # an empty rank reads "-", not None
    assert list(rejected.value.columns) == ["candidate", "tokens_per_s", "required_gb", "over_gb", "broken_by"]
    assert config["over_gb"]["label"] == "over (GB)"
    # At 1,440 px: the candidate's label says its micro-batch, accumulation and policy, the budget less what it needs
    # is its headroom; every text column as wide as its longest text (headroom.dashboard.widths)
    assert list(ranked.proto.column_order) == ["rank", "candidate", "tokens_per_s", "step_time_s", "peak_gb",
                                               "required_gb"]
    assert config["candidate"]["width"] == widths.column_px(ranked.value["candidate"], "candidate")
    reasons = json.loads(rejected.proto.columns)["broken_by"]
    assert reasons["label"] == "what breaks the budget"
    assert reasons["width"] >= widths.column_px(rejected.value["broken_by"])
    assert not rejected.proto.HasField("row_height")  # one layout: the reason has room on one line
    assert rejected.value["broken_by"].iloc[0] == "activations (40.5 GB) break it on top of 13.5 GB static"


def test_a_plan_compares_with_another_model_budget_or_hardware(tmp_path, monkeypatch):
    at = render("plan", str(tmp_path / "none.db"), monkeypatch)
    here = recommendation(at)
    assert any("pick one, then Compare" in c.value for c in at.caption)
    compare = at.button(key="FormSubmitter:compare_plan-Compare")
    at.selectbox(key="other_model").set_value("bench-llama-small")
    at.text_input(key="other_budget").set_value("40GB")
    compare.click().run()
    assert not at.exception and recommendation(at) == here  # this plan stays as it was
    plans = [planning.make_plan(inputs, planning.resolve_preset(inputs.model), *planning.datasheet_hardware(inputs.hardware))
             for inputs in (planning.PlanInputs(), planning.PlanInputs(model="bench-llama-small", budget="40GB"))]
    this, other = plans
    markdown = [m.value for m in at.markdown]
    assert f"**This plan:** {plan_tables.plan_title(this)}" in markdown
    assert "**Other plan:** bench-llama-small on h100-sxm (datasheet), budget 40.0 GB" in markdown
    side_by_side = [(m.label, m.value) for m in at.metric][-8:]  # after the recommendation's eight
    assert side_by_side == [(label, plan_tables.plan_figures(plan)[label]) for plan in plans
                            for label in ("tokens/s", "step time", "MFU", "needs per GPU")]
    assert at.metric[-4].delta == plan_tables.tokens_per_s_change(this, other)
    assert plan_tables.recommendation_text(other) in [c.value for c in at.caption]

    at.selectbox(key="other_model").set_value(planning.SAME)
    at.text_input(key="other_budget").set_value("")
    at.selectbox(key="other_hardware").set_value("datasheet: h200")
    at.button(key="FormSubmitter:compare_plan-Compare").click().run()
    assert not at.exception
    assert "**Other plan:** llama3.2-1b on h200 (datasheet), budget 80.0 GB" in [m.value for m in at.markdown]


def test_changing_the_budget_changes_the_recommendation(tmp_path, monkeypatch):
    at = render("plan", str(tmp_path / "none.db"), monkeypatch)
    roomy = recommendation(at)
    at.text_input(key="plan_budget").set_value("40GB").run()
    assert not at.exception
    assert recommendation(at) != roomy
    assert at.query_params["budget"] == ["40GB"] or at.query_params["budget"] == "40GB"


def test_the_budget_follows_the_card_and_one_beyond_it_is_flagged(tmp_path, monkeypatch):
    at = render("plan", str(tmp_path / "none.db"), monkeypatch)
    at.selectbox(key="plan_hardware").set_value("datasheet: rtx-4090").run()
    assert not at.exception and not at.warning
    assert at.markdown[0].value.endswith("budget 24.0 GB per GPU")  # all of a smaller card, as `headroom plan`
    at.text_input(key="plan_budget").set_value("80GB").run()
    assert not at.exception
    assert [str(w.value) for w in at.warning] == [
        "The 80.0 GB budget is more than the 24.0 GB the rtx-4090 holds; a budget of at most 24.0GB plans for it."]
    at.text_input(key="plan_budget").set_value("")
    at.selectbox(key="plan_hardware").set_value("datasheet: h200").run()
    assert not at.exception and at.markdown[0].value.endswith("budget 80.0 GB per GPU")
    assert plain("Budget: 80.0 of the 141.0 GB the h200 holds; set the budget to 141GB to plan all of it.") in [
        c.value for c in at.caption]


def test_changing_the_model_changes_the_recommendation(tmp_path, monkeypatch):
    at = render("plan", str(tmp_path / "none.db"), monkeypatch)
    small = recommendation(at)
    at.selectbox(key="plan_model").set_value("llama2-7b").run()  # needs more than one GPU
    assert not at.exception
    assert recommendation(at) != small


def test_the_training_stack_changes_the_plan_and_the_header_names_it(tmp_path, monkeypatch):
    at = render("plan", str(tmp_path / "none.db"), monkeypatch, {"stack": "torch"})  # a link from before the rename
    assert at.selectbox(key="plan_stack").value == "reference" and "reference stack" in texts(at)
    reference = recommendation(at)
    at.selectbox(key="plan_stack").set_value("megatron").run()
    assert not at.exception
    assert "megatron stack" in texts(at) and recommendation(at) != reference



def test_liger_plans_without_logits_and_refuses_tensor_parallelism_by_name(tmp_path, monkeypatch):
    at = render("plan", str(tmp_path / "none.db"), monkeypatch, {"stack": "hf"})
    hf = recommendation(at)
    at.selectbox(key="plan_stack").set_value("hf-liger").run()
    assert not at.exception
    assert "hf-liger stack" in texts(at) and recommendation(at) != hf
    at = render("plan", str(tmp_path / "none.db"), monkeypatch, {"stack": "hf-liger", "tp": "2"})
    assert not at.exception
    assert "Liger's fused linear cross-entropy needs the head's whole vocabulary on each rank" in texts(at)

def test_a_shared_url_restores_the_inputs(tmp_path, monkeypatch):
    query = {"model": "llama3.2-1b", "seq_len": "2048", "global_batch": "32", "dp": "4", "budget": "24GB",
             "hardware": "datasheet: rtx-4090"}
    at = render("plan", str(tmp_path / "none.db"), monkeypatch, query)
    assert at.selectbox(key="plan_model").value == "llama3.2-1b"
    assert at.text_input(key="plan_budget").value == "24GB"
    assert at.selectbox(key="plan_hardware").value == "datasheet: rtx-4090"
    assert "rtx-4090" in texts(at) and "24.0 GB" in texts(at)


def test_a_mixture_of_experts_from_its_dimensions_is_planned_with_its_active_parameters(tmp_path, monkeypatch):
    query = {"source": "dimensions", "n_layers": "8", "hidden": "1024", "n_heads": "8", "n_kv_heads": "8",
             "ffn_hidden": "2816", "vocab_size": "32000", "n_experts": "8", "experts_per_token": "2",
             "seq_len": "2048", "global_batch": "16"}
    at = render("plan", str(tmp_path / "none.db"), monkeypatch, query)
    assert at.number_input(key="plan_n_experts").value == 8
    spec = planning.dimensions_spec(planning.PlanInputs.from_query(query))
    # Per block: attention 4 x 1,024^2, two norms, the router 8 x 1,024, each expert 3 x 1,024 x 2,816; with
    # the embedding and head (32,000 x 1,024 each) and the final norm.
    block, expert, outside = 4 * 1024**2 + 2 * 1024 + 8 * 1024, 3 * 1024 * 2816, 2 * 32000 * 1024 + 1024
    assert (spec.parameters, spec.active_parameters) == (8 * (block + 8 * expert) + outside,
                                                         8 * (block + 2 * expert) + outside) == (652_821_504, 237_585_408)
    assert "(0.65B parameters, 0.24B active per token)" in texts(at)
    assert "micro-batch" in recommendation(at)
    capped = render("plan", str(tmp_path / "none.db"), monkeypatch, {**query, "capacity_factor": "1.25"})
    assert capped.number_input(key="plan_capacity_factor").value == 1.25
    assert planning.dimensions_spec(planning.PlanInputs.from_query({**query, "capacity_factor": "1.25"})) == \
        dataclasses.replace(spec, capacity_factor=1.25)


def test_export_snippets_come_with_download_buttons(tmp_path, monkeypatch):
    at = render("plan", str(tmp_path / "none.db"), monkeypatch)
    snippets = [c.value for c in at.code]
    assert any("per_device_train_batch_size=" in s for s in snippets)
    assert any("gradient_accumulation_steps" in s or "train_micro_batch_size_per_gpu" in s for s in snippets)
    from headroom.core.exports import EXPORTERS

    assert len(at.get("download_button")) == len(EXPORTERS)


REFERENCE_BUNDLE = Path(__file__).parent / "data" / "reference" / "nvidia-h200-2026-11-30.json.gz"


@pytest.fixture(scope="module")
def reference_store(tmp_path_factory):
    """`headroom dashboard --bundle`'s store: the H200 reference run, loaded into a scratch SQLite file."""
    from headroom.cli.dashboard import load_bundle

    return load_bundle(REFERENCE_BUNDLE, tmp_path_factory.mktemp("bundle"))


@pytest.mark.parametrize("page", PAGES)
def test_every_page_shows_the_reference_gpu(page, reference_store, monkeypatch):
    at = render(page, reference_store, monkeypatch)
    shown = texts(at)
    assert "headroom agent run" not in shown
    if page == "plan":
        measured = [o for o in at.selectbox(key="plan_hardware").options if o.startswith("measured: ")]
        assert measured == ["measured: NVIDIA H200"]
    elif page == "hardware":
        assert "NVIDIA H200" in shown and len(at.get("vega_lite_chart")) == 3
    elif page == "calibration":
        stats = at.dataframe[0].value
        assert set(stats["policy"]) == {"none", "full", "every-2", "selective", "op-selective", "offload"}


def test_a_missing_or_damaged_bundle_is_refused_with_its_name(run_cli, tmp_path):
    missing = run_cli("dashboard", "--bundle", str(tmp_path / "nowhere.json.gz"))
    assert missing.returncode == 2 and "cannot read bundle" in missing.stderr and "nowhere.json.gz" in missing.stderr
    truncated = tmp_path / "cut.json.gz"
    truncated.write_bytes(REFERENCE_BUNDLE.read_bytes()[:5000])
    cut = run_cli("dashboard", "--bundle", str(truncated))
    assert cut.returncode == 2 and "truncated or damaged gzip" in cut.stderr
    both = run_cli("dashboard", "--bundle", str(REFERENCE_BUNDLE), "--db", str(tmp_path / "x.db"))
    assert both.returncode == 2 and "not allowed with argument" in both.stderr


def test_stopping_headroom_dashboard_stops_its_server(tmp_path):
    """SIGTERM to `headroom dashboard` (as `kill` sends) stops Streamlit too: nothing is left listening."""
    import signal
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "HEADROOM_DB"} | {"XDG_DATA_HOME": str(tmp_path)}
    wrapper = subprocess.Popen([sys.executable, "-m", "headroom.cli.main", "dashboard", "--port", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert wrapper.poll() is None, f"headroom dashboard exited with {wrapper.returncode}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as response:
                    if response.read().strip() == b"ok":
                        break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("the dashboard did not answer /_stcore/health within 90 s")
        wrapper.send_signal(signal.SIGTERM)
        assert wrapper.wait(timeout=30) == 128 + signal.SIGTERM
        with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
            probe.connect(("127.0.0.1", port))
    finally:
        if wrapper.poll() is None:
            os.killpg(wrapper.pid, signal.SIGKILL)


def test_a_stored_name_with_markdown_is_shown_as_text(markup_store, monkeypatch):
    """A forged bundle's device name reaches the pages escaped: its brackets and colons are characters, so
    no link or remote image is made of it (tests/test_dashboard_browser.py checks the rendered page)."""
    from headroom.dashboard.text import plain
    from tests.conftest import MARKUP_NAME

    escaped = plain(MARKUP_NAME)
    assert escaped == ("\\[click here\\](https\\:/\u2060/evil.example) \\!\\[x\\](https\\:/\u2060/evil.example/p.png) "
                       "\\*GPU\\*")
    hardware = render("hardware", markup_store, monkeypatch)
    assert escaped in texts(hardware) and "[click here](" not in texts(hardware)
    plan = render("plan", markup_store, monkeypatch)
    plan.selectbox(key="plan_model").set_value("bench-llama-small")
    plan.selectbox(key="plan_hardware").set_value(f"measured: {MARKUP_NAME}")
    plan.number_input(key="plan_seq_len").set_value(128)
    plan.run()
    assert not plan.exception
    shown = texts(plan)
    assert f"**{escaped}** (measured)" in shown and "[click here](" not in shown


def test_the_empty_store_hint_names_the_store_it_fills(monkeypatch, tmp_path):
    from headroom.dashboard.notices import AGENT_COMMAND, agent_command
    from headroom.db.location import default_url

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert agent_command(default_url()) == AGENT_COMMAND  # the default file needs no --db
    assert agent_command("postgresql+psycopg://planner:secret@db.example/headroom") == \
        "headroom agent run --suite quick --db 'postgresql+psycopg://planner:***@db.example/headroom'"
    assert agent_command(f"sqlite:///{tmp_path / 'my store.db'}") == \
        f"headroom agent run --suite quick --db 'sqlite:///{tmp_path / 'my store.db'}'"
