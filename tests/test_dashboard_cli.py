"""``headroom dashboard`` refuses a port or an address it cannot listen on before it prints its URL."""

from __future__ import annotations

import os
import re
import socket

import pytest


def test_a_port_in_use_is_refused_with_a_free_one_named(run_cli):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("dashboard", "--port", str(port))
    assert (result.returncode, result.stdout) == (2, "")  # no "headroom dashboard: http://..." line
    found = re.fullmatch(re.escape(f"headroom: error: port {port} on 127.0.0.1 is already in use (another dashboard "
                                   "or server listens there); start this one on a free port with --port, e.g. "
                                   "--port ") + r"(\d+)\n", result.stderr)
    assert found, result.stderr
    free = int(found[1])
    assert port < free <= port + 20
    with socket.socket() as probe:  # it was free (as Streamlit binds: a port in TIME_WAIT counts as free)
        if os.name != "nt":
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", free))


@pytest.mark.skipif(os.name == "nt", reason="the message quotes Linux's strerror")
def test_an_address_of_another_machine_is_refused(run_cli):
    result = run_cli("dashboard", "--host", "192.0.2.1", "--port", "8501")  # TEST-NET-1: no machine's address
    assert (result.returncode, result.stdout, result.stderr) == (
        2, "", "headroom: error: cannot listen on 192.0.2.1 port 8501: Cannot assign requested address; check "
               "--host (an address of this machine, e.g. 127.0.0.1 or 0.0.0.0) and --port\n")
