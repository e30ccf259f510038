"""README.md stays true: CI runs its test command, and its flags exist."""

import re
from pathlib import Path

from headroom.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"```sh\n(.+?)\n```", README)
    test_command = next(c for c in commands if "pytest" in c)
    assert test_command in (ROOT / ".ci" / "run").read_text()


def test_readme_lists_every_estimate_flag():
    estimate = build_parser()._subparsers._group_actions[0].choices["estimate"]
    flags = {opt for action in estimate._actions for opt in action.option_strings if opt.startswith("--")}
    documented = set(re.findall(r"\| `(--[a-z0-9-]+)`", README))
    assert flags - {"--help"} == documented


DOCS = ROOT / "docs"


def test_every_doc_is_linked_from_the_readme_and_every_link_resolves():
    linked = set(re.findall(r"\]\((docs/[a-z-]+\.md)\)", README))
    assert {f"docs/{p.name}" for p in DOCS.glob("*.md")} == linked
    for page in DOCS.glob("*.md"):
        for target in re.findall(r"\]\(([a-z-]+\.md)\)", page.read_text()):
            assert (DOCS / target).exists(), f"{page.name} links to {target}"


def test_the_accounting_pages_worked_example_is_what_the_core_computes():
    from headroom.core.memory.estimate import estimate
    from headroom.core.specs.config import TrainConfig
    from headroom.core.specs.presets import get_preset

    spec = get_preset("llama3.2-1b")
    result = estimate(spec, TrainConfig(seq_len=2048, micro_batch=1), "cuda").to_dict()
    memory, flops = result["memory_bytes"], result["flops"]
    h, kv, f, a, d, bs = spec.hidden, spec.kv_dim, spec.ffn_hidden, spec.n_heads, spec.head_dim, 2048
    per_block = bs * (22 * h + 4 * kv + 8 * f + 8) + 4 * a * bs + 8 * 2048 * d + 16  # the page's formula
    assert per_block == memory["activations_per_layer"]
    figures = [spec.parameters, spec.layer_parameters(), memory["parameters"], memory["optimizer_states"],
               memory["weight_copies"], per_block, memory["activations"], memory["logits"],
               memory["backward_transient"], memory["peak"], memory["forward_peak"], memory["optimizer_peak"],
               flops["forward"],
               flops["per_token"], flops["forward_by_component"]["logits"], flops["forward_by_component"]["q_proj"] // 16]
    page = (DOCS / "accounting.md").read_text()
    for figure in figures:
        assert f"{figure:,}" in page, figure
    assert memory["peak"] == sum(memory[k] for k in ("parameters", "optimizer_states", "weight_copies", "activations",
                                                     "logits", "backward_transient"))
