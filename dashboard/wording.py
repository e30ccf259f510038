"""The Plan page's words for ``headroom plan``'s flags.

The core's advice, errors and notes speak the command line ("smallest change that fits: --dp 2 --zero 3",
"use --tp among 1, 2, 4"); the CLI prints them as they are. On the page there is no command line, so
`page_words` names the sidebar control to change instead: "dp (data): 2, ZeRO stage: 3", "use tp (tensor)
among 1, 2, 4". `FLAG_LABELS` is the one mapping from a flag to its control's label; a flag the page has no
control for (``--trace``, ``--dropout``) and a framework's own flags in an export note (Megatron's
``--recompute-modules``) are left as written, and so is a command the text gives to run in a terminal
(```headroom plan --gpus 64```).

tests/test_dashboard_wording.py holds the mapping to every flag headroom.core.planning.advice can emit and
to the Plan page's widget labels.
"""

from __future__ import annotations

import re

from headroom.dashboard.text import plain

FLAG_LABELS: dict[str, str] = {
    "--model": "model preset",
    "--seq-len": "sequence length (tokens)",
    "--global-batch": "global batch",
    "--budget": "memory budget per GPU",
    "--hardware": "hardware",
    "--gpus": "GPUs to search",
    "--gpus-per-node": "GPUs per node",
    "--interconnect": "inter-node network",
    "--tp": "tp (tensor)",
    "--pp": "pp (pipeline)",
    "--cp": "cp (context)",
    "--dp": "dp (data)",
    "--zero": "ZeRO stage",
    "--sp": "sp (sequence)",
    "--schedule": "pipeline schedule",
    "--virtual-stages": "virtual stages",
    "--ep": "ep (experts, of dp x cp)",
    "--reshard-after-forward": "FSDP reshard (on, off, k)",
    "--precision": "precision",
    "--fp8": "fp8 recipe",
    "--optimizer": "optimizer",
    "--attention": "attention",
    "--dropout": "dropout (gpt blocks)",
    "--stack": "training stack",
    "--offload": "consider offloading activations to host",
    "--micro-batch": "micro-batch",
    "--accumulation": "accumulation",
    "--recompute": "recompute",
}
"""Each flag of ``headroom plan`` that the Plan page has a control for, and that control's label."""

SWITCHES = frozenset({"--offload"})
"""Flags that take no value: the page's control is a checkbox, ticked."""
NUMBERS = frozenset({"--seq-len", "--global-batch", "--budget", "--gpus", "--gpus-per-node", "--tp", "--pp", "--cp",
                     "--dp", "--zero", "--virtual-stages", "--ep", "--micro-batch", "--accumulation", "--dropout"})
"""Flags whose value is a number (a size for ``--budget``): a word after one ("a shorter --seq-len by hand") is
the sentence's, not the flag's value. The other flags take a name ("--stack hf", "--sp on")."""

_FLAG = r"--[a-z][a-z0-9-]*(?![a-z0-9-])"
_VALUE = r"[0-9A-Za-z][\w.+/-]*"
_RUN = re.compile(rf"`?{_FLAG}(?:[ =]{_VALUE})?(?: {_FLAG}(?:[ =]{_VALUE})?)*`?")
_ONE = re.compile(rf"(?P<flag>{_FLAG})(?:[ =](?P<value>{_VALUE}))?")
_COMMAND = re.compile(r"`headroom [^`]*`")
_SIZE = re.compile(r"^(?P<number>[0-9.]+)(?P<unit>[A-Za-z]+)$")


def _phrase(flag: str, value: str | None) -> tuple[str, str]:
    """One flag as the page's control ("GPUs to search: 16"), and the words after it that are the sentence's."""
    label = FLAG_LABELS[flag]
    if flag in SWITCHES:
        return f"{label}: on", f" {value}" if value else ""
    if value is None:
        return label, ""
    if flag in NUMBERS and not value[0].isdigit():
        return label, f" {value}"
    if flag == "--reshard-after-forward":
        value = {"true": "on", "false": "off"}.get(value, value)  # as the control takes it
    if flag == "--budget" and (size := _SIZE.match(value)):
        value = f"{size['number']} {size['unit']}"  # as the budget box takes it and shows it: "141 GB"
    return f"{label}: {value}", ""


def _run_in_page_words(run: str) -> str:
    """A run of flags ("`--dp 2 --zero 3`") as the controls to set ("dp (data): 2, ZeRO stage: 3")."""
    flags = list(_ONE.finditer(run.strip("`")))
    if any(one["flag"] not in FLAG_LABELS for one in flags):
        return run  # a flag the page has no control for: the run stays as written
    shown, words = "", ""
    for one in flags:
        phrase, after = _phrase(one["flag"], one["value"])
        shown += ("" if not shown else " " if words else ", ") + phrase + after
        words = after
    return shown


def page_words(text: str) -> str:
    """``text`` with each flag of ``headroom plan`` named as the Plan page's control, its value after a colon.

    "--gpus 16" and "`--gpus 16`" read "GPUs to search: 16"; "--budget 141GB" reads "memory budget per GPU:
    141 GB"; a flag without its value ("more GPUs (--gpus)") is the control's label alone; "--offload" is
    "consider offloading activations to host: on". Flags next to each other are joined with commas. A command
    in backticks that starts with ``headroom`` is left whole, and so is any flag not in `FLAG_LABELS`.
    """
    pieces, start = [], 0
    for command in _COMMAND.finditer(text):
        pieces.append(_RUN.sub(lambda m: _run_in_page_words(m[0]), text[start:command.start()]))
        pieces.append(command[0])
        start = command.end()
    pieces.append(_RUN.sub(lambda m: _run_in_page_words(m[0]), text[start:]))
    return "".join(pieces)


def said(text: object) -> str:
    """Text from the core (advice, an error, a note) as the page shows it: in the page's words
    (`page_words`), made plain Markdown (headroom.dashboard.text.plain)."""
    return plain(page_words(str(text)))
