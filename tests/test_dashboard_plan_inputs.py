"""What the Plan page says about its inputs: a shared URL's unknown model, hardware or interconnect is named with
the valid choices before the page falls back, and a pipeline schedule that no pipeline runs is said to be
ignored (or to apply to the pipelined layouts only)."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest

from headroom.core.errors import ConfigError
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.hardware import HARDWARE
from headroom.core.specs.interconnect import LINKS_BY_KEY
from headroom.core.specs.layout import Layout
from headroom.core.specs.presets import PRESETS
from headroom.core.specs.recompute import parse_policy
from headroom.core.specs.run_config import KEYS, OPTIONAL_KEYS, RunConfig
from headroom.dashboard import planning
from headroom.dashboard.planning import PlanInputs

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from tests.dashboard_support import APP, render_url  # noqa: E402
from tests.run_configs import RUNS  # noqa: E402

DATASHEET_ROWS = ", ".join(hw.key for hw in HARDWARE)


def warnings(at: AppTest) -> list[str]:
    return [str(w.value) for w in at.warning]


def test_an_unknown_model_in_the_url_is_named_with_the_presets(tmp_path, monkeypatch):
    at = render_url(tmp_path, monkeypatch, {"model": "llama9-70b", "global_batch": "32"})
    unknown = (f"The URL names the model preset 'llama9-70b', which is not one: planning llama3.2-1b instead. "
               f"Presets: {', '.join(PRESETS)} (`headroom models` lists their sizes); pick one in the sidebar, or "
               "give a config.json or dimensions.")
    assert warnings(at) == [unknown]
    assert at.selectbox(key="plan_model").value == "llama3.2-1b" and at.number_input(key="plan_global_batch").value == 32
    assert "**llama3.2-1b**" in at.markdown[0].value
    at.number_input(key="plan_seq_len").set_value(1024).run()  # another input: the model is still the fallback
    assert warnings(at) == [unknown]
    at.selectbox(key="plan_model").set_value("gpt2-small").run()  # a model picked: the warning has done its work
    assert not at.exception and warnings(at) == []


def test_an_unknown_hardware_in_the_url_is_named_with_the_choices(tmp_path, monkeypatch):
    at = render_url(tmp_path, monkeypatch, {"hardware": "datasheet: h999", "interconnect": "carrier-pigeon"})
    assert warnings(at) == [
        "The URL names the hardware 'datasheet\\: h999', which is neither a device measured in this store nor a "
        "datasheet row: planning datasheet\\: h100-sxm instead. Measured in this store: none; datasheet rows "
        f"(`headroom hardware`): {DATASHEET_ROWS}.",
        "The URL names the interconnect 'carrier-pigeon', which is not one: planning the GPU generation's network "
        f"instead. Networks: {', '.join(LINKS_BY_KEY)}, or NICs x Gb/s a node (4x200g: four 200 Gb/s NICs a node)."]
    assert at.selectbox(key="plan_hardware").value == "datasheet: h100-sxm"
    assert at.selectbox(key="plan_interconnect").value == ""  # auto: an H100's NDR


def test_an_unknown_intra_node_link_in_the_url_is_named_with_the_choices(tmp_path, monkeypatch):
    at = render_url(tmp_path, monkeypatch, {"intra_node": "carrier-pigeon"})
    assert warnings(at) == [
        "The URL names the intra-node link 'carrier-pigeon', which is not one: planning the hardware's own link "
        f"instead. Links: {', '.join(LINKS_BY_KEY)}."]
    assert at.selectbox(key="plan_intra_node").value == ""  # auto: the hardware's own


def test_a_network_given_as_nics_and_their_rate_is_planned_on(tmp_path, monkeypatch):
    """As `headroom plan --interconnect 4x200g`: offered in the list, kept in the URL, the plan's cluster."""
    at = render_url(tmp_path, monkeypatch, {"interconnect": "4x200g", "gpus": "16", "global_batch": "32"})
    assert not warnings(at)
    network = at.selectbox(key="plan_interconnect")
    assert network.value == "4x200g" and network.options == ["auto", *LINKS_BY_KEY, "4x200g"]
    assert at.query_params["interconnect"] == "4x200g"
    assert any("nodes on 4 x 200 Gb/s NICs a node" in str(c.value) for c in at.caption)


