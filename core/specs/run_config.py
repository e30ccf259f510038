"""RunConfig: one training configuration as a run executes it, and the one way it is written down.

A `RunConfig` is a `TrainConfig` (sequence, micro-batch, precision, optimizer, attention, dropout, checkpoint
policy, stack and layout) plus the micro-batches accumulated per optimizer step. The agent measures one, a
plan recommends one (`Candidate.run_config`), an export writes one (headroom.core.exports.run.Run), and a
stored training step holds one: `columns` are the store's flat columns of a step (the layout, the dropout and
the stack are kept beside them), `to_dict` / `from_dict` its versioned document.

A field added to the configuration is added here, to `to_dict` and `from_dict`; the records that hold a
configuration derive theirs from this one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from headroom.core.errors import ConfigError
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.layout import Layout
from headroom.core.specs.recompute import parse_policy

VERSION = 1
"""The document's version: `from_dict` reads this one and refuses others by name."""
MAX_ACCUMULATION = 2**20
"""Micro-batches per optimizer step at most: bounded like the micro-batch itself."""

COLUMNS = ("seq_len", "micro_batch", "accumulation_steps", "recompute", "attention", "precision", "optimizer")
"""The store's flat columns of a step, in the order `RunConfig.columns` writes them."""
KEYS = ("version", *COLUMNS, "dropout", "stack", "layout")
"""The document's keys, in the order `to_dict` writes them."""
OPTIONAL_KEYS = ("fp8", "fp8_param_gather", "first_last_bf16", "compile")
"""Keys written only when set (an FP8 recipe): a document without one reads as before, ``off``."""
RECIPE_COLUMNS = ("fp8", "compile")
"""The store's columns of a step beside `COLUMNS` (revision 0007): the FP8 recipe the agent ran and whether it
compiled the blocks. A step stored before them ran neither (``off``, false)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunConfig:
    train: TrainConfig
    accumulation_steps: int = 1
    """Micro-batches per optimizer step on each rank."""

    def __post_init__(self) -> None:
        steps = self.accumulation_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or not 0 < steps <= MAX_ACCUMULATION:
            raise ConfigError(f"accumulation steps must be a whole number from 1 to {MAX_ACCUMULATION:,}, got {steps!r}")

    @property
    def sequences_per_rank(self) -> int:
        """Sequences one data-parallel rank trains on per optimizer step: micro-batch x accumulation."""
        return self.train.micro_batch * self.accumulation_steps

    @property
    def choice(self) -> tuple[int, int, str]:
        """(micro-batch, accumulation, policy): what the planner chooses for a model, sequence, batch and layout."""
        return self.train.micro_batch, self.accumulation_steps, str(self.train.recompute)

    @property
    def label(self) -> str:
        """"micro 2 x accum 4, every-2" (and ", fp8 torchao-rowwise"): the planner's and the agent's short name."""
        fp8 = f", fp8 {self.train.fp8}" if self.train.float8 is not None else ""
        return f"micro {self.train.micro_batch} x accum {self.accumulation_steps}, {self.train.recompute}{fp8}"

    def columns(self) -> dict[str, Any]:
        """The store's flat columns of a training step (headroom.db.models.TrainStepResult): `COLUMNS`, then
        `RECIPE_COLUMNS`."""
        t = self.train
        return {"seq_len": t.seq_len, "micro_batch": t.micro_batch, "accumulation_steps": self.accumulation_steps,
                "recompute": str(t.recompute), "attention": t.attention, "precision": t.precision,
                "optimizer": t.optimizer, "fp8": t.fp8, "compile": t.compile}

    @classmethod
    def from_columns(cls, columns: Mapping[str, Any], *, dropout: float = 0.0, stack: str = "reference",
                     layout: Mapping[str, Any] | None = None) -> RunConfig:
        """The configuration of a stored step: its `COLUMNS` and `RECIPE_COLUMNS` (absent: off; other keys are
        ignored) and what the store keeps beside them (None layout: one device). ConfigError names a missing or
        invalid value."""
        missing = [key for key in COLUMNS if key not in columns]
        if missing:
            raise ConfigError(f"run configuration: missing columns {', '.join(map(repr, missing))}")
        recipe = {key: columns[key] for key in RECIPE_COLUMNS if columns.get(key) not in (None, "off", False)}
        return cls.from_dict({"version": VERSION, **{key: columns[key] for key in COLUMNS}, "dropout": dropout,
                              "stack": stack, "layout": dict(layout) if layout else asdict(Layout()), **recipe})

    def to_dict(self) -> dict[str, Any]:
        """The versioned document: plain JSON types, the policy by name, the layout by its fields (a data-parallel
        setting left to the stack, None, is left out: a document without one reads as before)."""
        t = self.train
        return {"version": VERSION, **{key: value for key, value in self.columns().items() if key in COLUMNS},
                "dropout": t.dropout, "stack": t.stack,
                "layout": {key: value for key, value in asdict(t.layout).items() if value is not None},
                **({"fp8": t.fp8} if t.float8 is not None else {}),
                **({"fp8_param_gather": True} if t.fp8_param_gather else {}),
                **({"first_last_bf16": True} if t.first_last_bf16 else {}),
                **({"compile": True} if t.compile else {})}

    @classmethod
    def from_dict(cls, document: Mapping[str, Any]) -> RunConfig:
        """A document `to_dict` wrote; ConfigError names a missing, unknown or invalid key."""
        if not isinstance(document, Mapping):
            raise ConfigError(f"a run configuration is a JSON object, got {type(document).__name__}")
        version = document.get("version")
        if version != VERSION:
            raise ConfigError(f"run configuration version {version!r} is not one this Headroom reads ({VERSION})")
        unknown = sorted(set(document) - set(KEYS) - set(OPTIONAL_KEYS))
        missing = [key for key in KEYS if key not in document]
        if unknown or missing:
            said = [f"unknown keys {', '.join(map(repr, unknown))}"] if unknown else []
            said += [f"missing keys {', '.join(map(repr, missing))}"] if missing else []
            raise ConfigError(f"run configuration: {'; '.join(said)}; valid keys: {', '.join(KEYS + OPTIONAL_KEYS)}")
        layout = document["layout"]
        names = {f.name for f in fields(Layout)}
        if not isinstance(layout, Mapping) or not set(layout) <= names:
            raise ConfigError(f"run configuration: layout must be an object of {', '.join(sorted(names))}, "
                              f"got {layout!r}")
        policy = document["recompute"]
        if not isinstance(policy, str):
            raise ConfigError(f"run configuration: recompute must be a policy name, got {policy!r}")
        try:
            train = TrainConfig(seq_len=document["seq_len"], micro_batch=document["micro_batch"],
                                precision=document["precision"], optimizer=document["optimizer"],
                                attention=document["attention"], dropout=document["dropout"],
                                recompute=parse_policy(policy), stack=document["stack"], layout=Layout(**layout),
                                fp8=document.get("fp8", "off"),
                                fp8_param_gather=document.get("fp8_param_gather", False),
                                first_last_bf16=document.get("first_last_bf16", False),
                                compile=document.get("compile", False))
        except TypeError as err:  # a wrongly typed value the dataclasses compare or format
            raise ConfigError(f"run configuration: {err}") from None
        return cls(train=train, accumulation_steps=document["accumulation_steps"])
