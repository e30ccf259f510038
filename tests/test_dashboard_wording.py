"""The Plan page names its own controls where the core's text names `headroom plan`'s flags
(headroom.dashboard.wording), and the CLI keeps its flags."""

from __future__ import annotations

import inspect
import re

import pytest

pytest.importorskip("streamlit")

from headroom.core.planning import advice
from headroom.core.planning.advice import plan_and_advise
from headroom.dashboard import planning
from headroom.dashboard.text import plain
from headroom.dashboard.wording import FLAG_LABELS, NUMBERS, SWITCHES, page_words
from tests.dashboard_support import render_url

CASES = {
    # headroom.core.planning.advice's changes, as it writes them
    "smallest change that fits: --dp 2 --zero 3 --global-batch 66 (then micro 8 x accum 4, full on tp 1, pp 1, "
    "cp 1, dp 2, zero 3, 74.5 GB, 21,167 tokens/s)":
        "smallest change that fits: dp (data): 2, ZeRO stage: 3, global batch: 66 (then micro 8 x accum 4, full on "
        "tp 1, pp 1, cp 1, dp 2, zero 3, 74.5 GB, 21,167 tokens/s)",
    "smallest change that fits: --tp 4 --sp on (then": "smallest change that fits: tp (tensor): 4, sp (sequence): on (then",
    "smallest change that fits: --zero 3 --reshard-after-forward false (then":
        "smallest change that fits: ZeRO stage: 3, FSDP reshard (on, off, k): off (then",
    "--zero 3 --reshard-after-forward 2": "ZeRO stage: 3, FSDP reshard (on, off, k): 2",
    "--pp 4": "pp (pipeline): 4",
    "--cp 2": "cp (context): 2",
    "--ep 8": "ep (experts, of dp x cp): 8",
    "--gpus 32": "GPUs to search: 32",
    "--seq-len 1024": "sequence length (tokens): 1024",
    "smallest change that fits: --offload (then": "smallest change that fits: consider offloading activations to "
                                                  "host: on (then",
    "try more GPUs (--gpus) or a shorter --seq-len by hand":
        "try more GPUs (GPUs to search) or a shorter sequence length (tokens) by hand",
    # the core's errors and notes
    "use --tp among 1, 2, 4": "use tp (tensor) among 1, 2, 4",
    "--micro-batch 3 x --accumulation 2 is": "micro-batch: 3 x accumulation: 2 is",
    "--stack liger --tp 2: Liger's": "training stack: liger, tp (tensor): 2: Liger's",
    "--pp x --virtual-stages": "pp (pipeline) x virtual stages",
    "use --attention flash": "use attention: flash",
    "llama blocks have no dropout; use --dropout 0": "llama blocks have no dropout; use dropout (gpt blocks): 0",
    "80 GB of the H200's 141 GB; `--budget 141GB` for all of it":
        "80 GB of the H200's 141 GB; memory budget per GPU: 141 GB for all of it",
    "--gpus=8": "GPUs to search: 8",
    # left as written: a command to run, a flag the page has no control for, a framework's own flags
    "`headroom plan --gpus 16` searches on": "`headroom plan --gpus 16` searches on",
    "set: --recompute-modules layernorm; re-plan with --stack megatron":
        "set: --recompute-modules layernorm; re-plan with training stack: megatron",
    "--bf16 --grad-reduce-in-bf16": "--bf16 --grad-reduce-in-bf16",
    "re-plan with training stack hf": "re-plan with training stack hf",
}


@pytest.mark.parametrize("text", CASES)
def test_flags_read_as_the_pages_controls(text):
    assert page_words(text) == CASES[text]


def test_every_flag_the_advice_can_emit_has_a_control():
    emitted = set(re.findall(r"--[a-z][a-z-]*", inspect.getsource(advice)))
    assert emitted == {"--dp", "--zero", "--reshard-after-forward", "--global-batch", "--tp", "--sp", "--pp", "--cp",
                       "--ep", "--gpus", "--seq-len", "--offload"}, \
        "a new flag in the advice: give it a control in FLAG_LABELS"
    assert emitted <= set(FLAG_LABELS)
    for flag in emitted:
        written = flag if flag in SWITCHES else f"{flag} {8 if flag in NUMBERS else 'on'}"
        assert page_words(f"smallest change that fits: {written} (then").startswith(
            f"smallest change that fits: {FLAG_LABELS[flag]}: ")


def test_the_advice_on_the_page_names_the_sidebar_controls(tmp_path, monkeypatch):
    """llama2-7b does not fit one H100: the CLI's advice gives flags, the page the controls it has by those names."""
    at = render_url(tmp_path, monkeypatch, {"model": "llama2-7b"})
    labels = {w.label for kind in ("selectbox", "number_input", "text_input", "checkbox") for w in at.get(kind)}
    assert set(FLAG_LABELS.values()) <= labels, set(FLAG_LABELS.values()) - labels

    inputs = planning.PlanInputs(model="llama2-7b")
    profile, _ = planning.datasheet_hardware(inputs.hardware)
    told = plan_and_advise(planning.build_request(inputs, planning.resolve_preset(inputs.model), profile),
                           profile).advice  # what `headroom plan` prints
    assert any(line.startswith("smallest change that fits: --") for line in told), told
    shown = [m.value for m in at.markdown if m.value.startswith("- ")]
    assert shown == [f"- {plain(page_words(line))}" for line in told]
    assert not any("--" in line for line in shown) and any("dp (data)\\: 2" in line for line in shown), shown
