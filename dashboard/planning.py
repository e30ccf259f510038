"""The Plan page's inputs: the URL query string <-> PlanInputs -> the plan request, and the plan.

Inputs live in the query string (``?model=llama2-7b&seq_len=4096&budget=80GB``)
so a plan can be shared by its URL. `PlanInputs.from_query` reads them,
falling back to the defaults below for anything missing or unreadable;
`PlanInputs.to_query` writes them back.

The layout axes are pins: ``?gpus=64&tp=8`` searches every layout of 64 GPUs
with tp fixed at 8; ``auto`` (the default) leaves an axis to the search. So are
``micro_batch``, ``accumulation_steps`` and ``recompute``: with the micro-batch (or the
accumulation) and the policy pinned on one layout the page evaluates exactly that
configuration, fitting or not, as ``headroom plan`` does. The keys of a run
configuration are its document's (headroom.core.specs.run_config.RunConfig, the layout's
fields one key each): `PlanInputs.of_run` pins one, `PlanInputs.run_config` reads it back. Without
a GPU count (``gpus=0``) the page plans one layout, the auto axes taking
headroom.core.planning.ask.ONE_GPU. `build_request` reads the inputs into the
`PlanAsk` that ``headroom plan`` also builds from its flags, and core turns it
into the request, so the page and the command take the same defaults. What a plan
shows, as text and tables, lives in headroom.dashboard.plan_tables.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from headroom.core.errors import ConfigError
from headroom.core.measured.calibration import Calibration
from headroom.core.planning.advice import plan_and_advise
from headroom.core.planning.ask import (
    DEFAULT_GPUS_PER_NODE,
    DEFAULT_SEQ_LEN,
    ONE_GPU,
    PlanAsk,
)
from headroom.core.planning.layout_search import PINNABLE, pinned_layout
from headroom.core.planning.planner import (
    Plan,
    PlanRequest,
)
from headroom.core.safe_text import printable
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.float8 import OFF, needs_fsdp
from headroom.core.specs.hardware import HARDWARE
from headroom.core.specs.interconnect import intra_node_link, network
from headroom.core.specs.layout import (
    CP_COMMS,
    EP_COMMS,
    MULTI_CHUNK,
    SCHEDULES,
    SWITCHES,
    Layout,
)
from headroom.core.specs.model import ModelSpec
from headroom.core.specs.network_file import MAX_BYTES, parse_network_file
from headroom.core.specs.precision import LIGHTEST
from headroom.core.specs.presets import get_preset
from headroom.core.specs.recompute import parse_policy
from headroom.core.specs.run_config import KEYS as RUN_DOCUMENT_KEYS
from headroom.core.specs.run_config import OPTIONAL_KEYS, RunConfig
from headroom.core.specs.stack import stack_name
from headroom.core.timing.nccl_tests import nccl_tests_curves, parse_nccl_tests
from headroom.core.timing.step import HardwareProfile
from headroom.core.units import parse_budget
from headroom.db.hardware import resolve_hardware

MODEL_SOURCES = ("preset", "dimensions", "config.json")
DATASHEET_PREFIX = "datasheet: "
MEASURED_PREFIX = "measured: "
AUTO = "auto"
MAX_GPUS = 4096
"""The page's cap on a search, which grows with the GPU count's divisors (64 GPUs of llama2-7b: 469 layouts,
6-9 s on one quiet core); `headroom plan --gpus` has none."""
PAGE_TIME_LIMIT_S = 10.0
"""A search on the page tries layouts, those that could be fastest first, for this long at most (headroom.core.planning.planner.plan's time
limit): 4096 GPUs of llama2-7b take 31 s and 0.73 GB in full on the 2-core CI machine, and a page that a URL
can keep busy for minutes is a denial of service once it is exposed."""
AXIS_CHOICES: dict[str, tuple[str, ...]] = {"sp": (AUTO, "on", "off"), "schedule": (AUTO, *SCHEDULES),
                                            "defer_gradient_sync": (AUTO, "on", "off"), "tp_overlap": (AUTO, "on", "off"),
                                            "cp_comm": (AUTO, *CP_COMMS), "overlap_grad_reduce": (AUTO, "on", "off"),
                                            "overlap_param_gather": (AUTO, "on", "off"), "ep_overlap": (AUTO, "on", "off"),
                                            "ep_comm": (AUTO, *EP_COMMS)}
"""Axes picked from a list; the others are typed (auto or a whole number; reshard after forward also on or
off)."""
ON_OFF = (*SWITCHES, "reshard_after_forward")
"""Layout fields whose on and off are True and False."""


@dataclass(frozen=True, slots=True)
class PlanInputs:
    """Everything the Plan page asks for; each field is one query-string key."""

    source: str = "preset"
    model: str = "llama3.2-1b"
    """A model that fits the default layout, one GPU (llama2-7b's 16 bytes per parameter do not)."""
    block: str = "llama"
    n_layers: int = 32
    hidden: int = 4096
    n_heads: int = 32
    n_kv_heads: int = 32
    ffn_hidden: int = 11008
    vocab_size: int = 32000
    n_experts: int = 0
    """Routed experts of a llama block's MLP (a mixture of experts); 0: a dense MLP."""
    experts_per_token: int = 2
    expert_ffn_hidden: int = 0
    """Inner width of each expert; 0: ffn_hidden."""
    capacity_factor: float = 0.0
    """Each expert's capacity, ceil(t k / E x C) rows, padded; 0: dropless (headroom.core.specs.model.ModelSpec)."""
    seq_len: int = DEFAULT_SEQ_LEN
    """``headroom plan --seq-len``'s default."""
    global_batch: int = 64
    budget: str = ""
    """Per GPU, as ``--budget`` takes it; empty: ``headroom plan``'s default, 80 GB or all of a smaller card
    (headroom.core.planning.planner.default_budget)."""
    hardware: str = DATASHEET_PREFIX + "h100-sxm"
    gpus: int = 0
    """Search every layout of this many GPUs; 0 plans the one layout the axes give."""
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE
    interconnect: str = ""
    """The network between nodes: a headroom.core.specs.interconnect key, or NICs x Gb/s a node ("4x200g",
    headroom.core.specs.interconnect.network); empty: the hardware generation's network
    (headroom.core.specs.interconnect.default_inter_node_link), as ``headroom plan`` without ``--interconnect``."""
    intra_node: str = ""
    """The link between a node's GPUs: a headroom.core.specs.interconnect key; empty: the hardware's own, as
    ``headroom plan`` without ``--intra-node``."""
    # The Layout's fields (headroom.core.planning.layout_search.PINNABLE), each AUTO or a value that pins it.
    tp: str = AUTO
    sp: str = AUTO
    pp: str = AUTO
    schedule: str = AUTO
    virtual_stages: str = AUTO
    cp: str = AUTO
    dp: str = AUTO
    zero: str = AUTO
    ep: str = AUTO
    reshard_after_forward: str = AUTO
    """FSDP's: on, off or k ranks to keep a shard over (headroom.core.specs.data_parallel)."""
    defer_gradient_sync: str = AUTO
    overlap_grad_reduce: str = AUTO
    """Zero 0-2: gradients reduced beside backward (on) or after it (off), or the stack's default."""
    overlap_param_gather: str = AUTO
    """Zero 1-2: updated parameters gathered during the next forward (on) or after the step (off)."""
    tp_overlap: str = AUTO
    """Tensor-parallel collectives beside the GEMMs: on, off, or the stack's default (off)."""
    ep_overlap: str = AUTO
    """Expert all-to-alls beside another micro-batch's compute: on, off, or the stack's default (off)."""
    cp_comm: str = AUTO
    """How context-parallel ranks exchange keys and values: ring, all-gather, or the stack's default."""
    ep_comm: str = AUTO
    """How expert-parallel ranks send tokens across nodes: all-to-all, deepep, hybridep, or the stack's default."""
    stage_layers: str = AUTO
    """Blocks on each pipeline stage, comma-separated (headroom.core.specs.stages); pins pp to their count."""
    precision: str = "amp-bf16"
    fp8: str = OFF
    """The FP8 recipe of the block linears (headroom.core.specs.float8), off, or auto (the planner tries each)."""
    fp8_param_gather: bool = False
    """Megatron-LM's --fp8-param-gather: the block weights held and gathered in fp8 (TrainConfig.fp8_param_gather)."""
    first_last_bf16: bool = False
    """Megatron-LM's --first-last-layers-bf16: the first and last blocks outside the FP8 recipe
    (TrainConfig.first_last_bf16)."""
    compile: bool = False
    """Each block compiled with torch.compile (TrainConfig.compile)."""
    optimizer: str = "adamw"
    attention: str = "flash"
    stack: str = "reference"
    """The training stack whose kernels and checkpointing the plan follows (headroom.core.specs.stack)."""
    offload: bool = False
    dropout: float = 0.0
    """Dropout probability (gpt blocks only), as ``headroom plan --dropout``."""
    # A configuration to evaluate, each AUTO (the planner's to choose) or a value that pins it, as `headroom plan
    # --micro-batch / --accumulation / --recompute` do.
    micro_batch: str = AUTO
    accumulation_steps: str = AUTO
    recompute: str = AUTO

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> PlanInputs:
        """Inputs from a query string; a missing or malformed value keeps its default."""
        # A link shared before a rename: the old key reads as the new, which wins where both are given.
        query = {**{RENAMED[key]: value for key, value in query.items() if key in RENAMED},
                 **{key: value for key, value in query.items() if key not in RENAMED}}
        values = {}
        for f in fields(cls):
            if f.name not in query:
                continue
            raw = str(query[f.name])
            default = getattr(cls(), f.name)
            try:
                if f.name in PINNABLE:
                    values[f.name] = _axis_text(f.name, raw)
                elif f.name in CONFIGURATION_PINS:
                    values[f.name] = _pin_text(f.name, raw)
                elif f.name == "stack":
                    values[f.name] = stack_name(raw)  # a shared link from before a rename reads as today's name
                elif isinstance(default, bool):
                    values[f.name] = raw.lower() in ("1", "true", "yes", "on")
                elif isinstance(default, int):
                    values[f.name] = int(raw)
                elif isinstance(default, float):
                    number = float(raw)
                    if not math.isfinite(number):
                        continue  # nan, inf: malformed
                    values[f.name] = number
                else:
                    values[f.name] = raw
            except (ValueError, ConfigError):
                continue
        return cls(**values)

    def to_query(self) -> dict[str, str]:
        return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in asdict(self).items()}

    @classmethod
    def of_run(cls, run: RunConfig, **rest: Any) -> PlanInputs:
        """Inputs that evaluate exactly ``run`` on its layout: every key of its document pinned, the global batch
        its layout trains per optimizer step; ``rest`` sets the others (model, hardware, ...)."""
        document = run.to_dict()
        values = {key: document[key] for key in RUN_KEYS if key not in PINNABLE and key in document}
        values |= {axis: _axis_value(value) for axis, value in document["layout"].items()}
        values |= {key: str(values[key]) for key in CONFIGURATION_PINS}
        return cls(global_batch=run.sequences_per_rank * run.train.layout.dp, gpus=0, **values, **rest)

    def run_config(self) -> RunConfig | None:
        """The configuration these inputs evaluate when they pin one (one layout, micro-batch, accumulation,
        policy and FP8 recipe all pinned); None when the planner is left to choose. ConfigError names a bad input."""
        pins = configuration_pins(self)
        if self.gpus or None in pins.values() or AUTO in (self.fp8, self.precision):  # searched: one candidate each
            return None
        train = plan_ask(self).train
        return RunConfig(train=replace(train, micro_batch=pins["micro_batch"], recompute=pins["recompute"]),
                         accumulation_steps=pins["accumulation"])

    def with_(self, **changes) -> PlanInputs:
        return replace(self, **changes)