def test_a_measured_device_the_store_lacks_is_named_and_replaced_by_the_documented_default(smoke_store,
                                                                                           monkeypatch):
    """Never by another device: the smoke store's CPU once stood in for the GPU the URL named (129 tokens/s "per
    GPU")."""
    from headroom.dashboard.text import plain

    monkeypatch.setenv("HEADROOM_DB", smoke_store.url)
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params.update({"model": "bench-llama-small", "seq_len": "128", "budget": "4GB",
                            "hardware": "measured: NVIDIA B300"})
    at.run()
    assert not at.exception
    assert warnings(at) == [
        f"The URL names the hardware 'measured\\: NVIDIA B300', which is neither a device measured in this store nor "
        f"a datasheet row: planning datasheet\\: h100-sxm instead. Measured in this store: "
        f"{plain(smoke_store.device_name)}; datasheet rows (`headroom hardware`): {DATASHEET_ROWS}."]
    assert at.selectbox(key="plan_hardware").value == planning.PlanInputs().hardware


def test_a_bare_hardware_name_is_its_option(tmp_path, monkeypatch):
    at = render_url(tmp_path, monkeypatch, {"hardware": "h200"})
    assert at.selectbox(key="plan_hardware").value == "datasheet: h200" and warnings(at) == []
    assert "on **h200** (datasheet)" in at.markdown[0].value


def test_a_schedule_without_a_pipeline_is_said_to_be_ignored(tmp_path, monkeypatch):
    at = render_url(tmp_path, monkeypatch, {"schedule": "interleaved", "virtual_stages": "4"})
    assert warnings(at) == [
        "The pipeline schedule and virtual stages are ignored: pp is auto, which plans pp 1 without a GPU count, "
        "and one stage runs no pipeline. Pin pp above 1 (or give a GPU count to search) to plan a pipeline."]
    assert "tp 1, pp 1, cp 1, dp 1, zero 0 (1 GPU)" in at.markdown[0].value
    at.text_input(key="plan_pp").set_value("1").run()
    assert warnings(at) == [
        "The pipeline schedule and virtual stages are ignored: pp is pinned at 1, and one stage runs no pipeline. "
        "Pin pp above 1 (or give a GPU count to search) to plan a pipeline."]
    at.text_input(key="plan_pp").set_value("2").run()
    assert not at.exception and warnings(at) == []
    assert "pp 2 (interleaved x4)" in at.markdown[0].value


def test_the_page_pins_a_split_of_the_layers_and_shows_it(tmp_path, monkeypatch):
    """stage_layers=1,3 in the URL plans pp 2 with those blocks, and the page says where the split came from."""
    at = render_url(tmp_path, monkeypatch, {"model": "bench-llama-small", "seq_len": "128", "global_batch": "8",
                                            "budget": "4GB", "stage_layers": "1, 3"})
    assert not at.exception and warnings(at) == []
    assert at.text_input(key="plan_stage_layers").value == "1,3"
    assert "pp 2 (1f1b, stages 1/3)" in at.markdown[0].value
    assert any(str(c.value) == "Pipeline stages: 1/3 blocks (as given)." for c in at.caption)


def test_a_schedule_pinned_for_a_search_applies_to_its_pipelines(tmp_path, monkeypatch):
    query = {"model": "bench-llama-small", "seq_len": "128", "global_batch": "8", "gpus": "2", "virtual_stages": "2"}
    at = render_url(tmp_path, monkeypatch, query)
    assert warnings(at) == [
        "pp is auto: virtual stages apply only to the layouts the search gives a pipeline (pp > 1); those with pp 1 "
        "run without one. Pin pp to search pipelines of one depth only."]
    # Searched, or left out as too slow to tie (the table under "... left out"): every layout the search made.
    layouts = [layout for d in at.dataframe if {"why", "floor_step_s"} & set(d.value.columns)
               for layout in d.value["layout"]]
    assert [layout for layout in layouts if "pp 1," not in layout] == ["tp 1, pp 2 (interleaved x2), cp 1, dp 1, zero 0"]
    assert len(layouts) > 1  # and the others, pp 1, without a pipeline


def test_the_page_says_what_plan_notes_beside_its_figures(tmp_path, monkeypatch):
    """A sequence beyond llama2-7b's 4,096-token window is context extension: the page says so, as plan does."""
    from headroom.dashboard.text import plain

    at = render_url(tmp_path, monkeypatch, {"model": "llama2-7b", "seq_len": "8192", "dp": "8", "zero": "3"})
    said = [str(e.value) for e in at.info if "context window" in str(e.value)]
    assert said == [plain("seq-len 8,192 is beyond llama2-7b's 4,096-token context window: training there extends the "
                          "context (RoPE scaling); memory and time are accounted the same.")]  # Markdown-escaped


