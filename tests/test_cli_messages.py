"""What `headroom estimate` and `plan` say about bad input and how their tables hold huge figures.

Bad input is one line naming the value and what would be valid, exit status 2, no traceback
(README, "Exit status"); a table keeps its columns under their units whatever the figures' size.
"""

import json
import re

import pytest

from headroom.core.specs.hf_config import SUPPORTED
from headroom.core.specs.model import SIZE_LIMITS

TINY_LLAMA = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
              "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 64}
TINY_GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 100, "n_positions": 64}


def _config(tmp_path, fields: dict, drop: tuple[str, ...] = ()) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in fields.items() if k not in drop}))
    return str(path)


def _refused(result, message: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""
    assert result.stderr == f"headroom: error: {message}\n"


# ---- config.json ------------------------------------------------------------------------------


def test_a_config_without_model_type_names_the_field_and_the_supported_types(run_cli, tmp_path):
    path = _config(tmp_path, TINY_LLAMA, drop=("model_type",))
    _refused(run_cli("estimate", "--model", path),
             f"{path}: no 'model_type' field; a config.json names its architecture there, one of "
             f"{', '.join(SUPPORTED)} (e.g. \"model_type\": \"llama\")")


@pytest.mark.parametrize("fields", [TINY_LLAMA, TINY_LLAMA | {"model_type": "qwen3"},
                                    {**{k: v for k, v in TINY_LLAMA.items() if k != "num_key_value_heads"},
                                     "model_type": "gpt_neox"}])
def test_a_rotary_model_needs_no_max_position_embeddings(run_cli, tmp_path, fields):
    """The sequence length is --seq-len; a rotary model's window only decides a context-extension note, and
    none is made without one. The parameters are the same either way (rotary positions have none)."""
    with_window = json.loads(run_cli("estimate", "--model", _config(tmp_path, fields), "--seq-len", "256",
                                     "--json").stdout)
    path = _config(tmp_path, fields, drop=("max_position_embeddings",))
    result = run_cli("estimate", "--model", path, "--seq-len", "256")
    assert result.returncode == 0, result.stderr
    assert "context window" not in result.stdout
    report = json.loads(run_cli("estimate", "--model", path, "--seq-len", "256", "--json").stdout)
    assert report["model"]["max_seq_len"] == SIZE_LIMITS["max_seq_len"]
    assert report["model"]["parameters"] == with_window["model"]["parameters"]
    assert report["memory_bytes"] == with_window["memory_bytes"]
    assert not any("context window" in note for note in report["notes"])


def test_the_window_still_makes_its_note_when_given(run_cli, tmp_path):
    result = run_cli("estimate", "--model", _config(tmp_path, TINY_LLAMA | {"_name_or_path": "tiny"}), "--seq-len", "256")
    assert result.returncode == 0 and "note: seq-len 256 is beyond tiny's 64-token context window" in result.stdout


def test_gpt2_without_n_positions_says_why_it_is_required(run_cli, tmp_path):
    path = _config(tmp_path, TINY_GPT2, drop=("n_positions",))
    _refused(run_cli("estimate", "--model", path),
             f"{path}: required field 'n_positions' is missing: a gpt2 model learns a position table of "
             "n_positions x n_embd parameters (GPT-2's is 1024)")


# ---- --budget ---------------------------------------------------------------------------------

EXAMPLE = "give a number with its unit, such as 80GB or 79.6GiB (GB = 1e9 bytes, GiB = 2**30 bytes)"


@pytest.mark.parametrize(("budget", "message"), [
    ("-5GB", f"budget '-5GB' is not a positive size; {EXAMPLE}"),  # argparse took it for an option
    ("-5", f"budget '-5' is not a positive size; {EXAMPLE}"),
    ("-0.5GiB", f"budget '-0.5GiB' is not a positive size; {EXAMPLE}"),
    ("0", f"budget '0' is not a positive size; {EXAMPLE}"),  # was "has no unit; did you mean '0GB'?"
    ("0GB", f"budget '0GB' is not a positive size; {EXAMPLE}"),
    ("eightyGB", f"budget 'eightyGB' is not a size; {EXAMPLE}"),
    ("", f"budget '' is not a size; {EXAMPLE}"),
    ("80", "budget '80' has no unit; did you mean '80GB'? (GB = 1e9 bytes, GiB = 2**30)"),
    ("80XB", "unknown unit 'XB' in '80XB': use B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB "
             "(powers of 1024)"),
])
@pytest.mark.parametrize("form", ["separate", "equals"])
def test_a_bad_budget_names_the_value_and_a_valid_size(run_cli, budget, message, form):
    flag = ("--budget", budget) if form == "separate" else (f"--budget={budget}",)
    _refused(run_cli("plan", "--model", "llama2-7b", "--global-batch", "8", *flag), message)


def test_a_signed_budget_reads_as_a_size(run_cli):
    result = run_cli("plan", "--model", "bench-llama-small", "--seq-len", "128", "--global-batch", "8", "--budget",
                     "+80GB", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["request"]["budget_bytes"] == 80 * 10**9


def test_other_negative_values_reach_their_own_checks(run_cli):
    """A negative number with an exponent or a unit is a value to every training flag, not an unknown option."""
    _refused(run_cli("estimate", "--model", "llama2-7b", "--dropout", "-1e-3"), "dropout must be in [0, 1), got -0.001")
    result = run_cli("estimate", "--model", "llama2-7b", "--seq-len", "-5GB")
    assert result.returncode == 2 and "argument --seq-len: invalid int value: '-5GB'" in result.stderr


# ---- the estimate table -----------------------------------------------------------------------

HUGE = {"model_type": "llama", "num_hidden_layers": 128, "hidden_size": 25600, "num_attention_heads": 200,
        "num_key_value_heads": 8, "intermediate_size": 102400, "vocab_size": 256000,
        "max_position_embeddings": 1 << 20}
"""1.19e12 parameters, planned at a sequence of 2**20 tokens: figures of up to 13 characters (1,355,097.23 GB)."""


def _right_edges(line: str, n: int) -> list[int]:
    """Where the line's last ``n`` words end: a table's units in its header, its figures in a row."""
    return [m.end() for m in re.finditer(r"\S+", line)][-n:]


def _table(lines: list[str], title: str) -> list[str]:
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith("  ")), len(lines))
    return lines[start:end]