NETWORK_FILE_BYTES = MAX_BYTES
"""An uploaded network file is read to one byte past this: a larger one is refused as none."""


def network_inputs(data: bytes, name: str) -> dict[str, object]:
    """The Plan page's network inputs an uploaded network file (headroom.core.specs.network_file) sets: each of
    gpus_per_node, intra_node and interconnect the file gives. ConfigError names the file and what is wrong."""
    settings = parse_network_file(data, f"network file {name}")
    return {key: value for key, value in asdict(settings).items() if value is not None}


def nccl_tests_profile(profile: HardwareProfile, files: list[tuple[str, bytes]], gpus_per_node: int) -> HardwareProfile:
    """The profile with uploaded nccl-tests output (a name and its bytes each, a run of a collective that its output
    names, inside one node or across nodes) as its measured collectives, over the store's where it has others, as `headroom plan
    --nccl-tests FILE` reads it (headroom.core.timing.nccl_tests); none uploaded: the profile as it is. ConfigError
    names the file and what is wrong with it."""
    if not files:
        return profile
    runs = [(parse_nccl_tests(data, f"nccl-tests file {printable(name)}"), printable(name)) for name, data in files]
    return replace(profile, collectives=nccl_tests_curves(runs, gpus_per_node, profile.collectives))


def dimensions_spec(inputs: PlanInputs) -> ModelSpec:
    """A model from its dimensions (llama: RMSNorm + SwiGLU, no bias, and with ``n_experts`` a Mixtral-style
    mixture of experts in every block; gpt: LayerNorm + GELU, biases)."""
    llama = inputs.block == "llama"
    experts = dict(n_experts=inputs.n_experts, experts_per_token=inputs.experts_per_token,
                   expert_ffn_hidden=inputs.expert_ffn_hidden, normalize_expert_weights=True,
                   capacity_factor=inputs.capacity_factor) \
        if llama and inputs.n_experts else {}
    return ModelSpec(
        name="custom", block=inputs.block, n_layers=inputs.n_layers, hidden=inputs.hidden, n_heads=inputs.n_heads,
        n_kv_heads=inputs.n_kv_heads if llama else inputs.n_heads, ffn_hidden=inputs.ffn_hidden,
        vocab_size=inputs.vocab_size, max_seq_len=max(inputs.seq_len, 1), tied_embeddings=not llama,
        bias="none" if llama else "all", **experts,
    )