def test_pins_in_the_url_are_read_and_a_bad_one_stays_auto():
    inputs = PlanInputs.from_query({"micro_batch": "08", "accumulation_steps": "auto", "recompute": "Every-2"})
    assert (inputs.micro_batch, inputs.accumulation_steps, inputs.recompute) == ("8", "auto", "every-2")
    bad = PlanInputs.from_query({"micro_batch": "-2", "accumulation_steps": "two", "recompute": "some"})
    assert (bad.micro_batch, bad.accumulation_steps, bad.recompute) == ("auto", "auto", "auto")
    profile, _ = planning.datasheet_hardware(inputs.hardware)
    request = planning.build_request(inputs.with_(global_batch=8), planning.resolve_preset(inputs.model), profile)
    assert (request.micro_batch, request.accumulation, str(request.recompute)) == (8, None, "every-2")
    assert PlanInputs.from_query({"accumulation": "4"}).accumulation_steps == "4"  # a link from before the rename
    assert PlanInputs.from_query({"accumulation_steps": "4", "accumulation": "2"}).accumulation_steps == "4"
    assert PlanInputs.from_query({"dropout": "nan", "capacity_factor": "inf"}) == PlanInputs()  # malformed: defaults


def test_the_query_string_holds_each_key_of_a_run_configuration():
    """A key added to the run configuration's document (or to the layout) must have its place in the URL."""
    held = {f.name for f in fields(PlanInputs)}
    assert set(planning.RUN_KEYS) <= held
    assert set(planning.RUN_KEYS) == (set(KEYS) - {"version", "layout"}) | set(OPTIONAL_KEYS) \
        | {f.name for f in fields(Layout)}


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r.label)
def test_a_run_configuration_travels_in_the_url_and_is_planned_as_it_is(run):
    model = "gpt2-xl" if run.train.dropout else "llama3-70b"  # llama blocks have no dropout
    inputs = PlanInputs.of_run(run, model=model, hardware=planning.DATASHEET_PREFIX + "h100-sxm")
    shared = PlanInputs.from_query(inputs.to_query())
    assert shared == inputs and shared.run_config() == run
    assert inputs.with_(micro_batch=planning.AUTO).run_config() is None  # the planner's to choose
    assert inputs.with_(gpus=run.train.layout.world).run_config() is None  # a search
    profile, _ = planning.datasheet_hardware(inputs.hardware)
    request = planning.build_request(inputs, planning.resolve_preset(model), profile)
    pinned = replace(request.train, micro_batch=request.micro_batch, recompute=request.recompute)
    assert RunConfig(train=pinned, accumulation_steps=request.accumulation) == run
    assert (request.layout, request.global_batch) == (run.train.layout, run.sequences_per_rank * run.train.layout.dp)


def test_a_pinned_configuration_that_does_not_fit_is_shown_with_its_time(tmp_path, monkeypatch):
    """As `headroom plan --micro-batch 8 --recompute none --budget 40GB`: the one configuration, why it does not
    fit, and its speed, MFU, compute and host time."""
    at = render_url(tmp_path, monkeypatch, {"model": "llama3.2-1b", "global_batch": "8", "budget": "40GB",
                                            "hardware": "datasheet: h200", "micro_batch": "8", "recompute": "none"})
    (error,) = [e.value for e in at.error]
    assert error.startswith("**Pinned:** micro 8 x accum 1, none on tp 1, pp 1, cp 1, dp 1, zero 0 does not fit: needs")
    labels = [m.label for m in at.metric]
    assert labels[:8] == ["tokens/s (all ranks)", "step time", "needs per GPU", "headroom", "model TFLOP/s per GPU",
                          "MFU / HFU", "compute a step", "host a step"]
    assert at.metric[3].value.startswith("-")  # headroom: over the budget


def test_the_page_starts_on_the_stores_own_gpu(tmp_path, smoke_store, monkeypatch):
    """A store with a measured GPU (a GPU check's bundle) plans on it; a store of CPU runs alone (the quick start's
    smoke store) keeps the documented default, as does a URL that names the hardware."""
    from headroom.db.store import open_store
    from tests.db_support import record_run

    url = f"sqlite:///{tmp_path / 'gpu.db'}"
    with open_store(url, mode="write") as store:
        record_run(store)  # NVIDIA H100 80GB HBM3, one result of each kind
    for store_url, query, expected in (
            (url, {}, planning.MEASURED_PREFIX + "NVIDIA H100 80GB HBM3"),
            (url, {"hardware": "h200"}, "datasheet: h200"),
            (smoke_store.url, {}, PlanInputs().hardware)):
        monkeypatch.setenv("HEADROOM_DB", store_url)
        at = AppTest.from_file(APP, default_timeout=300)
        at.query_params.update({"model": "bench-llama-small", "seq_len": "128", **query})
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        assert at.selectbox(key="plan_hardware").value == expected and warnings(at) == [], (query, warnings(at))


