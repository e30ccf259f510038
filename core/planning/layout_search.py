"""The layouts worth trying on N GPUs: every tp x pp x cp x dp x sharding stage that divides.

Rules, each a pruning that cannot lose the fastest layout or that states why:

- tp stays inside a node (``tp <= gpus_per_node``): its all-reduces run every
  layer and cannot hide; it divides the attention and key/value heads.
- sequence parallelism is on whenever tp > 1 and the stack has it: it moves
  the same bytes as plain tensor parallelism (Korthikanti et al. 2022,
  Sec. 4.2.2) and keeps less.
- pp splits the layers by the stack's rule (headroom.core.specs.stages: evenly,
  or where they do not divide, or under torchtitan always, with the embedding
  and head counted as a block each); with pp > 1 ``1f1b``, ``interleaved``
  with two virtual stages (when the layers split that far) and, under
  torchtitan, the zero-bubble ``zbv`` are tried (the reference stack runs
  zbv when it is pinned: headroom.core.specs.stack's ``zero_bubble``). Pinned stage layers pin pp to their count and the schedule to
  1f1b.
- cp splits the sequence into 2 x cp balanced chunks (x tp under sp).
- dp is what is left; it must divide the global batch. The sharding stage is
  tried from 0 to 3 when there is more than one data-parallel rank.
- a mixture of experts is tried on data, context and expert parallelism
  (tp 1, pp 1), ep every divisor of dp x cp that divides its experts: ep
  trades all-to-all traffic for experts' weights held on fewer ranks, so
  neither end dominates. Latent attention is tried on data and context
  parallelism. Their tensor and pipeline parallelism are not modelled yet.
- a stack without tensor parallelism (``hf-liger``, headroom.core.specs.stack) is tried at tp 1,
  one without a pipeline (``hf``, ``hf-liger``) at pp 1, and one without
  sequence parallelism (``hf``) with sp off.

An axis the user pinned (``--tp 2``) takes only that value. A pinned data-parallel setting
(``--reshard-after-forward``, ``--defer-gradient-sync``) is carried into every layout it applies to: the first
only at zero 3 and where its k divides the sharding ranks, the second at zero 0 and 3,
``--overlap-grad-reduce`` at zero 0-2 and ``--overlap-param-gather`` at zero 1-2; ``--tp-overlap on``
into the layouts with sequence parallelism (the others run without it), ``--cp-comm`` into those with cp > 1,
``--ep-overlap on`` and ``--ep-comm`` into those with ep > 1.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import fields, replace

from headroom.core.divisors import divisors
from headroom.core.errors import ConfigError
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.layout import (
    OVERLAP_STAGES,
    Layout,
    shard_fits,
    sharding_groups,
)
from headroom.core.specs.model import ModelSpec
from headroom.core.specs.stack import get_stack
from headroom.core.specs.stages import stage_layers

PINNABLE: tuple[str, ...] = tuple(f.name for f in fields(Layout))


def pinned_layout(values: Mapping[str, object], fsdp: bool = False, sharded: bool = False) -> Layout:
    """The layout a search request carries: the pinned axes' ``values``, the others the Layout's defaults, which
    the search ignores. An unpinned dp holds a pinned ep, which must divide dp x cp; a pinned
    reshard-after-forward holds zero 3 and, for a shard over k ranks, 2k ranks to keep it over; a tp-overlap
    on, the sequence parallelism it needs; ``fsdp`` (the configuration runs only under FSDP: an FP8 recipe under
    amp-bf16, headroom.core.specs.float8), zero 3; ``sharded`` (Megatron's fp8 parameters, which need its
    distributed optimizer), zero 1 (the search drops each layout the configuration does not run on)."""
    held = dict(values)
    if fsdp:
        held.setdefault("zero", 3)
    if sharded:
        held.setdefault("zero", 1)
    if held.get("cp_comm"):
        held.setdefault("cp", 2)
    if held.get("tp_overlap"):
        held.setdefault("sp", True)
        held.setdefault("tp", 2)
    if held.get("ep_overlap") or held.get("ep_comm"):
        held.setdefault("ep", 2)
    if held.get("ep", 1) > 1 and "dp" not in held:  # ep 1 (an export's held axis) divides any dp
        held["dp"] = held["ep"]
    if held.get("overlap_param_gather") is not None:
        held.setdefault("zero", 1)
    kept = held.get("reshard_after_forward")
    if kept is not None:  # FSDP's setting, checked against the ranks of each layout tried
        held.setdefault("zero", 3)
        if not isinstance(kept, bool) and "dp" not in held:
            held["dp"] = 2 * kept // math.gcd(2 * kept, held.get("cp", 1))
    return Layout(**held)  # type: ignore[arg-type]


def candidate_layouts(spec: ModelSpec, train: TrainConfig, global_batch: int, gpus: int, gpus_per_node: int,
                      pinned: frozenset[str]) -> list[Layout]:
    """Every layout over exactly ``gpus`` GPUs that the model, sequence and batch can be split by."""
    fixed = train.layout
    unknown = pinned - set(PINNABLE)
    if unknown:
        raise ConfigError(f"cannot pin {', '.join(sorted(unknown))}; pinnable: {', '.join(PINNABLE)}")
    world = 1
    for axis in ("tp", "pp", "cp", "dp"):
        world *= getattr(fixed, axis) if axis in pinned else 1
    if gpus % world:
        raise ConfigError(f"--gpus {gpus} is not a multiple of the pinned axes' product {world}; "
                          f"use a multiple of {world} GPUs")
    layouts = [
        layout for layout in _layouts(spec, train, gpus, gpus_per_node, pinned)
        if global_batch % layout.dp == 0 and _runs(train, layout)
    ]
    if not layouts:
        raise ConfigError(
            f"no layout of {gpus} GPUs splits {spec.name} (its {spec.n_heads} heads, {spec.n_kv_heads} kv heads, "
            f"{spec.n_layers} layers), seq-len {train.seq_len} and global batch {global_batch}"
            + (f" with {', '.join(sorted(pinned))} pinned" if pinned else "")
            + "; try a global batch divisible by more GPU counts, or fewer pinned axes"
        )
    return layouts


def _layouts(spec: ModelSpec, train: TrainConfig, gpus: int, gpus_per_node: int,
             pinned: frozenset[str]) -> Iterator[Layout]:
    fixed = train.layout

    def choices(axis: str, options: list[int]) -> list[int]:
        return [getattr(fixed, axis)] if axis in pinned else options

    dense = not (spec.is_moe or spec.is_mla)
    stack = get_stack(train.stack)
    splits_layers = dense and stack.tensor_parallel
    pipelines = dense and stack.pipeline_parallel
    for tp in choices("tp", [t for t in divisors(gpus) if t <= gpus_per_node and (splits_layers or t == 1)
                             and spec.n_heads % t == 0 and spec.n_kv_heads % t == 0]):
        if gpus % tp:
            continue
        for pp in choices("pp", [p for p in divisors(gpus // tp) if (pipelines or p == 1)
                                 and _splits(spec, train, Layout(pp=p))]):
            if (gpus // tp) % pp:
                continue
            for cp in choices("cp", divisors(gpus // (tp * pp))):
                if (gpus // (tp * pp)) % cp:
                    continue
                dp = gpus // (tp * pp * cp)
                if "dp" in pinned and dp != fixed.dp:
                    continue
                yield from _variants(spec, train, tp, pp, cp, dp, pinned)


def _runs(train: TrainConfig, layout: Layout) -> bool:
    """The configuration holds on the layout: an FP8 recipe under amp-bf16 runs only under FSDP's mixed
    precision, Megatron's fp8 parameters only under its distributed optimizer (TrainConfig's checks decide; other
    configurations hold on every layout the search makes)."""
    if train.float8 is None:
        return True
    try:
        replace(train, layout=layout).check_sharding()
    except ConfigError:
        return False
    return True


def _splits(spec: ModelSpec, train: TrainConfig, layout: Layout) -> bool:
    """The stack can split the model's layers over the layout's pipeline (headroom.core.specs.stages), or the
    pinned stage layers apply to it."""
    given = train.layout.stage_layers
    try:
        if given is not None:  # a count a stage, each divisible by the chunks under interleaving (Layout's check)
            return layout.pp == len(given) and replace(layout, stage_layers=given).stage_layers == given
        stage_layers(layout, spec.n_layers, train.stack)
    except ConfigError:
        return False
    return True


def _variants(spec: ModelSpec, train: TrainConfig, tp: int, pp: int, cp: int, dp: int,
              pinned: frozenset[str]) -> Iterator[Layout]:
    fixed, stack = train.layout, get_stack(train.stack)
    sp = fixed.sp if "sp" in pinned else tp > 1 and stack.sequence_parallel
    if sp and tp == 1:
        return
    if "schedule" in pinned or "virtual_stages" in pinned or "stage_layers" in pinned:
        schedules = [(fixed.schedule, fixed.virtual_stages)] if pp > 1 else [("1f1b", 1)]
    else:
        zbv = [("zbv", 2)] if stack.zero_bubble == "searched" else []
        schedules = [("1f1b", 1), ("interleaved", 2), *zbv] if pp > 1 else [("1f1b", 1)]
    # for the depths whose layers split that far
    schedules = [(schedule, v) for schedule, v in schedules
                 if pp == 1 or _splits(spec, train, Layout(pp=pp, schedule=schedule, virtual_stages=v))]
    zeros = [fixed.zero] if "zero" in pinned else (list(stack.sharding_stages) if dp * cp > 1 else [0])
    settings = {name: getattr(fixed, name) for name in ("reshard_after_forward", "defer_gradient_sync", "stage_layers")
                if name in pinned and (name != "stage_layers" or pp == len(fixed.stage_layers))}
    if "tp_overlap" in pinned and (sp or not fixed.tp_overlap):  # on: only where sequence parallelism runs
        settings["tp_overlap"] = fixed.tp_overlap
    if "cp_comm" in pinned and cp > 1:
        settings["cp_comm"] = fixed.cp_comm
    if "ep_overlap" in pinned:  # on: only where experts are split (`_variants`' ep loop drops it at ep 1)
        settings["ep_overlap"] = fixed.ep_overlap
    if "ep_comm" in pinned:  # only where experts are split, as ep_overlap
        settings["ep_comm"] = fixed.ep_comm
    kept = settings.get("reshard_after_forward", True)
    if "reshard_after_forward" in settings:  # FSDP's setting: only its stage
        zeros = [z for z in zeros if z == 3]
    if "defer_gradient_sync" in settings:  # DDP's or FSDP's setting, ZeroRedundancyOptimizer's DDP too
        zeros = [z for z in zeros if z in (0, 3) or (z == 1 and stack.zero_optimizer)]
    for name, stages in OVERLAP_STAGES.items():
        if name in pinned:  # only at the sharding stages it applies to
            settings[name] = getattr(fixed, name)
            zeros = [z for z in zeros if z in stages]
    if "overlap_param_gather" in pinned and stack.zero_optimizer:  # broadcast in the step
        zeros = [z for z in zeros if z != 1]
    shardings: list[tuple[int, dict[str, object]]] = [(zero, {}) for zero in zeros]
    if 3 in zeros and stack.fsdp_zero2 and "reshard_after_forward" not in settings and dp * cp > 1 \
            and (pp == 1 or stack.fsdp_reshards_under_pipeline):  # its ZeRO-2: FSDP kept gathered, SHARD_GRAD_OP
        shardings.append((3, {"reshard_after_forward": False}))
    if "ep" in pinned:
        eps = [fixed.ep] if (dp * cp) % fixed.ep == 0 else []
    else:
        eps = [e for e in divisors(dp * cp) if spec.n_experts % e == 0] if spec.is_moe else [1]
    split = (2 * cp if cp > 1 else 1) * (tp if sp else 1)
    # Ring attention needs flash attention without an explicit mask (transformers' sliding-window layers).
    ring = train.attention == "flash" and not train.sdpa_masked(spec)
    if train.seq_len % split or (cp > 1 and not ring):
        return
    for schedule, v in schedules:
        for zero, sharding in shardings:
            for ep in eps:
                if ep > 1 and zero in (1, 2) and stack.deepspeed_zero:
                    continue  # DeepSpeed's ZeRO-1 and 2 know no transformers experts (TrainConfig.check_sharding)
                if not isinstance(kept, bool) and not shard_fits(kept, sharding_groups(dp, cp, ep)):
                    continue  # no shard can be kept over k of these ranks
                here = settings if ep > 1 or not (settings.get("ep_overlap") or settings.get("ep_comm")) else \
                    {name: value for name, value in settings.items() if name not in ("ep_overlap", "ep_comm")}
                yield Layout(tp=tp, sp=sp, pp=pp, schedule=schedule, virtual_stages=v, cp=cp, dp=dp, zero=zero, ep=ep,
                             **here, **sharding)