def hardware_options(measured: list[str]) -> list[str]:
    """Measured devices first (the planner prefers a box's own numbers), then every datasheet row."""
    return [MEASURED_PREFIX + name for name in measured] + [DATASHEET_PREFIX + hw.key for hw in HARDWARE]


def datasheet_hardware(option: str) -> tuple[HardwareProfile, Calibration | None]:
    """A "datasheet: KEY" option's profile (headroom.db.hardware.resolve_hardware; the store is never read)."""
    return resolve_hardware(option.removeprefix(DATASHEET_PREFIX), source="datasheet")


def _axis_text(axis: str, raw: str) -> str:
    """An axis as the query string and the widgets hold it: AUTO, or its value normalised ("02" -> "2")."""
    text = str(raw).strip().lower()
    if text in ("", AUTO):
        return AUTO
    if axis == "stage_layers":
        try:
            return ",".join(str(int(part)) for part in text.replace(" ", "").split(","))
        except ValueError:
            raise ConfigError(f"stage layers {raw!r} is neither auto nor comma-separated block counts, e.g. "
                              "7,8,8,7") from None
    if axis == "reshard_after_forward":
        text = {"true": "on", "yes": "on", "false": "off", "no": "off"}.get(text, text)
        if text in ("on", "off"):
            return text
    if axis in AXIS_CHOICES:
        text = {"true": "on", "1": "on", "yes": "on", "false": "off", "0": "off", "no": "off"}.get(text, text)
        if text not in AXIS_CHOICES[axis]:
            raise ConfigError(f"{axis} {raw!r} is not one of {', '.join(AXIS_CHOICES[axis])}")
        return text
    try:
        return str(int(text))
    except ValueError:
        raise ConfigError(f"{axis.replace('_', ' ')} {raw!r} is neither auto nor a whole number") from None