def test_an_fp8_recipe_travels_in_the_url_and_is_planned():
    """As `headroom plan --fp8 torchao-rowwise` (a run configuration's optional key), and --fp8 auto."""
    run = RunConfig(train=TrainConfig(seq_len=4096, precision="bf16-pure", stack="torchtitan", fp8="torchao-rowwise",
                                      recompute=parse_policy("op-selective")), accumulation_steps=2)
    inputs = PlanInputs.of_run(run, model="llama3-8b", hardware=planning.DATASHEET_PREFIX + "h100-sxm")
    assert inputs.fp8 == "torchao-rowwise"
    shared = PlanInputs.from_query(inputs.to_query())
    assert shared == inputs and shared.run_config() == run
    assert inputs.with_(fp8="auto").run_config() is None  # one candidate a recipe, not one configuration
    profile, _ = planning.datasheet_hardware(inputs.hardware)
    searched = planning.build_request(inputs.with_(fp8="auto", gpus=8), planning.resolve_preset("llama3-8b"), profile)
    assert searched.fp8_search and searched.train.fp8 == "off" and searched.fp8_text == " (fp8 recipes searched)"


def test_the_page_names_the_recipe_and_a_bad_one_in_the_url(tmp_path, monkeypatch):
    at = render_url(tmp_path, monkeypatch, {"model": "llama3.2-1b", "global_batch": "8", "precision": "bf16-pure",
                                            "fp8": "torchao-rowwise", "stack": "torchtitan",
                                            "hardware": "datasheet: h100-sxm"})
    assert not at.exception and warnings(at) == []
    assert "bf16-pure + fp8 torchao-rowwise" in at.markdown[0].value
    # only torchtitan's export carries the recipe: the page says why the others are not exported
    assert [tab.label for tab in at.tabs] == ["torchtitan"]
    refused = [str(c.value) for c in at.caption if str(c.value).startswith("No ")]
    assert [text.split(" tab\\:")[0] for text in refused] == ["No hf", "No megatron", "No deepspeed", "No lightning"]
    assert all(text.endswith("(the plan's fp8 recipe is torchao-rowwise).") for text in refused)
    bad = render_url(tmp_path, monkeypatch, {"fp8": "e5m2"})
    unknown = ("The URL names the fp8 recipe 'e5m2', which is not one: planning without fp8 instead. Recipes: off, "
               "torchao-tensorwise, torchao-rowwise, torchao-mxfp8, te-delayed, te-current, te-mxfp8, or auto.")
    assert warnings(bad) == [unknown]
    assert bad.selectbox(key="plan_fp8").value == "off"


def test_an_uploaded_network_file_fills_the_network_inputs_it_gives():
    """As `headroom plan --network FILE`: the page's GPUs per node, intra-node link and network from the file's
    keys, those it leaves out untouched; a file that is not one is refused naming it and what is wrong."""
    given = planning.network_inputs(b'gpus_per_node = 4\ninterconnect = "4x200g"\n', "cluster.toml")
    assert given == {"gpus_per_node": 4, "interconnect": "4x200g"}
    inputs = PlanInputs(gpus=16, global_batch=32).with_(**given)
    profile, _ = planning.datasheet_hardware(inputs.hardware)
    request = planning.build_request(inputs, planning.resolve_preset(inputs.model), profile)
    assert (request.cluster.gpus_per_node, request.cluster.nics_per_node) == (4, 4)
    with pytest.raises(ConfigError, match=r"network file cluster.toml: unknown key 'colour'"):
        planning.network_inputs(b'colour = "red"\n', "cluster.toml")
    with pytest.raises(ConfigError, match=r"network file big.toml: over 64 KiB"):
        planning.network_inputs(b"#" * (planning.NETWORK_FILE_BYTES + 1), "big.toml")


def test_uploaded_nccl_tests_output_prices_the_nodes_collectives():
    """As `headroom plan --nccl-tests FILE`: each uploaded file one node's run of the collective its output names; a
    plan's tensor-parallel all-reduces then run at its times, a file that is not one is refused by its name."""
    from tests.test_nccl_tests import log

    inputs = PlanInputs(model="llama3-8b", seq_len=4096, global_batch=64, tp="8", dp="1")
    profile, _ = planning.datasheet_hardware(inputs.hardware)
    assert planning.nccl_tests_profile(profile, [], 8) is profile
    measured = planning.nccl_tests_profile(profile, [("ar.log", log(gb_per_s=30.0))], inputs.gpus_per_node)
    assert measured.collectives.group_sizes() == (8,)
    spec = planning.resolve_preset(inputs.model)

    def all_reduce_s(p) -> float:
        plan = planning.make_plan(inputs, spec, p, None)
        return sum(t.seconds for t in plan.recommendation.time.communication if t.op == "all_reduce" and t.axis == "tp")

    assert all_reduce_s(measured) > 2 * all_reduce_s(profile)
    with pytest.raises(ConfigError, match=r"^nccl-tests file notes.txt: no '#  Rank N Group G Pid P on HOST"):
        planning.nccl_tests_profile(profile, [("notes.txt", b"hello\n")], 8)


