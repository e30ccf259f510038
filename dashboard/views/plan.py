"""Plan: micro-batch, accumulation and checkpoint policy for a model, a batch and a budget; with a GPU
count, every layout of that many GPUs, the chosen one's memory per rank and time by term, and two side by side;
and this plan beside another with a different model preset, budget or hardware."""

from __future__ import annotations

from dataclasses import asdict, fields
from pathlib import Path

import streamlit as st

from headroom.core.errors import ConfigError
from headroom.core.measured.calibration import Calibration
from headroom.core.planning import search_work
from headroom.core.planning.dispatch_hint import dispatch_hint
from headroom.core.planning.planner import (
    NEAR,
    Plan,
    budget_note,
    budget_share,
    whole_device_budget,
)
from headroom.core.safe_text import printable
from headroom.core.specs.config import ATTENTIONS
from headroom.core.specs.float8 import FLOAT8_RECIPES, FP8_CHOICES
from headroom.core.specs.hf_config import (
    SUPPORTED,
    parse_hf_config,
    spec_from_config_file,
)
from headroom.core.specs.interconnect import LINKS_BY_KEY, NETWORK_EXAMPLE
from headroom.core.specs.model import ModelSpec
from headroom.core.specs.precision import OPTIMIZER_STATE_BYTES, PRECISIONS, SEARCHED
from headroom.core.specs.presets import PRESETS
from headroom.core.specs.stack import STACKS
from headroom.core.specs.stages import split_text_for
from headroom.core.timing.step import HardwareProfile
from headroom.core.units import GB
from headroom.dashboard import charts, columns, data, plan_notes, plan_tables, planning
from headroom.dashboard.export_tabs import export_tabs
from headroom.dashboard.notices import store_notice
from headroom.dashboard.planning import AUTO, AXIS_CHOICES, MAX_GPUS, PlanInputs
from headroom.dashboard.text import confidence_markdown, plain
from headroom.dashboard.widths import fitted_columns
from headroom.dashboard.wording import said

EXPORT_FILES = {"hf": ("training_args.py", "python"), "torchtitan": ("torchtitan_train.sh", "bash"),
                "megatron": ("megatron_args.txt", "bash"), "deepspeed": ("ds_config.json", "json"),
                "lightning": ("lightning_trainer.py", "python")}


@st.cache_resource(ttl=600, max_entries=16, show_spinner=False)
def cached_plan(inputs: PlanInputs, spec: ModelSpec, profile: HardwareProfile,
                calibration: Calibration | None) -> Plan:
    """The plan, once per inputs: a search over many layouts takes seconds, and the compare view reruns the page.

    A resource cache, not st.cache_data: a Plan is frozen all the way down, so sharing one is safe, while
    cache_data unpickles a copy on every hit, and a search's tens of thousands of frozen dataclasses take
    longer to unpickle (~1.5 s for 8 GPUs of a tiny model) than some searches take to run.
    """
    return planning.make_plan(inputs, spec, profile, calibration)


st.title("Plan a training run")
url = data.store_url()
state = data.store_state(url)
measured_devices = data.devices(url) if state.ok else []
hardware_options = planning.hardware_options(measured_devices)

# Seed the widgets once per session from the URL (a shared plan), then keep them. A model, hardware or
# interconnect the page does not offer is replaced, with a warning that lasts until another is picked.
if "plan_inputs" not in st.session_state:
    query = st.query_params.to_dict()
    if "hardware" not in query and state.ok and (gpus := data.devices(url, "cuda")):
        query["hardware"] = planning.MEASURED_PREFIX + gpus[0]  # a store's own GPU before any datasheet
    st.session_state.plan_inputs = PlanInputs.from_query(query)
    st.session_state.plan_url_warnings = {}  # field -> (the value planned instead, the warning)
seed: PlanInputs = st.session_state.plan_inputs
for name, value in asdict(seed).items():
    st.session_state.setdefault(f"plan_{name}", value)
held = PlanInputs(**{f.name: st.session_state[f"plan_{f.name}"] for f in fields(PlanInputs)})
for fallback in plan_notes.fallbacks(held, hardware_options, measured_devices):
    st.session_state[f"plan_{fallback.field}"] = fallback.value
    if fallback.warning:
        st.session_state.plan_url_warnings[fallback.field] = (fallback.value, fallback.warning)