CONFIGURATION_PINS = ("micro_batch", "accumulation_steps", "recompute")
"""PlanInputs fields that pin the configuration rather than the layout."""
RUN_KEYS = tuple(key for key in (*RUN_DOCUMENT_KEYS, *OPTIONAL_KEYS) if key not in ("version", "layout")) \
    + tuple(PINNABLE)
"""The query string's keys of a run configuration: its document's (headroom.core.specs.run_config), the layout's
fields one key each. `PlanInputs` holds each under that name (tests/test_dashboard_plan_inputs.py)."""
RENAMED = {"accumulation": "accumulation_steps"}
"""Query-string keys renamed since links were shared: the old name reads as the new."""


def _axis_value(value: Any) -> str:
    """A layout field as an axis text: "on"/"off" for a flag, AUTO for a setting left to the stack, else its
    value."""
    if value is None:
        return AUTO
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value))
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


def _pin_text(name: str, raw: str) -> str:
    """A configuration pin as the query string and the widgets hold it: AUTO, a whole number (micro-batch,
    accumulation) or a policy name (recompute). ConfigError names a bad one."""
    text = str(raw).strip().lower()
    if text in ("", AUTO):
        return AUTO
    if name == "recompute":
        return str(parse_policy(text))
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{name.replace('_', ' ')} {raw!r} is neither auto nor a whole number") from None
    if value <= 0:
        raise ConfigError(f"{name.replace('_', ' ')} must be auto or a positive whole number, got {raw!r}")
    return str(value)


