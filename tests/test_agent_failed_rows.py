"""A case that fails or is skipped is still stored: its row, built before anything ran, passes the store's checks
(headroom.db.validate) for every kind and status, or the run it belongs to would fail with it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from headroom.agent.suites import KINDS, build_cases
from headroom.db.validate import check_record, record_values


@pytest.mark.parametrize("status", ["skipped", "oom", "error"])
def test_every_failed_row_of_the_standard_suite_passes_the_stores_checks(status):
    cases = build_cases("standard", torch.device("cpu"), tuple(kind for kind in KINDS if kind != "collectives"))
    assert {case.kind for case in cases} == set(KINDS) - {"collectives"}
    for case in cases:
        row = case.failed(status, "not run: the run's time budget was spent")
        check_record(type(row), record_values(row), case.name)
