"""headroom.db.validate: a record completed with its table's defaults is the row the ORM object would hold."""

from __future__ import annotations

from dataclasses import MISSING, fields
from datetime import datetime

import pytest

from headroom.db.models import Base
from headroom.db.validate import check_record, complete, record_values

MODELS = sorted((mapper.class_ for mapper in Base.registry.mappers), key=lambda model: model.__name__)


def _required(model) -> dict[str, int]:
    """Every field a record must give (the check's types are not at issue here: 1 for each)."""
    return {f.name: 1 for f in fields(model) if f.init and f.default is MISSING and f.default_factory is MISSING}


@pytest.mark.parametrize("model", MODELS, ids=lambda model: model.__name__)
def test_a_record_takes_the_defaults_the_orm_gives_it(model):
    required = _required(model)
    built, completed = record_values(model(**required)), complete(model, required)
    assert list(completed) == list(built)
    for key, value in built.items():
        if isinstance(value, datetime):  # a default of now: the two were made microseconds apart
            assert isinstance(completed[key], datetime) and completed[key].tzinfo is not None, key
            assert abs((completed[key] - value).total_seconds()) < 60, key
        else:
            assert completed[key] == value and type(completed[key]) is type(value), key


def test_each_record_gets_its_own_lists_and_dicts():
    from headroom.db.models import Fingerprint, MatmulResult

    first, second = (complete(MatmulResult, _required(MatmulResult)) for _ in range(2))
    assert first["samples_s"] == [] and first["samples_s"] is not second["samples_s"]
    device = _required(Fingerprint)
    assert complete(Fingerprint, device)["details"] == {}
    assert complete(Fingerprint, device)["details"] is not complete(Fingerprint, device)["details"]


@pytest.mark.parametrize("samples", [[0.1, float("nan")], [0.1, -0.1], [True], [10**400], ["0.1"], [0.1, [0.2]]],
                         ids=["nan", "negative", "bool", "beyond a float", "text", "nested"])
def test_samples_must_be_seconds(samples):
    from headroom.db.errors import StoreError
    from headroom.db.models import MatmulResult

    record = _required(MatmulResult) | {"dtype": "fp32", "m": 8, "n": 8, "k": 8, "samples_s": samples}
    with pytest.raises(StoreError, match=r"field 'samples_s' must be a list of non-negative finite numbers \(seconds\)"):
        check_record(MatmulResult, record, "matmul result 1")
