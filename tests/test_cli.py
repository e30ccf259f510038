"""`headroom estimate` and `plan` as a user runs them: the JSON contract and one-line errors.

The JSON contract runs in a process of its own; the rest run main in this one (tests/conftest.py, run_cli).
"""

import json

import pytest

from headroom.core.specs.presets import get_preset
from tests.conftest import FIXTURES

MEMORY_KEYS = {"parameters", "gradients", "master_weights", "optimizer_states", "activations",
               "activations_per_layer", "logits", "peak"}
FLOPS_KEYS = {"forward", "backward", "recompute", "step", "per_token"}


def test_estimate_json_contract(headroom):
    result = headroom("estimate", "--model", "llama2-7b", "--seq-len", "4096", "--recompute", "full",
                      "--precision", "bf16-master", "--optimizer", "adam", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert {"model", "config", "memory_bytes", "flops"} <= report.keys()
    assert report["model"]["parameters"] == 6_738_415_616
    assert report["config"]["recompute"] == "full" and report["config"]["seq_len"] == 4096
    assert MEMORY_KEYS <= report["memory_bytes"].keys()
    assert FLOPS_KEYS <= report["flops"].keys()
    assert all(isinstance(v, int) for v in report["memory_bytes"].values())
    memory = report["memory_bytes"]
    assert memory["parameters"] + memory["gradients"] + memory["master_weights"] + memory["optimizer_states"] == 16 * 6_738_415_616
    peak = report["peak"]  # the components at the moment of the peak add up to it
    assert peak["moment"] in ("forward", "loss backward", "recompute", "optimizer step")
    assert memory["peak"] == sum(peak["components"].values()) == max(memory["forward_peak"], memory["backward_peak"],
                                                                     memory["optimizer_peak"])
    assert memory["autocast_cache"] == 0  # bf16-master: the model is bf16, autocast copies nothing

    def plain(accumulation: str) -> dict:
        out = headroom("estimate", "--model", "llama2-7b", "--seq-len", "4096", "--precision", "bf16-master",
                       "--optimizer", "adam", "--accumulation", accumulation, "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    # Without recompute the peak is backward's first moment: no gradient exists yet without accumulation.
    single, accumulated = plain("1"), plain("4")
    assert single["peak"]["moment"] == accumulated["peak"]["moment"] == "loss backward"
    assert single["peak"]["components"]["gradients"] == 0
    assert accumulated["peak"]["components"]["gradients"] == memory["gradients"] == 2 * 6_738_415_616
    assert accumulated["memory_bytes"]["peak"] - single["memory_bytes"]["peak"] == memory["gradients"]
    flops = report["flops"]
    assert flops["step"] == flops["forward"] + flops["backward"] + flops["recompute"]


def test_estimate_accepts_a_config_json(run_cli):
    result = run_cli("estimate", "--model", str(FIXTURES / "hf" / "mistral-7b-v0.1.json"), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["model"]["parameters"] == 7_241_732_096


def test_estimate_table_names_its_units(run_cli):
    result = run_cli("estimate", "--model", "gpt2-small", "--seq-len", "1024", "--dropout", "0.1",
                      "--attention", "standard", "--recompute", "every-3", "--dp", "8", "--zero", "1")
    assert result.returncode == 0, result.stderr
    assert "GB" in result.stdout and "GiB" in result.stdout
    assert f"{get_preset('gpt2-small').parameters:,} parameters" in result.stdout
    assert "recompute every-3" in result.stdout


def _bad_config(tmp_path, **fields):
    base = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
            "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 64}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(base | fields))
    return str(path)


def _sparse(path, size: int) -> str:
    """A file of ``size`` zero bytes taking no disk."""
    with open(path, "wb") as f:
        f.truncate(size)
    return str(path)


def _linked(path, target: str) -> str:
    path.symlink_to(target)
    return str(path)


@pytest.mark.parametrize(
    ("make_args", "message"),
    [
        (lambda tmp: ["--model", "llama2-7"], "unknown model preset 'llama2-7'; did you mean llama2-7b"),
        (lambda tmp: ["--model", _bad_config(tmp, num_attention_heads=5)], "hidden 64 is not divisible by n_heads 5"),
        (lambda tmp: ["--model", _bad_config(tmp, num_key_value_heads=3)], "n_heads 4 is not divisible by n_kv_heads 3"),
        (lambda tmp: ["--model", _bad_config(tmp, hidden_size=-64)], "hidden must be a positive integer, got -64"),
        (lambda tmp: ["--model", "llama2-7b", "--seq-len", "-5"], "seq-len must be a positive integer, got -5"),
        (lambda tmp: ["--model", "llama2-7b", "--recompute", "every-x"], "unknown recompute policy 'every-x'"),
        (lambda tmp: ["--model", "llama2-7b", "--dropout", "0.1"], "llama blocks have no dropout"),
        (lambda tmp: ["--model", "gpt2-small", "--seq-len", "2048"], "exceeds its 1024 learned positions"),
        (lambda tmp: ["--model", str(tmp / "missing.json")], "does not exist"),
        (lambda tmp: ["--model", "llama2-7b", "--tp", "3"], "32 attention heads do not split over tp 3; use --tp among"),
        (lambda tmp: ["--model", "llama2-7b", "--sp", "on"], "sequence parallelism splits work between tensor-parallel"),
        (lambda tmp: ["--model", "llama2-7b", "--cp", "2", "--attention", "standard"], "ring attention on fused kernels"),
        # Sizes that would make the work grow without bound are refused before any work (they once hung or
        # ran out of memory).
        (lambda tmp: ["--model", _bad_config(tmp, num_hidden_layers=10**12)],
         "n_layers 1,000,000,000,000 is beyond any trainable model (at most 10,000)"),
        (lambda tmp: ["--model", _bad_config(tmp, hidden_size=10**12, num_attention_heads=7)],
         "hidden 1,000,000,000,000 is beyond any trainable model (at most 1,048,576)"),
        (lambda tmp: ["--model", "llama2-7b", "--micro-batch", str(10**9)], "micro-batch 1,000,000,000 is beyond"),
        (lambda tmp: ["--model", _nested_json(tmp)], "JSON nested too deeply to be a model config"),
        # A model's weights (or a device) where a config.json belongs: refused after 16 MiB, not read whole.
        (lambda tmp: ["--model", _sparse(tmp / "model.safetensors", 1 << 30)],
         "holds more than 16 MiB, which no config.json does"),
        (lambda tmp: ["--model", _linked(tmp / "zero.json", "/dev/zero")], "holds more than 16 MiB, which no "
                                                                             "config.json does"),
    ],
)
def test_bad_input_is_one_clear_line(run_cli, tmp_path, make_args, message):
    result = run_cli("estimate", *make_args(tmp_path))
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_a_sequence_beyond_a_llamas_context_window_is_said_not_refused(run_cli, monkeypatch):
    """Training a RoPE model beyond its context window is context extension: planned, and said."""
    monkeypatch.setenv("COLUMNS", "1000")  # the note's words, on one line (tests/test_cli_wrap.py: the layout)
    said = "seq-len 8,192 is beyond llama2-7b's 4,096-token context window: training there extends the context"
    estimate = run_cli("estimate", "--model", "llama2-7b", "--seq-len", "8192")
    assert estimate.returncode == 0 and f"note: {said}" in estimate.stdout
    plan = run_cli("plan", "--model", "llama2-7b", "--seq-len", "8192", "--global-batch", "8", "--dp", "8",
                    "--zero", "3")
    assert plan.returncode == 0 and f"note: {said}" in plan.stdout
    assert "context window" not in run_cli("estimate", "--model", "llama2-7b", "--seq-len", "4096").stdout


def test_what_a_models_config_asks_and_the_accounting_does_not_count_is_said_by_estimate_and_plan(run_cli):
    gemma2 = str(FIXTURES / "hf" / "gemma-2-9b.json")
    said = ["google/gemma-2-9b: attention scores soft-capped at 50 (attn_logit_softcapping)",
            "google/gemma-2-9b: final logits soft-capped at 30 (final_logit_softcapping)"]
    estimate = json.loads(run_cli("estimate", "--model", gemma2, "--seq-len", "4096", "--json").stdout)
    plan = json.loads(run_cli("plan", "--model", gemma2, "--seq-len", "4096", "--global-batch", "8", "--dp", "8",
                              "--zero", "3", "--json").stdout)
    for notes in (estimate["notes"], plan["notes"]):
        assert [n.split(", which")[0].split(": its tanh")[0] for n in notes[:2]] == said
    assert not any("soft-capped" in n for n in json.loads(run_cli("estimate", "--model", "llama2-7b",
                                                                     "--json").stdout)["notes"])


def _nested_json(tmp_path) -> str:
    path = tmp_path / "deep.json"
    path.write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    return str(path)


def test_unparseable_config_json(run_cli, tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    result = run_cli("estimate", "--model", str(path))
    assert result.returncode == 2
    assert result.stderr.strip() == f"headroom: error: {path}: not valid JSON (Expecting property name enclosed in double quotes at line 1, column 2)"


def test_catalog_commands(run_cli):
    models = run_cli("models")
    assert models.returncode == 0 and "llama3-70b" in models.stdout
    assert run_cli("hardware", "--match", "NVIDIA H200").stdout.startswith("'NVIDIA H200' -> h200")
    unknown = run_cli("hardware", "--match", "NVIDIA H200 NVL")
    assert unknown.returncode == 1 and "unknown" in unknown.stdout


def test_version_is_the_installed_package_version(headroom):
    from importlib.metadata import version

    result = headroom("--version")
    assert result.returncode == 0 and result.stdout == f"headroom {version('headroom')}\n"


def test_models_and_hardware_as_json(run_cli):
    from headroom.core.specs.hardware import HARDWARE
    from headroom.core.specs.presets import PRESETS

    models = json.loads(run_cli("models", "--json").stdout)
    assert [(m["name"], m["parameters"], m["n_layers"]) for m in models] == [
        (p.name, p.parameters, p.n_layers) for p in PRESETS.values()]
    rows = json.loads(run_cli("hardware", "--json").stdout)
    assert [(r["key"], r["peak_flop_per_s"], r["hbm_bytes_per_s"], r["memory_bytes"]) for r in rows] == [
        (h.key, h.peak_flop_per_s, h.hbm_bytes_per_s, h.memory_bytes) for h in HARDWARE]
    match = json.loads(run_cli("hardware", "--match", "NVIDIA H200", "--json").stdout)
    assert match["key"] == "h200" and match["datasheet"]["memory_bytes"] == 141_000_000_000
    unknown = run_cli("hardware", "--match", "NVIDIA H200 NVL", "--json")
    assert unknown.returncode == 1 and json.loads(unknown.stdout)["datasheet"] is None


@pytest.mark.parametrize(("name", "key"), [("H100-SXM", "h100-sxm"), ("4090", "rtx-4090"), ("mi300", "mi300x"),
                                           ("a100-sxm-80", "a100-sxm-80gb")])
def test_hardware_is_named_by_any_case_or_a_part_of_one_key(name, key):
    from headroom.core.specs.hardware import get_hardware

    assert get_hardware(name).key == key


def test_a_part_of_several_keys_lists_them(run_cli):
    result = run_cli("plan", "--model", "llama3-8b", "--global-batch", "8", "--hardware", "a100")
    assert result.returncode == 2
    assert result.stderr == ("headroom: error: hardware 'a100' could be any of a100-sxm-80gb, a100-pcie-80gb, "
                             "a100-sxm-40gb, a100-pcie-40gb; give one of them\n")


def test_a_plan_for_a_cpu_speaks_of_devices_not_gpus():
    import dataclasses

    from headroom.cli.plan import render
    from headroom.core.planning.advice import plan_and_advise
    from headroom.core.planning.planner import PlanRequest
    from headroom.core.specs.config import TrainConfig
    from headroom.core.specs.hardware import get_hardware
    from headroom.core.timing.step import datasheet_profile

    request = PlanRequest(spec=get_preset("bench-llama-tiny"), train=TrainConfig(seq_len=64), global_batch=8)
    gpu = datasheet_profile(get_hardware("h100-sxm"))
    cpu = dataclasses.replace(gpu, device="cpu")
    on_gpu, on_cpu = (render(plan_and_advise(request, profile), None) for profile in (gpu, cpu))
    assert "GB per GPU" in on_gpu and "CUDA context" in on_gpu and "per GPU)" in on_gpu
    assert "GB per device" in on_cpu and "runtime reserve" in on_cpu and "per device)" in on_cpu
    assert "GPU" not in on_cpu.replace("--gpus", "") and "CUDA" not in on_cpu
    # A cluster of CPU ranks: described as such, its link a stand-in.
    xeon = dataclasses.replace(cpu, name="Intel Xeon")
    search = dataclasses.replace(request, gpus=8, cluster=xeon.cluster())
    cluster_line = next(line for line in render(plan_and_advise(search, xeon), None).splitlines()
                        if line.startswith("cluster: "))
    assert cluster_line == ("cluster: 8 ranks a node on the CPU Intel Xeon, no GPU: PCIe 4.0 x16 assumed between them, "
                            "a stand-in; nodes on InfiniBand NDR 400 Gb/s, one NIC per GPU")


def test_the_default_budget_is_what_the_device_holds_up_to_80_gb_and_a_larger_one_is_flagged(run_cli):
    """A 24 GB RTX 4090 is planned at 24 GB, a 141 GB H200 at the default 80 GB; a budget beyond the
    device's memory plans for a device that does not exist, and the plan says so."""
    args = ("plan", "--model", "llama3.2-1b", "--seq-len", "2048", "--global-batch", "8", "--json")

    def planned(*more: str) -> dict:
        return json.loads(run_cli(*args, *more).stdout)

    card, h200 = planned("--hardware", "rtx-4090"), planned("--hardware", "h200")
    assert (card["request"]["budget_bytes"], card["notes"]) == (24 * 10**9, [])
    assert (h200["request"]["budget_bytes"], h200["notes"]) == (80 * 10**9, [])
    over = planned("--hardware", "rtx-4090", "--budget", "80GB")
    assert over["request"]["budget_bytes"] == 80 * 10**9
    assert over["notes"] == ["the 80.0 GB budget is more than the 24.0 GB the rtx-4090 holds; a budget of at most "
                             "24.0GB plans for it"]
    text = run_cli(*args[:-1], "--hardware", "rtx-4090").stdout
    assert "budget: 24.0 GB per GPU (GB = 1e9 bytes; all the rtx-4090 holds)" in text


def test_estimate_ledger_lists_tensors_and_sums_to_the_activations(run_cli):
    result = run_cli("estimate", "--model", "bench-llama-small", "--seq-len", "256", "--micro-batch", "2",
                      "--recompute", "selective", "--device", "cpu", "--json", "--ledger")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    ledger, memory = report["ledger"], report["memory_bytes"]
    device_activations = sum(t["bytes"] for t in ledger if t["kind"] != "parameter_copy" and t["location"] == "device")
    assert device_activations == memory["activations"] + memory["logits"]
    assert report["config"]["device"] == "cpu"
    table = run_cli("estimate", "--model", "bench-llama-small", "--ledger")
    assert "block.attn.sdpa_out" in table.stdout and "log_softmax" in table.stdout


def test_plan_searches_layouts_and_exports_the_winner(run_cli):
    """--gpus searches layouts; the JSON names each layout's fate, and --export carries the chosen one."""
    args = ("plan", "--model", "llama2-7b", "--seq-len", "4096", "--global-batch", "64", "--gpus", "8", "--tp", "2")
    report = json.loads(run_cli(*args, "--json", "--export", "deepspeed").stdout)
    best = report["recommendation"]
    # tp pinned by hand; pp, cp and ep held at 1, which a DeepSpeed config cannot express, on the hf stack (its
    # ZeRO is DeepSpeed's), which has no pipeline to hold
    assert report["request"]["gpus"] == 8 and report["request"]["pinned"] == ["cp", "ep", "pp", "tp"]
    assert report["request"]["stack"] == "hf"
    assert report["export"]["held_at_1"] == ["cp"]  # ep too, though a dense model has none to hold
    assert best["layout"]["tp"] == 2 and best["layout"]["world"] == 8
    assert {entry["layout"]["tp"] for entry in report["layouts"]} == {2}
    assert sum(term for term in best["time_s"].values()) == pytest.approx(best["step_time_s"])
    # Every overlappable axis against its window; with tp's traffic (never hidden), what the step waits for.
    assert {o["axis"] for o in best["overlap"]} == {t["axis"] for t in best["communication"] if t["overlappable"]}
    for o in best["overlap"]:
        assert o["slack_s"] == pytest.approx(o["window_s"] - o["communication_s"])
        assert o["exposed_s"] == pytest.approx(max(0.0, -o["slack_s"]))
    hidden_never = sum(t["seconds"] for t in best["communication"] if not t["overlappable"])
    assert best["time_s"]["communication"] == pytest.approx(hidden_never + sum(o["exposed_s"] for o in best["overlap"]))
    assert (report["export"]["format"], report["export"]["unexpressed"]) == ("deepspeed", [])  # tp: AutoTP
    assert json.loads(report["export"]["text"])["train_batch_size"] == 64
    hf = json.loads(run_cli(*args, "--json", "--export", "hf").stdout)["export"]
    assert hf["unexpressed"] == ["tp"] and any("cannot express tp 2" in note for note in hf["notes"])
    megatron = run_cli(*args, "--export", "megatron")
    assert "--tensor-model-parallel-size 2" in megatron.stdout and "--sequence-parallel" in megatron.stdout


def test_an_export_searches_only_what_its_format_can_express(run_cli):
    """--export FORMAT searches the layouts the format can carry (Lightning has no context parallelism, so the
    8B on 32 GPUs at a global batch of 8 splits by tp where the free search takes cp 4), says so, and plans on the
    stack of the format's name unless --stack is given."""
    args = ("plan", "--model", "llama3-8b", "--seq-len", "8192", "--global-batch", "8", "--gpus", "32")
    free = json.loads(run_cli(*args, "--json").stdout)["recommendation"]["layout"]
    assert free["cp"] > 1
    lightning = json.loads(run_cli(*args, "--json", "--export", "lightning").stdout)
    layout = lightning["recommendation"]["layout"]
    assert (layout["pp"], layout["cp"], layout["ep"]) == (1, 1, 1) and layout["world"] == 32
    assert lightning["export"]["held_at_1"] == ["pp", "cp"] and lightning["export"]["unexpressed"] == []
    text = run_cli(*args, "--export", "lightning")
    assert "note: searched with pp and cp at 1: --export lightning cannot express them" in text.stderr
    assert json.loads(run_cli(*args, "--json", "--export", "megatron").stdout)["export"]["held_at_1"] == []
    pinned = json.loads(run_cli(*args, "--cp", "2", "--json", "--export", "lightning").stdout)["export"]
    assert pinned["held_at_1"] == ["pp"] and pinned["unexpressed"] == ["cp"]  # given by hand: kept, noted
    # cp implied by another flag is not held at 1 either
    implied = run_cli(*args, "--cp-comm", "all-gather", "--json", "--export", "lightning")
    assert implied.returncode == 0, implied.stderr
    assert json.loads(implied.stdout)["recommendation"]["layout"]["cp"] > 1


def test_a_search_whose_layouts_cannot_all_be_scheduled_prints_strict_json(run_cli):
    """128 GPUs for a global batch of 64: interleaved layouts with too few micro-batches to schedule are not
    left out at an infinite floor (Infinity is no JSON); every number in the output is finite."""
    out = run_cli("plan", "--model", "llama2-7b", "--global-batch", "64", "--gpus", "128", "--json").stdout

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in the JSON")

    report = json.loads(out, parse_constant=refuse)
    assert report["pruned"] and all(p["floor_step_s"] < 1e9 for p in report["pruned"])


def test_an_export_plans_on_the_stack_of_its_name(run_cli):
    from headroom.cli.main import build_parser
    from headroom.cli.plan import for_export

    parser = build_parser()
    base = ["plan", "--model", "llama3-8b", "--global-batch", "8", "--gpus", "8"]
    assert for_export(parser.parse_args([*base, "--export", "torchtitan"]))[0].stack == "torchtitan"
    assert for_export(parser.parse_args([*base, "--export", "hf"]))[0].stack == "hf"
    # DeepSpeed's ZeRO-1 and 2 are the hf stack's, call for call
    assert for_export(parser.parse_args([*base, "--export", "deepspeed"]))[0].stack == "hf"
    assert for_export(parser.parse_args([*base, "--export", "lightning"]))[0].stack == "reference"
    assert for_export(parser.parse_args([*base, "--export", "torchtitan", "--stack", "megatron"]))[0].stack == "megatron"
    assert for_export(parser.parse_args(base))[0].stack == "reference"
    one = parser.parse_args(["plan", "--model", "llama3-8b", "--global-batch", "8", "--export", "hf"])
    assert for_export(one)[1] == ()  # one layout, not a search: nothing to hold
    # a model the hf stack does not cover (a mixture of experts) is exported to DeepSpeed from the reference stack
    moe = ("plan", "--model", "mixtral-8x7b", "--global-batch", "256", "--seq-len", "4096", "--gpus", "16",
           "--export", "deepspeed")
    assert json.loads(run_cli(*moe, "--json").stdout)["request"]["stack"] == "reference"
    text = run_cli(*moe)
    assert text.returncode == 0 and "note: planned on the reference stack, since the hf stack (whose ZeRO-1 and 2 " \
        "are DeepSpeed's) covers transformers' Llama modules, not mixtral-8x7b" in " ".join(text.stderr.split())
    # an axis the export holds at 1 is no pin of dp: a shard kept over 2 ranks is searched over 16 GPUs
    kept = run_cli("plan", "--model", "llama3-8b", "--global-batch", "64", "--gpus", "16", "--reshard-after-forward",
                   "2", "--export", "deepspeed")
    assert kept.returncode == 0, kept.stderr
    assert json.loads(kept.stdout)["zero_optimization"]["zero_hpz_partition_size"] == 2
    refused = run_cli(*moe, "--stack", "hf")  # asked for by name: refused, as before
    assert refused.returncode == 2 and "the hf stack accounts for transformers' Llama modules" in refused.stderr


def test_plan_sums_each_collectives_bytes_once_per_axis_and_op(run_cli, monkeypatch):
    """The text's communication line gives each axis and op once, with the bytes of all its terms (the
    blocks', the vocabulary's and the loss's all-reduces of tp are separate terms in --json)."""
    monkeypatch.setenv("COLUMNS", "1000")  # the line whole (tests/test_cli_wrap.py: the layout)
    args = ("plan", "--model", "llama3-8b", "--seq-len", "4096", "--global-batch", "64", "--gpus", "8",
            "--tp", "4", "--sp", "off", "--zero", "1")
    terms = json.loads(run_cli(*args, "--json").stdout)["recommendation"]["communication"]
    assert sum(t["axis"] == "tp" and t["op"] == "all_reduce" for t in terms) > 1
    (line,) = [line for line in run_cli(*args).stdout.splitlines() if line.startswith("  communication:")]
    moved = line.split("exposed after overlap: ")[1].split("; ")
    expected = {}
    for t in terms:
        key = f"{t['axis']} {t['op'].replace('_', '-')}"
        expected[key] = expected.get(key, 0) + t["message_bytes"] * t["calls"]
    assert moved == [f"{key} {n / 1e9:.2f} GB on nvlink4" for key, n in expected.items()]


@pytest.mark.parametrize(("args", "message"), [
    (("--budget", "80"), "budget '80' has no unit; did you mean '80GB'?"),
    (("--budget", "1e400GB"), "size '1e400GB' is too large to be a size in bytes"),
    (("--budget", "2000TB"), "budget '2000TB' is outside 1 MiB to 1 PB"),
    (("--global-tokens", "4096", "--seq-len", "0"), "seq-len must be a positive integer, got 0"),
    (("--global-batch", "8", "--interconnect", "foo"),
     "argument --interconnect: unknown interconnect 'foo'; known: nvlink3, nvlink4"),
    (("--global-batch", "8", "--interconnect", "0x200g"),
     "argument --interconnect: interconnect '0x200g': NICs a node must be 1-64"),
    (("--global-batch", "8", "--tp"), "argument --tp: expected one argument"),
    (("--global-batch", "24", "--gpus", "12"),
     "12 GPUs are not whole nodes of 8 (--gpus-per-node): use 8 or 16 GPUs, or --gpus-per-node among 2, 3, 4, 6"),
    (("--global-batch", "20", "--dp", "10", "--zero", "3", "--gpus-per-node", "4"),
     "10 GPUs are not whole nodes of 4 (--gpus-per-node): use 8 or 12 GPUs, or --gpus-per-node among 2"),
    (("--global-batch", "8", "--schedule", "interleaved", "--virtual-stages", "2"),
     "--schedule interleaved --virtual-stages 2 schedules a pipeline, and there is none (pp 1): add --pp 2 or more, "
     "or leave the schedule out"),
    (("--global-batch", "14", "--gpus", "7", "--gpus-per-node", "4"),
     "7 GPUs are not whole nodes of 4 (--gpus-per-node): use 4 or 8 GPUs\n"),
])
def test_plan_bad_input_is_one_line(run_cli, args, message):
    """Every bad value, argparse's included, is one line on stderr and exit status 2."""
    if "--global-batch" not in args and "--global-tokens" not in args:
        args = (*args, "--global-batch", "8")
    result = run_cli("plan", "--model", "llama2-7b", *args)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr


def test_a_string_where_config_json_wants_a_boolean_is_refused(run_cli, tmp_path):
    """tie_word_embeddings: "false" is a string, truthy: it must not silently tie the head."""
    path = _bad_config(tmp_path, tie_word_embeddings="false")
    result = run_cli("estimate", "--model", str(path))
    assert result.returncode == 2
    assert "tie_word_embeddings must be true or false (a JSON boolean), got 'false'" in result.stderr


@pytest.mark.parametrize(("args", "message"), [
    (("agent", "train", "--model", "bench-llama-tiny", "--device", "cpu", "--recompute", ",,,"),
     "--recompute ',,,' names no policy"),
    (("agent", "run", "--suite", "smoke", "--device", "cpu", "--only", ""), "--only '': names no kind"),
    (("dashboard", "--host", "not a host!"), "--host 'not a host!' is not an address or a name this machine resolves"),
])
def test_commands_refuse_empty_or_unusable_values_before_any_work(run_cli, tmp_path, args, message):
    """A list that names nothing would record an empty 'completed' run; a host Streamlit cannot bind would end
    in its traceback. Both are one line, exit 2, and nothing is written."""
    db = tmp_path / "store.db"
    result = run_cli(*args, "--db", f"sqlite:///{db}")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert not db.exists()


def test_the_in_process_cli_reports_what_a_process_would(run_cli, monkeypatch):
    """run_cli's stderr carries a warning the command raised (as a fresh interpreter prints it) and its
    exit status is main's, argparse's exits included: a test of one clean line cannot pass by running here."""
    import warnings

    import headroom.cli.catalog

    def warned(args):
        warnings.warn("a warning a user would see", UserWarning, stacklevel=2)
        print("listed")

    monkeypatch.setattr(headroom.cli.catalog, "run_models", warned)
    parser_built = run_cli("models")
    assert parser_built.returncode == 0 and parser_built.stdout == "listed\n"
    assert parser_built.stderr.count("\n") == 2 and "UserWarning: a warning a user would see" in parser_built.stderr
    usage = run_cli("plan", "--model", "llama2-7b", "--global-batch", "8", "--tp")
    assert usage.returncode == 2 and usage.stderr.count("\n") == 1
