"""Arguments checked before any work, by the name of the flag that was wrong: labels as the store checks them,
sweeps listed once and bounded, a negative token count named as tokens, an accumulation no plan reaches, a
device name that could be several datasheet rows."""

from __future__ import annotations

import pytest

from headroom.cli.agent import MAX_SWEEP, _ints, _policies, parse_labels
from headroom.core.errors import ConfigError


def test_a_sweep_measures_each_configuration_once_in_the_order_given():
    assert _ints(",".join(["1"] * 5000 + ["4", "2", "4"]), "--micro-batch") == [1, 4, 2]
    assert _policies("none, full,none,every-2,full") == ["none", "full", "every-2"]


def test_labels_are_checked_as_the_store_checks_them():
    assert parse_labels(["rack=b7", "owner = ml-infra"]) == {"rack": "b7", "owner": "ml-infra"}
    with pytest.raises(ConfigError, match=r"^label value 'b\\ud800' must not contain a lone surrogate"):
        parse_labels(["rack=b\ud800"])
    with pytest.raises(ConfigError, match=r"^label key 'ra\\u202eck' must not contain a line break, a control"):
        parse_labels(["ra\u202eck=b7"])
    with pytest.raises(ConfigError, match=r"^label value 'xxxx.*' must be at most 256 characters \(it has 300\)$"):
        parse_labels(["rack=" + "x" * 300])
    with pytest.raises(ConfigError, match=r"^65 labels: a run carries at most 64$"):
        parse_labels([f"k{i}=v" for i in range(65)])


def test_agent_train_refuses_a_bad_label_or_an_oversized_sweep_before_it_measures(run_cli, tmp_path):
    store = tmp_path / "never.db"
    bad = run_cli("agent", "train", "--model", "llama3.2-1b", "--device", "cpu", "--db", str(store),
                  "--label", "rack=b\ud800")
    assert bad.returncode == 2 and bad.stderr.startswith("headroom: error: label value 'b\\ud800' must not")
    micro = ",".join(str(n) for n in range(1, MAX_SWEEP + 2))
    big = run_cli("agent", "train", "--model", "llama3.2-1b", "--device", "cpu", "--db", str(store),
                  "--micro-batch", micro)
    assert big.returncode == 2
    assert big.stderr == (f"headroom: error: --micro-batch x --recompute is {MAX_SWEEP + 1} x 1 configurations; a "
                          f"sweep measures at most {MAX_SWEEP}\n")
    assert not store.exists()


def test_a_negative_token_count_is_named_as_tokens(run_cli):
    result = run_cli("plan", "--model", "llama3-8b", "--global-tokens", "-2048")
    assert result.returncode == 2
    assert result.stderr == ("headroom: error: --global-tokens must be a positive number of tokens (a multiple of "
                             "--seq-len 2048), got -2048\n")


def test_an_accumulation_no_plan_reaches_is_refused(run_cli):
    result = run_cli("estimate", "--model", "llama3-8b", "--accumulation", "9" * 29)
    assert result.returncode == 2
    assert result.stderr == (f"headroom: error: accumulation steps must be an integer from 1 to 16,777,216, got "
                             f"{'9' * 29}\n")


def test_a_device_name_several_rows_share_is_listed(run_cli):
    result = run_cli("hardware", "--match", "H100")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == ("headroom: error: 'H100' could be any of h100-pcie, h100-sxm, h100-hbm2e; give the device name as "
                             "torch reports it, e.g. 'NVIDIA H100 80GB HBM3'\n")
    assert run_cli("hardware", "--match", "NVIDIA H100 80GB HBM3").stdout.startswith("'NVIDIA H100 80GB HBM3' -> h100-sxm")


@pytest.mark.parametrize(("value", "why"), [
    ("0", "a node holds 1 to 1,024 GPUs, got 0"), ("1025", "a node holds 1 to 1,024 GPUs, got 1025"),
    ("99999999999999999999", "a node holds 1 to 1,024 GPUs, got 99999999999999999999"),
    ("eight", "expected a whole number of GPUs, got 'eight'"),
])
def test_a_node_size_is_checked_as_the_network_file_checks_it_even_on_one_gpu(run_cli, value, why):
    """--gpus-per-node takes what a --network file's gpus_per_node takes (1 to 1,024), whether or not the plan
    spans GPUs (a one-GPU plan builds no cluster that would check it)."""
    for layout in ((), ("--tp", "2", "--dp", "8")):
        result = run_cli("plan", "--model", "llama2-7b", "--global-batch", "64", "--gpus-per-node", value, *layout)
        assert result.returncode == 2 and result.stdout == ""
        assert f"argument --gpus-per-node: {why}" in result.stderr


@pytest.mark.parametrize(("args", "message"), [
    (("plan", "--model", "llama2-7b", "--global-batch", "8", "--network", ""),
     "--network: an empty file name; give the file's path"),
    (("plan", "--model", "llama2-7b", "--global-batch", "8", "--nccl-tests", ""), "an empty file name"),
    (("db", "info", "--db", ""), "store location '' is empty: give a store's path or URL"),
    (("db", "info", "--db", "  "), "store location '  ' is empty"),
])
def test_an_empty_name_is_refused_not_taken_for_the_default(run_cli, monkeypatch, tmp_path, args, message):
    """An empty --db (an unset shell variable, --db "$DB") had fallen back to HEADROOM_DB or the default store, and
    an empty --network to no file at all, silently."""
    if args[0] == "db":  # a store HEADROOM_DB names, which the empty --db must not fall back to and create
        monkeypatch.setenv("HEADROOM_DB", str(tmp_path / "never.db"))
    result = run_cli(*args)
    assert result.returncode == 2 and result.stdout == ""
    assert message in result.stderr and result.stderr.count("\n") == 1
    assert not (tmp_path / "never.db").exists()