with st.sidebar:
    st.header("Inputs")
    source = st.radio("model from", planning.MODEL_SOURCES, key="plan_source", horizontal=True)
    uploaded = None
    if source == "preset":
        st.selectbox("model preset", list(PRESETS), key="plan_model")
    elif source == "config.json":
        uploaded = st.file_uploader(f"HuggingFace config.json ({', '.join(SUPPORTED)})", type="json")
    else:
        st.selectbox("block", ("llama", "gpt"), key="plan_block")
        for name in ("n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "vocab_size"):
            st.number_input(name.replace("_", " "), min_value=1, step=1, key=f"plan_{name}")
        if st.session_state.plan_block == "llama":
            st.number_input("experts (0: a dense MLP)", min_value=0, step=1, key="plan_n_experts",
                            help="routed experts in every block's MLP, a mixture of experts as Mixtral's")
            if st.session_state.plan_n_experts:
                st.number_input("experts per token", min_value=1, step=1, key="plan_experts_per_token")
                st.number_input("expert ffn hidden (0: ffn hidden)", min_value=0, step=1, key="plan_expert_ffn_hidden")
                st.number_input("capacity factor (0: dropless)", min_value=0.0, max_value=64.0, step=0.25,
                                key="plan_capacity_factor",
                                help="each expert takes at most ceil(t k / E x C) rows, drops the rest and is padded")
    st.number_input("sequence length (tokens)", min_value=1, step=256, key="plan_seq_len")
    st.number_input("global batch", min_value=1, step=1, key="plan_global_batch",
                    help="sequences per optimizer step, all data-parallel ranks together")
    st.text_input("memory budget per GPU", key="plan_budget", help="80GB, 80 GB, 80GiB or 81920MiB; GB = 1e9 bytes",
                  placeholder="80GB, or all of a smaller card")
    st.selectbox("hardware", hardware_options, format_func=printable, key="plan_hardware")
    st.subheader("Cluster and layout")
    st.number_input("GPUs to search", min_value=0, step=8, key="plan_gpus",
                    help=f"every tp x pp x cp x dp layout and sharding stage of this many GPUs, at most {MAX_GPUS}; "
                    "0 plans the one layout the axes below give")
    network_file = st.file_uploader("network file (TOML)", type="toml", key="plan_network_file",
                                    help="a cluster's network as `headroom plan --network FILE` reads it: "
                                    "gpus_per_node, intra_node, interconnect (e.g. interconnect = \"8x200g\"); it "
                                    "fills the inputs below, which stay yours to change")
    if network_file is not None and st.session_state.get("plan_network_applied") != network_file.file_id:
        st.session_state.plan_network_applied = network_file.file_id  # once an upload: then the inputs are yours
        try:
            for field, value in planning.network_inputs(network_file.read(planning.NETWORK_FILE_BYTES + 1),
                                                        network_file.name).items():
                st.session_state[f"plan_{field}"] = value
        except ConfigError as err:
            st.session_state.plan_network_error = said(err)
        else:
            st.session_state.plan_network_error = None
    if network_file is not None and st.session_state.get("plan_network_error"):
        st.error(st.session_state.plan_network_error)
    nccl_files = st.file_uploader("nccl-tests output", accept_multiple_files=True, key="plan_nccl_tests",
                                  help="what all_reduce_perf, all_gather_perf, reduce_scatter_perf, alltoall_perf or "
                                  "sendrecv_perf printed, each file the collective its output names: a run over one "
                                  "node's GPUs prices groups inside a node, a run over several hosts (as many ranks "
                                  "on each) groups across nodes, as `headroom plan --nccl-tests FILE` prices them")
    st.number_input("GPUs per node", min_value=1, step=1, key="plan_gpus_per_node",
                    help="GPUs joined by the hardware's own link (NVLink, PCIe); tp stays inside a node")
    given = st.session_state.plan_interconnect  # a network typed as NICs x Gb/s stays among the choices
    st.selectbox("inter-node network", ["", *LINKS_BY_KEY, *([given] if given and given not in LINKS_BY_KEY else [])],
                 key="plan_interconnect", accept_new_options=True,
                 format_func=lambda key: key or "auto",  # the names are long for the sidebar: its help has them
                 help="auto: the GPU generation's network; or type NICs x Gb/s a node "
                 f"({NETWORK_EXAMPLE}); " + "; ".join(f"{key}: {link.name}" for key, link in LINKS_BY_KEY.items()))
    st.selectbox("intra-node link", ["", *LINKS_BY_KEY], key="plan_intra_node",
                 format_func=lambda key: key or "auto",
                 help="auto: the hardware's own link between a node's GPUs; or one of "
                 + "; ".join(f"{key}: {link.name}" for key, link in LINKS_BY_KEY.items()))
    st.caption("Layout axes: a value pins the axis; auto leaves it to the search, or with no GPUs to search takes "
               f"{planning.build_layout(PlanInputs())}, sp off, as `headroom plan` does without a GPU count.")
    axis_labels = {"tp": "tp (tensor)", "pp": "pp (pipeline)", "cp": "cp (context)", "dp": "dp (data)",
                   "zero": "ZeRO stage", "sp": "sp (sequence)", "schedule": "pipeline schedule",
                   "virtual_stages": "virtual stages", "ep": "ep (experts, of dp x cp)",
                   "reshard_after_forward": "FSDP reshard (on, off, k)", "defer_gradient_sync": "defer grad sync",
                   "stage_layers": "stage layers (e.g. 7,8,8,7)", "tp_overlap": "tp overlap",
                   "cp_comm": "cp exchange", "overlap_grad_reduce": "grad reduce overlap",
                   "overlap_param_gather": "param gather overlap", "ep_overlap": "ep overlap",
                   "ep_comm": "ep dispatch"}
    # Lists get a wider column than typed values: a third of the sidebar cuts "interleaved" short.
    for row in (("tp", "pp", "cp"), ("dp", "zero", "ep"), ("sp", "tp_overlap", "ep_overlap"),
                ("virtual_stages", "cp_comm"),
                ("schedule",),
                ("ep_comm",),
                ("stage_layers",),
                ("reshard_after_forward", "defer_gradient_sync"), ("overlap_grad_reduce", "overlap_param_gather")):
        for column, axis in zip(st.columns(len(row)), row, strict=True):
            with column:
                if axis in AXIS_CHOICES:
                    st.selectbox(axis_labels[axis], AXIS_CHOICES[axis], key=f"plan_{axis}")
                else:
                    st.text_input(axis_labels[axis], key=f"plan_{axis}", placeholder=AUTO)
    st.selectbox("precision", [*PRECISIONS, SEARCHED], key="plan_precision",
                 help="The precision recipe; auto tries each the hardware computes in, with and without each fp8 "
                      "recipe the stack runs.")
    st.selectbox("fp8 recipe", [*FP8_CHOICES, AUTO], key="plan_fp8",
                 help="the block linears' FP8 recipe: " + "; ".join(f"{r.name}: {r.summary}" for r in
                                                                  FLOAT8_RECIPES.values())
                 + "; auto tries each the stack runs, on GPUs with fp8 units. Needs a bf16 recipe, or amp-bf16 "
                 "with ZeRO 3")
    st.checkbox("torch.compile the blocks", key="plan_compile",
                help="each block compiled, as torchtitan's --compile.enable: what inductor keeps for backward "
                     "(reference and torchtitan stacks, llama blocks, recompute none or full); priced as eager")
    st.checkbox("fp8 param gather (Megatron)", key="plan_fp8_param_gather",
                help="Megatron-LM's --fp8-param-gather under a Transformer Engine recipe: the block weights held "
                     "and all-gathered in fp8 (with ZeRO 1 or more)")
    st.checkbox("first and last layers in bf16 (Megatron)", key="plan_first_last_bf16",
                help="Megatron-LM's --first-last-layers-bf16 under te-current or te-mxfp8: the model's first and last "
                     "blocks run in bf16, outside the recipe")
    st.selectbox("optimizer", list(OPTIMIZER_STATE_BYTES), key="plan_optimizer")
    st.selectbox("attention", ATTENTIONS, key="plan_attention")
    st.number_input("dropout (gpt blocks)", min_value=0.0, max_value=0.95, step=0.05, key="plan_dropout",
                    help="dropout probability of a gpt block; llama blocks have none")
    st.selectbox("training stack", list(STACKS), key="plan_stack",
                 help="whose kernels and checkpointing the plan follows: "
                 + "; ".join(f"{s.name}: {s.summary}" for s in STACKS.values()))
    st.checkbox("consider offloading activations to host", key="plan_offload")
    st.subheader("Pin a configuration")
    st.caption("auto leaves it to the planner; a micro-batch (or accumulation) and a policy pinned on one layout "
               "evaluate exactly that configuration, even when it does not fit.")
    pin_columns = st.columns(2)  # three to a row break "accumulation" in the middle
    pin_columns[0].text_input("micro-batch", key="plan_micro_batch", placeholder=AUTO)
    pin_columns[1].text_input("accumulation", key="plan_accumulation_steps", placeholder=AUTO)
    st.text_input("recompute", key="plan_recompute", placeholder=AUTO,
                  help="none, selective, op-selective, full, every-K (K blocks a segment), block-K (the first K blocks of "
                       "each pipeline stage) or offload")

inputs = PlanInputs(**{f.name: st.session_state[f"plan_{f.name}"] for f in fields(PlanInputs)})
st.session_state.plan_inputs = inputs
st.query_params.from_dict(inputs.to_query())
st.caption("The URL holds these inputs: share it to share the plan (an uploaded config.json is not part of it).")
for field, (value, warning) in st.session_state.plan_url_warnings.items():
    if st.session_state[f"plan_{field}"] == value:  # until another is picked
        st.warning(warning)
if (pipeline := plan_notes.pipeline_note(inputs)) is not None:
    st.warning(pipeline)

if state.status != "ok" and state.status != "missing":
    store_notice(state)
elif state.status == "missing" or not measured_devices:
    st.info("No measured hardware in the store yet: planning from datasheets. "
            "`headroom agent run --suite quick` on a GPU box measures its own numbers and calibrates the plan.")

try:
    if source == "preset":
        spec = planning.resolve_preset(inputs.model)
    elif source == "config.json":
        if uploaded is None:
            st.info("Upload a config.json to plan for it.")
            st.stop()
        path = Path(uploaded.name)
        spec = spec_from_config_file(parse_hf_config(uploaded.getvalue(), path), path)
    else:
        spec = planning.dimensions_spec(inputs)
    profile, calibration = data.hardware(url, inputs.hardware)
    profile = planning.nccl_tests_profile(profile, [(f.name, f.getvalue()) for f in nccl_files or []],
                                          inputs.gpus_per_node)
    with st.spinner(f"Searching the layouts of {inputs.gpus} GPUs (at most {planning.PAGE_TIME_LIMIT_S:g} s)..."
                    if inputs.gpus else "Planning..."):
        result = cached_plan(inputs, spec, profile, calibration)
except (ConfigError, ValueError) as err:
    st.error(said(err))
    st.stop()

request, best = result.request, result.recommendation
searched = request.gpus is not None
unit = plan_tables.unit(profile)  # "GPU", or "device" for a CPU
budget_gb = request.budget_bytes / GB
if searched:
    pins = planning.pins_text(request)
    where = f"every layout of {plan_tables.count(request.gpus, unit)}" + (f" with {pins} pinned" if pins else "")
else:
    where = f"{request.layout} ({plan_tables.count(request.layout.world, unit)})"
st.markdown(
    f"**{plain(spec.name)}** ({spec.parameters / 1e9:.2f}B parameters"
    + (f", {spec.active_parameters / 1e9:.2f}B active per token" if spec.is_moe else "")
    + f"), sequence {request.seq_len}, global batch "
    f"{request.global_batch} ({request.global_batch * request.seq_len:,} tokens), {where}, "
    f"{request.precision_text}, {request.train.optimizer}, {request.train.stack} stack on "
    f"**{plain(profile.name)}** "
    f"({profile.source}), "
    f"budget {budget_gb:.1f} GB per {unit}"
)
if request.cluster is not None:
    st.caption(plan_notes.cluster_text(request.cluster, profile))
if (over_budget := budget_note(request.budget_bytes, profile)) is not None:
    st.warning(said(over_budget[0].upper() + over_budget[1:]) + ".")
elif request.budget_bytes < profile.memory_bytes:
    st.caption(said(f"Budget: {budget_share(request.budget_bytes, profile)}; set the budget to "
                    f"{whole_device_budget(profile)} to plan all of it."))
for model_note in request.notes():  # a context extended; what the config asks and is not counted; policies left out
    st.info(said(model_note) + ".")
if result.unsearched:
    limit = (f"this page's limit of {planning.PAGE_TIME_LIMIT_S:g} s" if result.stopped_at == "time limit"
             else f"its work bound ({search_work.LIMIT:,} candidates)")
    tried = plan_tables.count(len(result.layouts) + len(result.pruned), "layout")
    st.warning(f"The search stopped at {limit}: {tried} tried, those that could be fastest first, "
               f"{result.unsearched} left untried. "
               + (f"`headroom plan --gpus {request.gpus}` searches on without a time limit."
                  if result.stopped_at == "time limit" else "Pin tensor, pipeline or context parallelism to search "
                                                            "the rest."))
pinned = result.pinned
shown = best or pinned
if best is None:
    if pinned is not None:
        st.error(f"**Pinned:** {plain(pinned.label)} on {pinned.layout} does not fit: {plain(pinned.rejection)}")
    else:
        st.error(f"**Recommendation:** {plan_tables.recommendation_text(result)} "
                 f"({len(result.rejected)} candidates rejected)")
    for line in result.advice:
        st.markdown(f"- {said(line)}")
else:
    st.success(f"**{'Pinned' if pinned is not None else 'Recommendation'}:** {plan_tables.recommendation_text(result)}")
if shown is not None:
    cols = st.columns(4)
    cols[0].metric("tokens/s (all ranks)", f"{shown.tokens_per_s:,.0f}")
    cols[1].metric("step time", plan_tables.seconds_text(shown.step_time_s))
    cols[2].metric("needs per GPU", f"{shown.required_bytes / GB:.1f} GB", help="peak x fragmentation + context reserve")
    cols[3].metric("headroom", f"{(request.budget_bytes - shown.required_bytes) / GB:.1f} GB")
    cols = st.columns(4)
    for column, (label, value, why) in zip(cols, plan_tables.utilization_figures(shown, unit), strict=True):
        column.metric(label, value, help=why)
st.markdown(confidence_markdown(result.calibration, result))
if profile.assumptions:
    st.caption("Assumed, not measured: " + "; ".join(plain(a) for a in profile.assumptions))
st.caption(f"Margin: peak x {profile.fragmentation_text()} allocator fragmentation + "
           f"{request.context_reserve_bytes / GB:.1f} GB {plan_notes.reserve(profile)}. GB = 1e9 bytes.")

if best is not None:
    st.subheader(f"Chosen layout: {best.layout}")
    st.caption(f"{plan_tables.count(best.layout.world, unit)}; {best.label}. Step time is the calibrated prediction "
               "by term; communication is what overlap leaves exposed, bubble the pipeline's idle time.")
    if (forced := result.forced_by()) is not None:  # what made the search split the model this far
        st.caption(f"Forced by {plain(forced)}.")
    st.subheader("Step time by term")
    st.altair_chart(charts.build_step_time_chart(plan_tables.time_terms_frame(result, {str(best.layout): best})),
                    width="stretch")
    st.subheader("Memory per rank kind")
    st.altair_chart(charts.build_peak_bar_chart(plan_tables.rank_memory_frame(result, {"": best}), budget_gb,
                                                row="row"), width="stretch")
    if best.layout.pp > 1:
        st.caption(f"Pipeline stages: {split_text_for(best.layout, request.spec.n_layers, best.config.stack)}.")
    collectives = plan_tables.communication_frame(best)
    for overlap in best.time.overlaps:  # how close the hidden collectives come to being exposed
        st.caption(f"Overlap: {overlap.text()}.")
    if (hint := dispatch_hint(result)) is not None:  # what DeepEP would be worth where experts cross nodes
        st.info(said(hint[0].upper() + hint[1:]) + ".")
    if len(collectives):
        with st.expander(f"Collectives of one step ({len(collectives)}), before overlap"):
            st.dataframe(collectives, hide_index=True, column_config=columns.COLLECTIVES,
                         placeholder=columns.MISSING)

if searched:
    fitting_layouts = sum(o.fits for o in result.layouts)
    st.subheader(f"Layouts searched ({fitting_layouts} of {len(result.layouts)} fit)")
    layouts = plan_tables.layouts_frame(result)
    layout_columns, layout_rows = fitted_columns(columns.PLAN, layouts, columns.LAYOUTS_SHOWN, whole=("layout",),
                                                 wrapped="why")  # every layout name whole, every reason too
    st.dataframe(layouts, hide_index=True, column_config=layout_columns, column_order=columns.LAYOUTS_SHOWN,
                 row_height=layout_rows, placeholder=columns.MISSING)
    if result.pruned:
        with st.expander(f"{plan_tables.count(len(result.pruned), 'more layout')} left out: no step of theirs can "
                         f"come within {NEAR:.0%} of the fastest"):
            st.caption("Each one's floor: its forward, backward and recompute through the pipeline, with "
                       "communication, the optimizer and the host left out (or, where some of its candidates ran, "
                       "the fastest of them). Nothing left out could be recommended or tie with it.")
            st.dataframe(plan_tables.pruned_frame(result), hide_index=True, column_config=columns.PRUNED,
                         placeholder=columns.MISSING)
    options = plan_tables.layout_options(result)
    if len(options) >= 2:
        st.subheader("Compare two layouts")
        first = str(best.layout) if best is not None else options[0]
        runner_up = next(option for option in options if option != first)
        for key, default in (("compare_a", first), ("compare_b", runner_up)):
            if st.session_state.get(key) not in options:  # new inputs, new layouts: recommendation and runner-up
                st.session_state[key] = default
        sides = st.columns(2)
        for column, tag in zip(sides, "AB", strict=True):
            column.selectbox(f"layout {tag}", options, key=f"compare_{tag.lower()}")
        pair = plan_tables.comparison(result, st.session_state.compare_a, st.session_state.compare_b)
        for column, (tag, (outcome, shown, why)) in zip(sides, pair.items(), strict=True):
            with column:
                world = plan_tables.count(outcome.layout.world, unit)
                st.markdown(f"**{tag}: {outcome.layout}** ({world}, {shown.label})")
                cols = st.columns(3)
                cols[0].metric("tokens/s", plan_tables.tokens_text(shown.tokens_per_s) if outcome.fits else "does not fit")
                cols[1].metric("step time", plan_tables.seconds_text(shown.step_time_s))
                cols[2].metric("needs per GPU", f"{shown.required_bytes / GB:.1f} GB")
                st.markdown(f"**Why it lost:** {why}")
        shown_pair = {tag: shown for tag, (_, shown, _) in pair.items()}
        st.markdown("**Step time by term, A and B**")
        st.altair_chart(charts.build_step_time_chart(plan_tables.time_terms_frame(result, shown_pair)), width="stretch")
        st.markdown("**Memory per rank kind, A and B**")
        st.altair_chart(charts.build_peak_bar_chart(plan_tables.rank_memory_frame(result, shown_pair), budget_gb,
                                                    row="row"), width="stretch")

st.subheader("Compare with another plan")
with st.form("compare_plan"):
    choices = st.columns(3)
    other_model = choices[0].selectbox("model preset", [planning.SAME, *PRESETS], key="other_model")
    other_budget = choices[1].text_input("budget per GPU", key="other_budget",
                                         placeholder=f"{request.budget_bytes / GB:g}GB (this plan's)")
    other_hardware = choices[2].selectbox("hardware", [planning.SAME, *hardware_options], format_func=printable,
                                         key="other_hardware")
    st.form_submit_button("Compare")
other_inputs = planning.compared_inputs(inputs, other_model, other_budget, other_hardware)
if other_inputs is None:
    st.caption("The same inputs with another model preset, budget or hardware: pick one, then Compare.")
else:
    try:
        other_spec = spec if other_model == planning.SAME else planning.resolve_preset(other_model)
        other_profile, other_calibration = data.hardware(url, other_inputs.hardware)
        other = cached_plan(other_inputs, other_spec, other_profile, other_calibration)
    except (ConfigError, ValueError) as err:
        st.error(f"The other plan: {said(err)}")
    else:
        change = plan_tables.tokens_per_s_change(result, other)
        for column, (tag, plan) in zip(st.columns(2), (("This plan", result), ("Other plan", other)), strict=True):
            figures = plan_tables.plan_figures(plan)
            with column:
                st.markdown(f"**{tag}:** {plain(plan_tables.plan_title(plan))}")
                st.caption(figures["recommendation"])
                cols = st.columns(4)
                cols[0].metric("tokens/s", figures["tokens/s"], delta=change if plan is other else None)
                cols[1].metric("step time", figures["step time"])
                cols[2].metric("MFU", figures["MFU"])
                cols[3].metric("needs per GPU", figures["needs per GPU"])

table = plan_tables.candidates_frame(result)
if not searched:
    table = table.drop(columns=["layout"])
shown = plan_tables.shown_candidates(result)
st.subheader("Peak memory by component")
st.caption(plan_tables.shown_text(result, shown))
st.altair_chart(charts.build_peak_bar_chart(plan_tables.peak_components_frame(result, shown), budget_gb),
                width="stretch")

st.subheader("Throughput vs memory: the Pareto front")
window = plan_tables.decision_window(result)
inside = plan_tables.in_window(table, window)
front = plan_tables.pareto_front(table)
cloud = st.toggle("show every candidate behind the front", value=False, key="candidates_cloud")
st.altair_chart(charts.build_candidates_chart(table.assign(front=front)[inside], budget_gb, window, cloud=cloud),
                width="stretch")
off_chart = int((~inside).sum())
st.caption(f"{int(front.sum()):,} of {len(table):,} candidates are on the Pareto front: no other needs less memory "
           "and runs faster." + (" The others are grey behind it." if cloud else "")
           + f" Required memory from {window[0]:,.1f} to {window[1]:,.1f} GB, where the choice is made: "
           + (f"{off_chart} of {len(table)} candidates lie outside it (the tables below list every one)."
              if off_chart else f"all {len(table)} candidates."))

st.subheader(f"Ranked candidates ({len(result.candidates)} fit)")
if result.band > 1:
    st.caption(f"Ranks 1-{result.band} are one band: within {NEAR:.0%} of the fastest, as fast as the time model "
               "can tell; the simplest layout first.")
fitting = table[table["fits"] == "fits"].drop(columns=["fits", "rejection", "over_gb", "broken_by"])
# Shown in 1,440 px: the candidate's label holds its micro-batch, accumulation and policy, headroom is the budget
# less what it needs.
ranked_shown = ["rank", "candidate", *(["layout"] if searched else []), "tokens_per_s", "step_time_s", "peak_gb",
                "required_gb"]
st.dataframe(fitting, hide_index=True, column_order=ranked_shown, placeholder=columns.MISSING,
             column_config=fitted_columns(columns.PLAN, fitting, ranked_shown, whole=("candidate", "layout"))[0])
st.subheader(f"Rejected ({len(result.rejected)}), closest to the budget first")
rejected_columns = ["candidate", *(["layout"] if searched else ["tokens_per_s"]), "required_gb", "over_gb",
                    "broken_by"]  # a layout leaves no room for a rejected candidate's tokens/s
rejected = table[table["fits"] == "rejected"].sort_values("required_gb")[rejected_columns]
rejected_config, rejected_rows = fitted_columns(columns.PLAN, rejected, rejected_columns,
                                                whole=("candidate", "layout"), wrapped="broken_by")
st.dataframe(rejected, hide_index=True, column_config=rejected_config, placeholder=columns.MISSING,
             row_height=rejected_rows)  # what breaks the budget wraps, whole, in what the other columns leave
if len(result.rejected):
    st.caption(f"Needs = peak x {profile.fragmentation_text()} fragmentation + "
               f"{request.context_reserve_bytes / GB:.1f} GB context. What breaks the budget: the static state "
               "(parameters, gradients, master weights, optimizer state) alone, or the largest term on top of it.")

if best is not None:
    st.subheader("Export")
    tabs, refused = export_tabs(request, best)  # the candidate's own layout, whatever the search started from
    for reason in refused:
        st.caption(said(reason[0].upper() + reason[1:]) + ".")
    if approximate := [t.format for t in tabs if not t.expresses_layout]:
        st.caption(f"Approximate: {', '.join(approximate)} cannot express {best.layout}; the notes say what each "
                   "sets instead. The tabs start with the formats that can, fewest notes first.")
    for tab, shown_tab in zip(st.tabs([t.label for t in tabs]), tabs, strict=True):
        fmt, exported = shown_tab.format, shown_tab.exported
        filename, language = EXPORT_FILES.get(fmt, (f"{fmt}.txt", None))
        with tab:
            st.code(exported.text, language=language, wrap_lines=True)  # long comments wrap, not scroll
            if not exported.notes_in_text:  # a format without comments: its notes go beside it
                for note in exported.notes:
                    st.caption(f"Note: {said(note)}")
            st.download_button(f"download {filename}", exported.text, file_name=filename, key=f"download_{fmt}")