def configuration_pins(inputs: PlanInputs) -> dict[str, Any]:
    """The pinned micro-batch, accumulation and policy as PlanRequest takes them (None where AUTO)."""
    texts = {name: _pin_text(name, getattr(inputs, name)) for name in CONFIGURATION_PINS}
    return {"micro_batch": None if texts["micro_batch"] == AUTO else int(texts["micro_batch"]),
            "accumulation": None if texts["accumulation_steps"] == AUTO else int(texts["accumulation_steps"]),
            "recompute": None if texts["recompute"] == AUTO else parse_policy(texts["recompute"])}


def pinned_axes(inputs: PlanInputs) -> frozenset[str]:
    """Layout fields the inputs set (not AUTO)."""
    return frozenset(axis for axis in PINNABLE if _axis_text(axis, getattr(inputs, axis)) != AUTO)


def pins_text(request: PlanRequest) -> str:
    """The request's pinned axes with their values, in the Layout's field order: "tp 2, sp off, zero 1"."""
    return ", ".join(f"{axis.replace('_', ' ')} {_axis_value(getattr(request.layout, axis))}" for axis in PINNABLE
                     if axis in request.pinned)


def build_layout(inputs: PlanInputs) -> Layout:
    """The layout the axes give: a pinned axis its value, an AUTO one `ONE_GPU`'s without a GPU count (sp off,
    as ``headroom plan --tp 2`` plans it) and the Layout default (what the search ignores) with one. ConfigError
    names the bad axis."""
    search = inputs.gpus > 0
    values: dict[str, Any] = {}
    for axis in PINNABLE:
        text = _axis_text(axis, getattr(inputs, axis))
        if axis == "stage_layers" and text != AUTO:
            values[axis] = tuple(int(part) for part in text.split(","))
        elif text != AUTO:
            values[axis] = (text == "on" if axis in ON_OFF and text in ("on", "off")
                            else text if axis in ("schedule", "cp_comm", "ep_comm") else int(text))
    if "stage_layers" in values:  # pp is their count (headroom plan --stage-layers)
        values.setdefault("pp", len(values["stage_layers"]))
    if search and values.get("sp") and "tp" not in values:
        raise ConfigError("sp on needs tp pinned above 1; leave sp on auto: the search turns it on whenever tp > 1")
    if values.get("schedule") in MULTI_CHUNK:
        values.setdefault("virtual_stages", 2)
    elif values.get("virtual_stages", 1) > 1:
        values.setdefault("schedule", "interleaved")
    if not search:
        for axis, value in ONE_GPU.items():
            values.setdefault(axis, value)
        if values["pp"] == 1:  # one stage runs no pipeline: a pinned schedule is dropped (headroom.dashboard.plan_notes says so)
            values.update(schedule="1f1b", virtual_stages=1)
    if not search:
        return Layout(**values)
    return pinned_layout(values, needs_fsdp(inputs.precision, inputs.fp8), inputs.fp8_param_gather)


