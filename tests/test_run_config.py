"""headroom.core.specs.run_config: one training configuration, written down one way, read back exactly."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from headroom.agent.bench_train import TrainSetup
from headroom.agent.train_ranks import setup_document, setup_from_document
from headroom.core.errors import ConfigError
from headroom.core.measured.measurements import TrainStepRecord
from headroom.core.memory.estimate import estimate
from headroom.core.specs.layout import Layout
from headroom.core.specs.presets import get_preset
from headroom.core.specs.run_config import COLUMNS, KEYS, OPTIONAL_KEYS, RECIPE_COLUMNS, VERSION, RunConfig
from headroom.db.models import TrainStepResult
from tests.run_configs import RUNS

CONFIGS = RUNS


@pytest.mark.parametrize("run", CONFIGS, ids=lambda r: r.label)
def test_the_document_reads_back_as_the_same_configuration(run):
    document = run.to_dict()
    assert list(document) == list(KEYS) and document["version"] == VERSION
    assert RunConfig.from_dict(json.loads(json.dumps(document))) == run


def test_the_document_of_a_configuration_written_by_hand():
    run = CONFIGS[1]
    assert run.to_dict() == {
        "version": 1, "seq_len": 1024, "micro_batch": 2, "accumulation_steps": 8, "recompute": "every-2",
        "attention": "standard", "precision": "bf16-pure", "optimizer": "sgd", "dropout": 0.1, "stack": "megatron",
        "layout": {"tp": 1, "sp": False, "pp": 1, "schedule": "1f1b", "virtual_stages": 1, "cp": 1, "dp": 1,
                   "zero": 0, "ep": 1},
    }
    assert (run.label, run.sequences_per_rank) == ("micro 2 x accum 8, every-2", 16)


@pytest.mark.parametrize(("change", "message"), [
    ({"version": 2}, "run configuration version 2 is not one this Headroom reads (1)"),
    ({"colour": "red"}, "run configuration: unknown keys 'colour'; valid keys: " + ", ".join(KEYS)),
    ({"layout": {"tp": 2, "wings": 1}}, "run configuration: layout must be an object of"),
    ({"recompute": 2}, "run configuration: recompute must be a policy name, got 2"),
    ({"recompute": "sometimes"}, "sometimes"),
    ({"accumulation_steps": 0}, "accumulation steps must be a whole number from 1 to 1,048,576, got 0"),
    ({"accumulation_steps": 2.0}, "accumulation steps must be a whole number from 1 to 1,048,576, got 2.0"),
    ({"dropout": "lots"}, "run configuration: "),
    ({"micro_batch": -1}, "micro-batch must be a positive integer, got -1"),
])
def test_a_bad_document_is_refused_by_what_is_wrong(change, message):
    with pytest.raises(ConfigError) as caught:
        RunConfig.from_dict(CONFIGS[0].to_dict() | change)
    assert message in str(caught.value)


def test_a_missing_key_is_named():
    document = CONFIGS[0].to_dict()
    del document["stack"]
    with pytest.raises(ConfigError, match=r"^run configuration: missing keys 'stack'; valid keys: "):
        RunConfig.from_dict(document)
    with pytest.raises(ConfigError, match="a run configuration is a JSON object, got list"):
        RunConfig.from_dict([])


def test_the_store_columns_are_the_training_step_rows():
    columns = CONFIGS[1].columns()
    assert tuple(columns) == COLUMNS + RECIPE_COLUMNS
    assert set(columns) <= set(TrainStepResult.__table__.columns.keys())
    assert set(COLUMNS) | {"dropout", "stack", "layout", "version"} == set(KEYS)
    assert set(RECIPE_COLUMNS) <= set(OPTIONAL_KEYS)  # a document writes them only when set
    with pytest.raises(ConfigError, match=r"^run configuration: missing columns 'recompute', 'optimizer'$"):
        RunConfig.from_columns({key: columns[key] for key in COLUMNS if key not in ("recompute", "optimizer")})


@pytest.mark.parametrize("run", CONFIGS, ids=lambda r: r.label)
def test_a_stored_row_reads_back_the_configuration_the_agent_wrote(run):
    """A row as the agent writes one (headroom.agent.bench_train, train_ranks): the columns, the layout off one
    device, and the estimate's document as the prediction, whose configuration holds the dropout and the stack."""
    spec = get_preset("gpt2-xl" if run.train.dropout else "llama3-8b")  # llama blocks have no dropout
    layout = run.train.layout
    row = TrainStepResult(model_name=spec.name, model_spec=spec.to_dict(), **run.columns(),
                          layout=None if layout == Layout() else run.to_dict()["layout"],
                          prediction=estimate(spec, run.train, "cuda", run.accumulation_steps).to_dict())
    assert row.run_config == run
    assert RunConfig.from_columns(run.columns(), dropout=run.train.dropout, stack=run.train.stack,
                                  layout=row.layout) == run


@pytest.mark.parametrize("run", CONFIGS, ids=lambda r: r.label)
def test_the_agent_and_a_stored_step_hold_the_same_configuration(run):
    """The agent sends a setup to its ranks as the document; a stored step reads back the configuration it ran."""
    setup = TrainSetup(spec=get_preset("llama3-8b"), config=run.train, accumulation_steps=run.accumulation_steps)
    assert setup.run_config == run
    assert setup_from_document(json.loads(json.dumps(setup_document(setup)))) == setup
    layout = run.train.layout
    record = TrainStepRecord(model_name="llama3-8b", model_spec={}, **run.columns(), median_s=1.0,
                             dropout=run.train.dropout, stack=run.train.stack,
                             layout=None if layout == Layout() else run.to_dict()["layout"])
    assert record.run_config == run
    with pytest.raises(ConfigError, match="sometimes"):  # a policy today's core does not know
        replace(record, recompute="sometimes").run_config  # noqa: B018
