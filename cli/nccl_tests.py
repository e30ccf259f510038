"""``--nccl-tests [OP=]FILE``: nccl-tests' output read for ``headroom plan`` (headroom.core.timing.nccl_tests says
what is taken from it), each file the collective's curve inside a node, or across nodes where its ranks ran on
several hosts."""

from __future__ import annotations

import re
from collections.abc import Sequence

from headroom.cli.user_file import read_user_file
from headroom.core.safe_text import printable
from headroom.core.timing.collective_curves import CollectiveCurves
from headroom.core.timing.nccl_tests import (
    MAX_BYTES,
    NcclTestsRun,
    nccl_tests_curves,
    parse_nccl_tests,
)

NAME = re.compile(r"[a-z_]+")
"""What a collective's name before ``=`` looks like (``all_reduce=FILE``); the parser refuses an unknown one."""


def read_nccl_tests(values: Sequence[str], gpus_per_node: int, measured: CollectiveCurves | None) -> CollectiveCurves:
    """The curves of the files ``values`` name (each ``FILE`` or ``OP=FILE``), over the store's ``measured``;
    ConfigError says what is wrong with a file."""
    runs: list[tuple[NcclTestsRun, str]] = []
    for value in values:
        op, sep, path = value.partition("=")
        if not sep or not NAME.fullmatch(op):  # no collective named: the whole value is the path
            op, path = None, value
        where = f"--nccl-tests {printable(path)}"
        runs.append((parse_nccl_tests(read_user_file(path, where, MAX_BYTES), where, op), printable(path)))
    return nccl_tests_curves(runs, gpus_per_node, measured)