def test_an_uploaded_run_across_hosts_prices_the_groups_that_span_nodes():
    """A run over two hosts, as `headroom plan --nccl-tests FILE` takes it: tp 8 x dp 2's gradient all-reduce across
    the nodes at its (slow) times, and the cluster's words say where each group's times come from."""
    from headroom.dashboard.plan_notes import cluster_text
    from tests.test_nccl_tests import log

    inputs = PlanInputs(model="llama3-8b", seq_len=4096, global_batch=64, tp="8", dp="2", zero="0")
    profile, _ = planning.datasheet_hardware(inputs.hardware)
    spanning = log(ranks=16, hosts=("node1", "node2"), gb_per_s=5.0)
    measured = planning.nccl_tests_profile(profile, [("ar2.log", spanning)], inputs.gpus_per_node)
    assert measured.collectives.group_sizes() == () and measured.collectives.across_nodes.runs() == (
        ("all_reduce", 16, 8),)
    spec = planning.resolve_preset(inputs.model)

    def data_parallel(p) -> tuple[set[str], float]:
        terms = [t for t in planning.make_plan(inputs, spec, p, None).recommendation.time.communication
                 if t.axis == "dp"]
        return {t.link_key for t in terms}, sum(t.seconds for t in terms)

    (links, seconds), (sheet_links, sheet_seconds) = data_parallel(measured), data_parallel(profile)
    assert links == {"measured"} and sheet_links == {"ib-ndr"} and seconds > 2 * sheet_seconds
    words = cluster_text(measured.cluster(8), measured)  # Markdown: its underscores escaped
    assert words.startswith("Cluster: 8 GPUs a node on NVLink 4 via NVSwitch (H100/H200 SXM), nodes on InfiniBand")
    assert words.endswith(r"Communication across nodes from the collectives measured across them (by nccl-tests on "
                          r"NVIDIA H100 80GB HBM3 (ar2.log\: all\_reduce over 16 on 2 hosts)), inside a node from "
                          r"the datasheet link.")


def test_the_page_searches_the_precision_when_asked(tmp_path, monkeypatch):
    """precision auto on the Plan page: as `headroom plan --precision auto`, each recipe a candidate of its own
    (no one configuration to pin), the header says so and the recommendation names the recipe it picked."""
    inputs = PlanInputs(model="llama3.2-1b", global_batch=8, precision="auto", micro_batch="2", accumulation_steps="4",
                        recompute="none")
    assert inputs.run_config() is None
    profile, _ = planning.datasheet_hardware("datasheet: h100-sxm")
    request = planning.build_request(inputs, planning.resolve_preset("llama3.2-1b"), profile)
    assert request.precision_search and request.train.precision == "bf16-pure"
    at = render_url(tmp_path, monkeypatch, {"model": "llama3.2-1b", "global_batch": "8", "precision": "auto",
                                            "stack": "torchtitan", "hardware": "datasheet: h100-sxm"})
    assert not at.exception and warnings(at) == []
    assert at.selectbox(key="plan_precision").value == "auto"
    page = " ".join(str(m.value) for m in at.markdown)
    assert "precision recipes searched (each with the fp8 recipes the stack runs)" in page
    recommendation = next(str(s.value) for s in at.success if str(s.value).startswith("**Recommendation:**"))
    assert any(f", {p}, on " in recommendation for p in ("amp-bf16", "bf16-pure", "bf16-master", "bf16-fp32grad"))


def test_fp8_parameters_travel_through_a_run_configuration_and_the_url():
    run = RunConfig(train=TrainConfig(seq_len=4096, micro_batch=1, precision="bf16-master", stack="megatron",
                                      fp8="te-current", fp8_param_gather=True, layout=Layout(tp=2, sp=True)),
                    accumulation_steps=8)
    inputs = PlanInputs.of_run(run, model="llama3-8b", hardware=planning.DATASHEET_PREFIX + "h100-sxm")
    assert inputs.fp8_param_gather is True
    assert PlanInputs.from_query(inputs.to_query()) == inputs
    assert inputs.run_config() == run
