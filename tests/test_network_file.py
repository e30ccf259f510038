"""A cluster's network given on the command line or in a small TOML file (`--intra-node`, `--network FILE`): what
reaches the plan's cluster, what wins, and every way a file can be wrong, refused by name."""

from __future__ import annotations

import json

import pytest

from headroom.core.errors import ConfigError
from headroom.core.specs.interconnect import NetworkSettings, cluster_for, network_settings

PLAN = ("plan", "--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus", "16", "--seq-len", "8192",
        "--global-batch", "64", "--json")
A100_CLUSTER = 'gpus_per_node = 8\nintra_node = "nvlink3"\ninterconnect = "8x200g"\n'


def _cluster(run_cli, *flags: str) -> dict:
    result = run_cli(*PLAN, *flags)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["hardware"]["cluster"]


def test_the_files_network_is_the_plans(run_cli, tmp_path):
    path = tmp_path / "cluster.toml"
    path.write_text(A100_CLUSTER)
    cluster = _cluster(run_cli, "--network", str(path))
    assert (cluster["gpus_per_node"], cluster["intra"], cluster["inter"], cluster["nics_per_node"]) == (
        8, "nvlink3", "8x200g", 8)
    assert cluster["intra_bytes_per_s"] == 300e9 and cluster["inter_bytes_per_s"] == 25e9


def test_a_flag_wins_over_the_file(run_cli, tmp_path):
    path = tmp_path / "cluster.toml"
    path.write_text(A100_CLUSTER)
    cluster = _cluster(run_cli, "--network", str(path), "--intra-node", "pcie5-x16", "--gpus-per-node", "4")
    assert (cluster["gpus_per_node"], cluster["intra"], cluster["inter"]) == (4, "pcie5-x16", "8x200g")


def test_a_file_of_some_keys_leaves_the_others_to_their_defaults(run_cli, tmp_path):
    path = tmp_path / "cluster.toml"
    path.write_text('interconnect = "ib-hdr"  # the rest: the card\'s\n')
    cluster = _cluster(run_cli, "--network", str(path))
    assert (cluster["gpus_per_node"], cluster["intra"], cluster["inter"]) == (8, "nvlink4", "ib-hdr")


def test_a_slower_link_inside_the_node_slows_the_tensor_parallel_step(run_cli):
    """tp 8 all-reduces every layer inside the node: on PCIe 5 (64 GB/s) instead of NVLink 4 (450) they take
    longer and the step with them."""
    pinned = ("plan", "--model", "llama3-8b", "--hardware", "h100-sxm", "--seq-len", "8192", "--global-batch", "8",
              "--tp", "8", "--sp", "on", "--json")

    def exposed(*flags: str) -> float:
        result = run_cli(*pinned, *flags)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)["recommendation"]["time_s"]["communication"]

    assert exposed("--intra-node", "pcie5-x16") > 5 * exposed()


@pytest.mark.parametrize(("content", "message"), [
    ('gpus_per_node = "8"\n', "gpus_per_node must be a whole number, got '8'"),
    ("gpus_per_node = true\n", "gpus_per_node must be a whole number, got True"),
    ("gpus_per_node = 0\n", "gpus_per_node must be 1 to 1,024, got 0"),
    ('interconect = "ib-hdr"\n', "unknown key 'interconect'; a network file holds gpus_per_node, intra_node, "
                                 "interconnect"),
    ('interconnect = "9x"\n', "unknown interconnect '9x'"),
    ('intra_node = "pcie9"\n', "unknown link 'pcie9' between the GPUs of a node; did you mean pcie5-x16, pcie4-x16?"),
    ('intra_node = "4x200g"\n', "unknown link '4x200g' between the GPUs of a node"),
    ("[x\n", "not TOML (Expected ']' at the end of a table declaration (at line 1, column 3))"),
])
def test_a_wrong_file_is_refused_by_name(run_cli, tmp_path, content, message):
    path = tmp_path / "cluster.toml"
    path.write_text(content)
    result = run_cli(*PLAN, "--network", str(path))
    assert result.returncode == 2 and result.stdout == ""
    assert f"--network {path}: {message}" in result.stderr


@pytest.mark.parametrize(("make", "message"), [
    (lambda path: None, "no such file"),
    (lambda path: path.mkdir(), "cannot be read (Is a directory)"),
    (lambda path: path.write_bytes(b"#" * (64 * 1024 + 1)), "over 64 KiB; a network file is a few lines of TOML"),
    (lambda path: path.write_bytes(b"\xff\xfe"), "not UTF-8 text"),
])
def test_a_file_that_is_no_network_file_is_refused_with_the_reason(run_cli, tmp_path, make, message):
    path = tmp_path / "cluster.toml"
    make(path)
    result = run_cli(*PLAN, "--network", str(path))
    assert result.returncode == 2 and f"--network {path}: {message}" in result.stderr


def test_an_unknown_link_on_the_command_line_is_refused_by_name(run_cli):
    result = run_cli(*PLAN, "--intra-node", "nvlnk4")
    assert result.returncode == 2
    assert "unknown link 'nvlnk4' between the GPUs of a node; did you mean nvlink4" in result.stderr


def test_network_settings_take_a_table_only():
    assert network_settings({}, "f") == NetworkSettings()
    with pytest.raises(ConfigError, match="f: a network file is a table of gpus_per_node, intra_node, interconnect"):
        network_settings(["interconnect"], "f")


def test_a_device_without_a_datasheet_link_takes_the_one_given_and_says_nothing_is_assumed():
    assert cluster_for("cpu").assumed  # PCIe Gen4 assumed, said so
    given = cluster_for("cpu", intra="nvlink3")
    assert given.intra.key == "nvlink3" and given.assumed == ""
    with pytest.raises(ConfigError, match="unknown link 'nvlnk3' between the GPUs of a node"):
        cluster_for("cpu", intra="nvlnk3")


def test_a_name_with_a_nul_is_refused_as_no_file_name(run_cli):
    """Found by tests/test_cli_fuzz.py: the OS refuses a NUL in a path with a ValueError, not an OSError."""
    result = run_cli("plan", "--model", "bench-llama-tiny", "--seq-len", "64", "--global-batch", "2", "--network",
                     "cluster\x00.toml")
    assert result.returncode == 2
    assert result.stderr.startswith("headroom: error: --network cluster")
    assert "not a file name (it holds a NUL character)" in result.stderr and "\x00" not in result.stderr