def build_request(inputs: PlanInputs, spec: ModelSpec, profile: HardwareProfile) -> PlanRequest:
    """The planner's request; ConfigError (shown as is) when an input is invalid.

    With a GPU count the pinned axes are kept and the others searched; without one the
    request plans exactly `build_layout` (on ``profile``'s hardware: its budget, its links).
    """
    if isinstance(inputs.gpus, bool) or not isinstance(inputs.gpus, int) or inputs.gpus < 0:
        raise ConfigError(f"GPUs to search must be 0 (plan the one layout) or a positive count, got {inputs.gpus!r}")
    if inputs.gpus > MAX_GPUS:
        raise ConfigError(f"{inputs.gpus} GPUs is over this page's cap of {MAX_GPUS} (every layout is tried, which "
                          f"takes minutes at that size); plan it with `headroom plan --gpus {inputs.gpus}`")
    return plan_ask(inputs).request(spec, profile)


def plan_ask(inputs: PlanInputs) -> PlanAsk:
    """The page's inputs as the question every front end asks (headroom.core.planning.ask): None where the page
    leaves a setting to its default, as ``headroom plan`` does for a flag left out."""
    if inputs.interconnect:
        network(inputs.interconnect)  # ConfigError names a network that is neither a row nor NICs x Gb/s
    if inputs.intra_node:
        intra_node_link(inputs.intra_node)  # ConfigError names a link that is not one
    if inputs.first_last_bf16 and inputs.fp8 == AUTO:
        raise ConfigError("first and last layers in bf16 apply to the te-current and te-mxfp8 recipes alone, and fp8 "
                          "auto searches other recipes too: choose one of them")
    search = inputs.gpus > 0
    return PlanAsk(
        global_batch=inputs.global_batch,
        train=TrainConfig(seq_len=inputs.seq_len, precision=LIGHTEST if inputs.precision == AUTO else inputs.precision,
                          optimizer=inputs.optimizer, attention=inputs.attention, dropout=inputs.dropout,
                          stack=inputs.stack, fp8=OFF if inputs.fp8 == AUTO else inputs.fp8,
                          fp8_param_gather=inputs.fp8_param_gather, first_last_bf16=inputs.first_last_bf16,
                          compile=inputs.compile,
                          layout=build_layout(inputs)),
        fp8_search=inputs.fp8 == AUTO, precision_search=inputs.precision == AUTO,
        budget_bytes=parse_budget(inputs.budget) if inputs.budget.strip() else None,
        pinned=pinned_axes(inputs), gpus=inputs.gpus if search else None,
        gpus_per_node=inputs.gpus_per_node, interconnect=inputs.interconnect or None,
        intra_node=inputs.intra_node or None, allow_offload=inputs.offload,
        **configuration_pins(inputs),
    )


def make_plan(inputs: PlanInputs, spec: ModelSpec, profile: HardwareProfile, calibration: Calibration | None) -> Plan:
    return plan_and_advise(build_request(inputs, spec, profile), profile, calibration,
                           time_limit_s=PAGE_TIME_LIMIT_S)


def resolve_preset(name: str) -> ModelSpec:
    return get_preset(name)


# --- Another plan: the same inputs with another model preset, budget or hardware, side by side ----------------------

SAME = "same as this plan"
"""The compare form's choice that keeps this plan's model or hardware (an empty budget keeps its budget)."""


def compared_inputs(inputs: PlanInputs, model: str = SAME, budget: str = "", hardware: str = SAME) -> PlanInputs | None:
    """This plan's inputs with another model preset, budget or hardware; None when nothing differs."""
    changes: dict[str, Any] = {}
    if model != SAME:
        changes.update(source="preset", model=model)
    if budget.strip():
        changes["budget"] = budget.strip()
    if hardware != SAME:
        changes["hardware"] = hardware
    other = inputs.with_(**changes)
    return None if other == inputs else other
