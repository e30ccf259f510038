"""Plan: micro-batch, accumulation and checkpoint policy for a model, a batch and a budget."""

from __future__ import annotations

import json
from dataclasses import asdict, fields

import streamlit as st

from core.config import ATTENTIONS
from core.errors import ConfigError
from core.export import EXPORTERS, export
from core.hf_config import spec_from_hf_config
from core.precision import OPTIMIZER_STATE_BYTES, PRECISIONS
from core.presets import PRESETS
from core.units import GB
from dashboard import charts, data, planning
from dashboard.notices import store_notice
from dashboard.planning import MEASURED_PREFIX, PlanInputs

EXPORT_FILES = {"hf": ("training_args.py", "python"), "torchtitan": ("torchtitan.toml", "toml"),
                "deepspeed": ("ds_config.json", "json"), "lightning": ("lightning_trainer.py", "python")}

st.title("Plan a training run")
url = data.store_url()
state = data.store_state(url)
measured_devices = data.devices(url) if state.ok else []
hardware_options = planning.hardware_options(measured_devices)

# Seed the widgets once per session from the URL (a shared plan), then keep them.
if "plan_inputs" not in st.session_state:
    st.session_state.plan_inputs = PlanInputs.from_query(st.query_params.to_dict())
seed: PlanInputs = st.session_state.plan_inputs
for name, value in asdict(seed).items():
    st.session_state.setdefault(f"plan_{name}", value)
if st.session_state.plan_model not in PRESETS:
    st.session_state.plan_model = PlanInputs().model
if st.session_state.plan_hardware not in hardware_options:
    st.session_state.plan_hardware = hardware_options[0] if measured_devices else PlanInputs().hardware

with st.sidebar:
    st.header("Inputs")
    source = st.radio("model from", planning.MODEL_SOURCES, key="plan_source", horizontal=True)
    uploaded = None
    if source == "preset":
        st.selectbox("model preset", list(PRESETS), key="plan_model")
    elif source == "config.json":
        uploaded = st.file_uploader("HuggingFace config.json (llama, mistral, qwen2, gpt2)", type="json")
    else:
        st.selectbox("block", ("llama", "gpt"), key="plan_block")
        for name in ("n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "vocab_size"):
            st.number_input(name.replace("_", " "), min_value=1, step=1, key=f"plan_{name}")
    st.number_input("sequence length (tokens)", min_value=1, step=256, key="plan_seq_len")
    st.number_input("global batch (sequences per step, all ranks)", min_value=1, step=1, key="plan_global_batch")
    st.text_input("memory budget per GPU (80GB, 80GiB, 81920MiB; GB = 1e9 bytes)", key="plan_budget")
    st.selectbox("hardware", hardware_options, key="plan_hardware")
    st.number_input("data-parallel ranks", min_value=1, step=1, key="plan_dp")
    st.selectbox("ZeRO sharding stage", (0, 1, 2, 3), key="plan_zero")
    st.selectbox("precision", list(PRECISIONS), key="plan_precision")
    st.selectbox("optimizer", list(OPTIMIZER_STATE_BYTES), key="plan_optimizer")
    st.selectbox("attention", ATTENTIONS, key="plan_attention")
    st.checkbox("consider offloading activations to host", key="plan_offload")

inputs = PlanInputs(**{f.name: st.session_state[f"plan_{f.name}"] for f in fields(PlanInputs)})
st.session_state.plan_inputs = inputs
st.query_params.from_dict(inputs.to_query())
st.caption("The URL holds these inputs: share it to share the plan (an uploaded config.json is not part of it).")

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
        spec = spec_from_hf_config(json.loads(uploaded.getvalue()), name=uploaded.name.removesuffix(".json"))
    else:
        spec = planning.dimensions_spec(inputs)
    if inputs.hardware.startswith(MEASURED_PREFIX):
        profile, calibration = data.measured(url, inputs.hardware.removeprefix(MEASURED_PREFIX))
    else:
        profile, calibration = planning.datasheet_hardware(inputs.hardware)
    result = planning.make_plan(inputs, spec, profile, calibration)
except (ConfigError, ValueError) as err:
    st.error(str(err))
    st.stop()

request, best = result.request, result.recommendation
budget_gb = request.budget_bytes / GB
st.markdown(
    f"**{spec.name}** ({spec.parameters / 1e9:.2f}B parameters), sequence {request.seq_len}, global batch "
    f"{request.global_batch} ({request.global_batch * request.seq_len:,} tokens), {request.dp} rank(s), "
    f"ZeRO-{request.zero}, {request.precision}, {request.optimizer} on **{profile.name}** ({profile.source}), "
    f"budget {budget_gb:.1f} GB per GPU"
)
if best is None:
    st.error(f"**Recommendation:** {planning.recommendation_text(result)} ({len(result.rejected)} candidates rejected)")
    for line in result.advice:
        st.markdown(f"- {line}")
else:
    st.success(f"**Recommendation:** {planning.recommendation_text(result)}")
    cols = st.columns(4)
    cols[0].metric("tokens/s (all ranks)", f"{best.tokens_per_s:,.0f}")
    cols[1].metric("step time", f"{best.step_time_s:.3f} s")
    cols[2].metric("needs per GPU", f"{best.required_bytes / GB:.1f} GB", help="peak x fragmentation + context reserve")
    cols[3].metric("headroom", f"{(request.budget_bytes - best.required_bytes) / GB:.1f} GB")
st.markdown(f"**Confidence:** {result.calibration.confidence()}")
if profile.assumptions:
    st.caption("Assumed, not measured: " + "; ".join(profile.assumptions))
st.caption(f"Margin: peak x {profile.fragmentation:.2f} allocator fragmentation + "
           f"{request.context_reserve_bytes / GB:.1f} GB CUDA context. GB = 1e9 bytes.")

table = planning.candidates_frame(result)
left, right = st.columns(2)
with left:
    st.subheader("Peak memory by component")
    shown = planning.shown_candidates(result)
    st.altair_chart(charts.build_peak_bar_chart(planning.peak_components_frame(result, shown), budget_gb),
                    width="stretch")
with right:
    st.subheader("Throughput vs memory, every candidate")
    st.altair_chart(charts.build_candidates_chart(table, budget_gb), width="stretch")

NUMBERS = {
    "tokens_per_s": st.column_config.NumberColumn("tokens/s", format="%.0f"),
    "step_time_s": st.column_config.NumberColumn("step s", format="%.3f"),
    **{name: st.column_config.NumberColumn(name.replace("_gb", " GB"), format="%.1f")
       for name in ("peak_gb", "required_gb", "headroom_gb")},
}
st.subheader(f"Ranked candidates ({len(result.candidates)} fit)")
st.dataframe(table[table["fits"] == "fits"].drop(columns=["fits", "rejection"]), hide_index=True,
             column_config=NUMBERS)
st.subheader(f"Rejected ({len(result.rejected)})")
st.dataframe(table[table["fits"] == "rejected"][["candidate", "tokens_per_s", "required_gb", "rejection"]],
             hide_index=True, column_config=NUMBERS)

if best is not None:
    st.subheader("Export")
    for tab, fmt in zip(st.tabs(list(EXPORTERS)), EXPORTERS):
        filename, language = EXPORT_FILES.get(fmt, (f"{fmt}.txt", None))
        snippet = export(fmt, request, best)
        with tab:
            st.code(snippet, language=language)
            st.download_button(f"download {filename}", snippet, file_name=filename, key=f"download_{fmt}")
