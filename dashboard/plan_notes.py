"""What the Plan page says about its inputs rather than plans from them: a shared URL's value the page does not
offer, a pipeline schedule that no pipeline runs, and the cluster in words that fit the device (a CPU is not a
GPU on NVLink). Each returns Markdown, with user-given and stored text made plain (headroom.dashboard.text)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from headroom.core.errors import ConfigError
from headroom.core.specs.float8 import FP8_CHOICES
from headroom.core.specs.hardware import HARDWARE
from headroom.core.specs.interconnect import (
    LINKS_BY_KEY,
    NETWORK_EXAMPLE,
    Cluster,
    network,
)
from headroom.core.specs.presets import PRESETS
from headroom.core.timing.step import HardwareProfile
from headroom.dashboard.planning import (
    AUTO,
    DATASHEET_PREFIX,
    MEASURED_PREFIX,
    PlanInputs,
    _axis_text,
)
from headroom.dashboard.text import plain


@dataclass(frozen=True, slots=True)
class Fallback:
    """A URL's value the page does not offer, replaced: the widget's field, what it holds now, and why."""

    field: str
    value: str
    warning: str


def known_hardware(raw: str, options: Sequence[str]) -> str | None:
    """The hardware option ``raw`` names: itself, or a bare name with its prefix ("h200" is "datasheet: h200",
    a measured device first); None when it names none."""
    if raw in options:
        return raw
    for prefix in (MEASURED_PREFIX, DATASHEET_PREFIX):
        if prefix + raw.strip() in options:
            return prefix + raw.strip()
    return None


def fallbacks(inputs: PlanInputs, options: Sequence[str], measured: Sequence[str]) -> list[Fallback]:
    """The inputs' model preset, hardware, fp8 recipe and links that the page does not offer, each with the value
    planned instead (the default) and a warning that names the unknown
    value and the valid ones. A bare hardware name that one option carries is that option, without a warning.
    Unknown hardware is replaced by the documented default (datasheet h100-sxm), never by a measured device."""
    found: list[Fallback] = []
    if inputs.model not in PRESETS:
        default = PlanInputs().model
        found.append(Fallback("model", default, (
            f"The URL names the model preset '{plain(inputs.model)}', which is not one: planning {default} "
            f"instead. Presets: {', '.join(PRESETS)} (`headroom models` lists their sizes); pick one in the "
            "sidebar, or give a config.json or dimensions.")))
    hardware = known_hardware(inputs.hardware, options)
    if hardware is None:  # the documented default, never another device (a store's CPU is no GPU's stand-in)
        fallback = PlanInputs().hardware
        stored = ", ".join(plain(name) for name in measured) or "none"
        found.append(Fallback("hardware", fallback, (
            f"The URL names the hardware '{plain(inputs.hardware)}', which is neither a device measured in this "
            f"store nor a datasheet row: planning {plain(fallback)} instead. Measured in this store: {stored}; "
            f"datasheet rows (`headroom hardware`): {', '.join(hw.key for hw in HARDWARE)}.")))
    elif hardware != inputs.hardware:
        found.append(Fallback("hardware", hardware, ""))
    if inputs.intra_node and inputs.intra_node not in LINKS_BY_KEY:
        found.append(Fallback("intra_node", PlanInputs().intra_node, (
            f"The URL names the intra-node link '{plain(inputs.intra_node)}', which is not one: planning the "
            f"hardware's own link instead. Links: {', '.join(LINKS_BY_KEY)}.")))
    if inputs.fp8 not in (*FP8_CHOICES, AUTO):
        found.append(Fallback("fp8", PlanInputs().fp8, (
            f"The URL names the fp8 recipe '{plain(inputs.fp8)}', which is not one: planning without fp8 instead. "
            f"Recipes: {', '.join(FP8_CHOICES)}, or auto.")))
    if inputs.interconnect and not _is_network(inputs.interconnect):
        default = PlanInputs().interconnect
        found.append(Fallback("interconnect", default, (
            f"The URL names the interconnect '{plain(inputs.interconnect)}', which is not one: planning the "
            f"GPU generation's network instead. Networks: {', '.join(LINKS_BY_KEY)}, or NICs x Gb/s a node "
            f"({NETWORK_EXAMPLE}).")))
    return found


def _is_network(text: str) -> bool:
    """A network `headroom plan --interconnect` takes: a named row or NICs x Gb/s."""
    try:
        network(text)
    except ConfigError:
        return False
    return True


def pipeline_note(inputs: PlanInputs) -> str | None:
    """What a pinned pipeline schedule or virtual-stage count does when pp is not pinned above 1, or None.

    Without a GPU count an auto pp plans pp 1, which runs no pipeline: the page drops them (headroom.dashboard.planning.
    build_layout) and says so. With one, the search applies them to the layouts it gives a pipeline and runs
    the others (pp 1) without one (headroom.core.planning.layout_search)."""
    try:
        pinned = [axis for axis in ("schedule", "virtual_stages") if _axis_text(axis, getattr(inputs, axis)) != AUTO]
        pp = _axis_text("pp", inputs.pp)
    except ConfigError:
        return None  # the page shows the bad value's own error
    if not pinned or (pp != AUTO and int(pp) > 1):
        return None
    what = " and ".join(("the pipeline schedule" if axis == "schedule" else "virtual stages") for axis in pinned)
    if pp == AUTO and inputs.gpus > 0:
        return (f"pp is auto: {what} apply only to the layouts the search gives a pipeline (pp > 1); those with "
                "pp 1 run without one. Pin pp to search pipelines of one depth only.")
    why = "pp is auto, which plans pp 1 without a GPU count" if pp == AUTO else "pp is pinned at 1"
    return (f"{what[0].upper()}{what[1:]} {'are' if len(pinned) > 1 else 'is'} ignored: {why}, and one stage "
            "runs no pipeline. Pin pp above 1 (or give a GPU count to search) to plan a pipeline.")


def reserve(profile: HardwareProfile) -> str:
    """What the memory kept back beside the peak is for (headroom.core.planning.planner's context reserve)."""
    return "CUDA context" if profile.device == "cuda" else "runtime reserve"


def cluster_text(cluster: Cluster, profile: HardwareProfile) -> str:
    """The cluster a plan's communication assumes, in words true of the device: GPUs on their link, or a CPU's
    ranks, whose link between them is a stand-in unless the store measured their collectives."""
    inter = cluster.inter.name
    if profile.device != "cuda":
        if cluster.measured_inside:
            inside = f"communication inside a node from the collectives measured {plain(cluster.measured.source)}"
        else:
            inside = (f"{cluster.intra.name} assumed between them, a stand-in (a CPU has no datasheet link, and the "
                      "store holds no collectives measured on it)")
        return (f"Cluster: {cluster.gpus_per_node} ranks a node on the CPU {plain(profile.name)}, no GPU: {inside}; "
                f"nodes on {inter}.")
    measured, measured_inside = cluster.measured, cluster.measured_inside
    inside = f"collectives measured {measured.source}" if measured_inside else cluster.intra.name
    if measured is not None and measured.across_nodes is not None:
        where = (". Communication across nodes from the collectives measured across them"
                 + ("" if measured_inside else f" ({plain(measured.source)})")
                 + ", inside a node from " + ("those measured there." if measured_inside else "the datasheet link."))
    elif measured_inside:
        where = ". Communication inside a node from the measured collectives, across nodes from the datasheet link."
    else:
        where = ". Communication from datasheet links: the store holds no collectives measured on this device."
    return (f"Cluster: {cluster.gpus_per_node} GPUs a node on {plain(inside)}, nodes on {inter}"
            + (f" ({plain(cluster.assumed)})" if cluster.assumed else "") + where)