@pytest.mark.parametrize("args", [
    ("--model", "HUGE", "--seq-len", str(1 << 20), "--recompute", "full", "--attention", "standard"),
    ("--model", "llama2-7b", "--zero", "3", "--dp", "8"),  # "gathered parameters backward" is 28 characters
    ("--model", "llama2-7b", "--pp", "4"),
])
def test_the_estimate_table_keeps_its_columns_under_their_units(run_cli, tmp_path, args):
    if "HUGE" in args:
        args = tuple(_config(tmp_path, HUGE) if a == "HUGE" else a for a in args)
    result = run_cli("estimate", *args)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for title, units in (("memory per rank", ("GB", "GiB")), ("FLOPs per micro-batch", ("TFLOP",)),
                         ("peak per rank kind", ("GB",))):
        if title == "peak per rank kind" and "--pp" not in args:
            continue
        table = _table(lines, title)
        header = _right_edges(table[0], len(units))
        rows = [line for line in table[1:] if not set(line.strip()) <= {"-"} and "model FLOPs" not in line]
        assert rows
        for row in rows:  # a figure run into its neighbour or pushed aside by its label ends elsewhere
            assert _right_edges(row, len(units)) == header, f"{row!r} is not under {table[0]!r}"


def test_a_sliding_window_mask_on_cuda_is_refused_by_name_and_the_ways_round_it_plan(run_cli):
    """google/gemma-3-1b-it's 512-token window under SDPA at 4,096 tokens: refused on CUDA (not measured there),
    by estimate and plan alike; eager attention, a CPU target or a shorter sequence are counted."""
    model = ("--model", "tests/fixtures/hf/gemma-3-1b-it.json", "--precision", "bf16-pure", "--stack", "hf")
    message = ("google/gemma-3-1b-it: at seq-len 4,096, transformers hands the SDPA of its sliding-window layers "
               "(512 tokens) an explicit mask; which CUDA kernel takes it (memory-efficient attention or cuDNN), "
               "and what that keeps, has not been measured on a GPU yet: use --attention standard (transformers' "
               "eager attention, counted exactly), or a seq-len under 512")
    _refused(run_cli("estimate", *model, "--seq-len", "4096"), message)
    _refused(run_cli("plan", *model, "--seq-len", "4096", "--global-batch", "8", "--gpus", "8"), message)
    for other in (("--seq-len", "4096", "--attention", "standard"), ("--seq-len", "4096", "--device", "cpu"),
                  ("--seq-len", "511",)):
        result = run_cli("estimate", *model, *other, "--json")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["notes"][0].startswith("activations: per-tensor ledger of transformers' "
                                                                "modules (the hf stack)")
