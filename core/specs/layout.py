"""Layout: how a training run is spread over GPUs.

Five parallel axes and a sharding stage, multiplied out as

    world = tp x pp x cp x dp

- ``tp`` tensor parallelism (Megatron, Shoeybi et al. 2019): each rank holds
  1/tp of every attention head group and MLP width; ``sp`` (sequence
  parallelism, Korthikanti et al. 2022) also splits the norms, dropouts and
  residual stream along the sequence between the tensor-parallel ranks.
- ``pp`` pipeline parallelism: each rank holds a stage of the blocks (in
  ``virtual_stages`` chunks under the ``interleaved`` schedule, in two chunks
  placed in a V under ``zbv``, the zero-bubble schedule of
  headroom.core.specs.schedule_order); ``1f1b`` and ``gpipe`` keep one chunk
  per rank. ``stage_layers`` gives each stage's
  count; left None, the stack splits them (headroom.core.specs.stages).
- ``cp`` context parallelism: ring attention over the sequence; each rank
  holds ``seq_len / cp`` tokens and gets the others' K/V (``cp_comm``).
- ``dp`` data parallelism, with ``zero`` the sharding stage over those ranks:
  0 none (DDP), 1 optimizer state, 2 + gradients, 3 + parameters (FSDP).
- ``ep`` expert parallelism (a mixture of experts): the routed experts split
  over ``ep`` of the dp x cp ranks, which hold the same other weights and
  send each token to its experts' ranks by all-to-all. It borrows ranks
  rather than adding any (torchtitan's ``expert_parallel_degree``, Megatron's
  ``--expert-model-parallel-size``), so it must divide dp x cp; the experts'
  weights are then sharded and their gradients reduced over the other
  dp x cp / ep ranks (torchtitan's ``efsdp`` mesh, Megatron's expert
  data-parallel group).

``cp_comm`` (cp > 1): how ring attention brings each rank the others' keys and values: ``ring`` passes
them rank to rank, cp - 1 hops a layer, each beside one chunk's attention; ``all-gather`` gathers them
once a layer (headroom.core.specs.stack: torch's context parallelism gathers by default, Megatron-LM passes
them); None: the stack's default.

``ep_comm`` (ep > 1): how expert-parallel ranks send tokens to their experts across nodes: ``all-to-all``,
``deepep`` or ``hybridep`` (each token once to each other node its experts are on, then over NVLink:
headroom.core.timing.expert_dispatch); None: the stack's default, an all-to-all.

``tp_overlap`` (tp with sp): the tensor-parallel all-gathers and reduce-scatters of each block's linears
run in pieces beside the matrix multiplications they feed or drain, rather than before and after them
(Megatron-LM's ``--tp-comm-overlap``, torchtitan's async tensor parallelism); None: the stack's default, off.

``ep_overlap`` (ep > 1): the experts' all-to-alls of one micro-batch run beside another micro-batch's compute
(Megatron-LM's ``--overlap-moe-expert-parallel-comm``, its combined 1F1B schedule); None: the stack's default,
off.

Two settings say how the data-parallel ranks run (headroom.core.specs.data_parallel resolves them, each
stack's default when left None):

- ``reshard_after_forward`` (zero 3): FSDP2's argument of that name. True frees a
  unit's gathered parameters after its forward and gathers them again for its
  backward; False keeps them from forward to backward; an integer k keeps a
  1/k shard of them, gathered again in backward over k ranks (a node's GPUs).
- ``defer_gradient_sync`` (zero 0 and 3, and zero 1 where it is DDP under
  torch's ZeroRedundancyOptimizer: headroom.core.specs.stack.Stack.zero_optimizer):
  the gradients are reduced once per optimizer step, in the last micro-batch's
  backward, and kept unreduced between (DDP's ``no_sync``, FSDP2's
  ``set_requires_gradient_sync(False)``), rather than every micro-batch.
- ``overlap_grad_reduce`` (zero 0, 1 and 2): the gradients are reduced bucket
  by bucket while backward still runs, rather than after it (Megatron-LM's
  ``--overlap-grad-reduce``).
- ``overlap_param_gather`` (zero 1 and 2): the updated parameters are gathered
  bucket by bucket during the next step's forward, rather than after the
  optimizer step (Megatron-LM's ``--overlap-param-gather``).

`Layout.check` names the first size that does not divide, and what would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from headroom.core.divisors import divisors, divisors_near
from headroom.core.errors import ConfigError

MAX_GPUS = 2**20
"""GPUs a layout may span at most (tp x pp x cp x dp): a million, beyond any cluster built. Bounded so that no
size that follows from a layout (its ranks, the divisors an error suggests) is beyond reach."""

Schedule = Literal["1f1b", "interleaved", "gpipe", "zbv"]
SCHEDULES: tuple[str, ...] = ("1f1b", "interleaved", "gpipe", "zbv")
MULTI_CHUNK: dict[str, int | None] = {"interleaved": None, "zbv": 2}
"""The schedules that put more than one chunk on a rank, and how many they put (None: ``virtual_stages``, 2 or
more)."""
AXES: tuple[str, ...] = ("tp", "pp", "cp", "dp")
OVERLAP_STAGES: dict[str, tuple[int, ...]] = {"overlap_grad_reduce": (0, 1, 2), "overlap_param_gather": (1, 2)}
"""The sharding stages each data-parallel overlap setting applies to: FSDP (zero 3) reduces its gradients in
backward on its own, and only ZeRO-1 and 2 gather the updated parameters after the optimizer step."""
SWITCHES: tuple[str, ...] = ("sp", "defer_gradient_sync", "overlap_grad_reduce", "overlap_param_gather", "tp_overlap",
                              "ep_overlap")
"""The Layout fields that are on or off (True or False; None where left to the stack)."""
CP_COMMS: tuple[str, ...] = ("ring", "all-gather")
"""How context-parallel ranks exchange keys and values (headroom.core.timing.comm)."""
EP_COMMS: tuple[str, ...] = ("all-to-all", "deepep", "hybridep")
"""How expert-parallel ranks exchange tokens (headroom.core.timing.expert_dispatch)."""


def _positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def sharding_groups(dp: int, cp: int, ep: int) -> dict[str, int]:
    """The ranks that shard FSDP's parameters, by name: dp x cp, and under expert parallelism dp x cp / ep for
    the experts' weights."""
    return {"dp x cp": dp * cp} | ({"dp x cp / ep": dp * cp // ep} if ep > 1 else {})


def shard_fits(k: int, groups: dict[str, int]) -> bool:
    """A shard can be kept over k ranks of each group (``reshard_after_forward=k``): k above 1, below the
    group's ranks and dividing them."""
    return all(1 < k < n and n % k == 0 for n in groups.values())


@dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    tp: int = 1
    """Tensor-parallel ranks."""
    sp: bool = False
    """Sequence parallelism between the tensor-parallel ranks (needs tp > 1)."""
    pp: int = 1
    """Pipeline stages."""
    schedule: Schedule = "1f1b"
    """Pipeline schedule: ``1f1b``, ``interleaved`` (``virtual_stages`` chunks per rank), ``gpipe`` or ``zbv``
    (zero-bubble ZB-V: two chunks per rank in a V)."""
    virtual_stages: int = 1
    """Model chunks per pipeline rank v: 2 or more under ``interleaved``, 2 under ``zbv``, else 1."""
    cp: int = 1
    """Context-parallel ranks (ring attention)."""
    dp: int = 1
    """Data-parallel ranks."""
    zero: int = 0
    """Sharding stage over the data-parallel ranks: 0 none, 1 optimizer, 2 +gradients, 3 +parameters."""
    ep: int = 1
    """Expert-parallel ranks: a mixture of experts' routed experts split over ep of the dp x cp ranks."""
    reshard_after_forward: bool | int | None = None
    """FSDP (zero 3): True, False or k ranks to keep a shard over between a unit's forward and backward;
    None: the stack's default."""
    defer_gradient_sync: bool | None = None
    """Zero 0 and 3: reduce gradients in the last micro-batch's backward only; None: the stack's default."""
    overlap_grad_reduce: bool | None = None
    """Zero 0-2: reduce gradients while backward runs; None: the stack's default."""
    overlap_param_gather: bool | None = None
    """Zero 1-2: gather the updated parameters during the next forward; None: the stack's default."""
    cp_comm: Literal["ring", "all-gather"] | None = None
    """Context parallelism: ``ring`` or ``all-gather`` keys and values; None: the stack's default."""
    tp_overlap: bool | None = None
    """Tensor parallelism (with sp): overlap each block's collectives with its GEMMs; None: the stack's default
    (off in every stack)."""
    ep_overlap: bool | None = None
    """Expert parallelism: run one micro-batch's all-to-alls beside another's compute; None: the stack's default
    (off in every stack)."""
    ep_comm: Literal["all-to-all", "deepep", "hybridep"] | None = None
    """Expert parallelism: ``all-to-all``, ``deepep`` or ``hybridep`` token dispatch; None: the stack's default
    (an all-to-all in every stack)."""
    stage_layers: tuple[int, ...] | None = None
    """Blocks on each pipeline stage, first to last (1f1b and gpipe); None: the stack's split
    (headroom.core.specs.stages)."""

    def __post_init__(self) -> None:
        for axis in (*AXES, "virtual_stages", "ep"):
            _positive(axis.replace("_", "-"), getattr(self, axis))
        if self.world > MAX_GPUS:
            raise ConfigError(f"layout {self} spans {self.world:,} GPUs (tp x pp x cp x dp), beyond any cluster "
                              f"(at most {MAX_GPUS:,})")
        if self.zero not in (0, 1, 2, 3) or isinstance(self.zero, bool):
            raise ConfigError(f"zero (sharding stage) must be 0, 1, 2 or 3, got {self.zero!r}")
        if self.sp not in (True, False):
            raise ConfigError(f"sp (sequence parallelism) must be on or off, got {self.sp!r}")
        if (self.dp * self.cp) % self.ep:
            raise ConfigError(f"ep {self.ep} does not divide dp x cp = {self.dp * self.cp}: expert-parallel ranks are "
                              f"data- or context-parallel ranks that split the experts; use --ep among "
                              f"{divisors_near(self.dp * self.cp, self.ep)}")
        if self.sp and self.tp == 1:
            raise ConfigError("sequence parallelism splits work between tensor-parallel ranks: it needs tp > 1")
        self._check_data_parallel_settings()
        if self.cp_comm is not None and self.cp_comm not in CP_COMMS:
            raise ConfigError(f"cp-comm must be one of {', '.join(CP_COMMS)}, got {self.cp_comm!r}")
        if self.cp_comm is not None and self.cp == 1:
            raise ConfigError(f"cp-comm {self.cp_comm} says how context-parallel ranks exchange keys and values: it "
                              "needs cp > 1")
        if self.tp_overlap is not None and not isinstance(self.tp_overlap, bool):
            raise ConfigError(f"tp-overlap must be on or off, got {self.tp_overlap!r}")
        if self.tp_overlap and not self.sp:
            raise ConfigError("tp-overlap overlaps the all-gathers and reduce-scatters of sequence parallelism with "
                              "the GEMMs they feed: it needs tp > 1 with --sp on")
        if self.ep_comm is not None and self.ep_comm not in EP_COMMS:
            raise ConfigError(f"ep-comm must be one of {', '.join(EP_COMMS)}, got {self.ep_comm!r}")
        if self.ep_comm is not None and self.ep == 1:
            raise ConfigError(f"ep-comm {self.ep_comm} says how expert-parallel ranks exchange tokens: it needs ep > 1")
        if self.ep_overlap is not None and not isinstance(self.ep_overlap, bool):
            raise ConfigError(f"ep-overlap must be on or off, got {self.ep_overlap!r}")
        if self.ep_overlap and self.ep == 1:
            raise ConfigError("ep-overlap runs the experts' all-to-alls beside another micro-batch's compute: it needs "
                              "ep > 1")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"pipeline schedule {self.schedule!r} is not one of {', '.join(SCHEDULES)}")
        if self.schedule == "interleaved" and self.virtual_stages < 2:
            raise ConfigError("the interleaved schedule needs virtual-stages >= 2 (model chunks per pipeline rank)")
        if self.schedule == "zbv" and self.virtual_stages != 2:
            raise ConfigError(f"the zbv schedule puts 2 model chunks on each pipeline rank, not virtual-stages "
                              f"{self.virtual_stages}: use --virtual-stages 2 or leave it out")
        if self.schedule not in MULTI_CHUNK and self.virtual_stages != 1:
            raise ConfigError(f"virtual-stages {self.virtual_stages} needs the interleaved schedule, not {self.schedule}")
        self._check_stage_layers()

    def _check_stage_layers(self) -> None:
        given = self.stage_layers
        if given is None:
            return
        if isinstance(given, list):
            object.__setattr__(self, "stage_layers", given := tuple(given))
        if not isinstance(given, tuple) or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in given):
            raise ConfigError(f"stage layers must be a count of blocks per pipeline stage, e.g. 7,8,8,7; got {given!r}")
        if self.pp == 1 or len(given) != self.pp:
            raise ConfigError(f"stage layers {','.join(map(str, given))} give {len(given)} stage(s) for pp {self.pp}: "
                              f"give one count per stage" + ("" if self.pp > 1 else ", with --pp above 1"))
        if self.schedule == "zbv":
            raise ConfigError("stage layers apply to the 1f1b, gpipe and interleaved schedules; the zbv schedule "
                              "splits the layers over its chunks itself: leave stage layers out")
        if self.schedule == "interleaved" and any(n % self.virtual_stages for n in given):
            raise ConfigError(f"stage layers {','.join(map(str, given))} under the interleaved schedule: each stage's "
                              f"blocks split evenly over its {self.virtual_stages} chunks (Megatron-LM's uneven "
                              f"split with virtual stages), so give counts divisible by {self.virtual_stages}")
        if not all(given[1:-1]):
            raise ConfigError(f"stage layers {','.join(map(str, given))}: a middle stage holds at least one block "
                              "(the first and last may hold only the embedding or the head)")

    def _check_data_parallel_settings(self) -> None:
        reshard, defer = self.reshard_after_forward, self.defer_gradient_sync
        if reshard is not None:
            if not isinstance(reshard, int):  # bool is an int
                raise ConfigError(f"reshard-after-forward must be true, false or a number of ranks, got {reshard!r}")
            if self.zero != 3:
                raise ConfigError(f"reshard-after-forward is FSDP's setting and needs zero 3 (parameters sharded), "
                                  f"not zero {self.zero}")
            groups = sharding_groups(self.dp, self.cp, self.ep)
            if not isinstance(reshard, bool) and not shard_fits(reshard, groups):
                bad = [f"{name} = {n}" for name, n in groups.items() if not shard_fits(reshard, {name: n})]
                fits = [d for d in divisors(min(groups.values())) if shard_fits(d, groups)]
                raise ConfigError(
                    f"reshard-after-forward {reshard}: a shard kept over k ranks needs k above 1, below the "
                    f"ranks that shard the parameters and dividing them ({', '.join(bad)}); use true, false"
                    + (f" or one of {', '.join(map(str, fits))}" if fits else ""))
        why = {"overlap_grad_reduce": "FSDP (zero 3) reduces its gradients in backward on its own",
               "overlap_param_gather": "only ZeRO-1 and 2 gather the updated parameters after the optimizer step"}
        for name, stages in OVERLAP_STAGES.items():
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise ConfigError(f"{name.replace('_', '-')} must be on or off, got {value!r}")
            if value is not None and self.zero not in stages:
                raise ConfigError(f"{name.replace('_', '-')} applies to zero {', '.join(map(str, stages))}, not zero "
                                  f"{self.zero}: {why[name]}; leave it out")
        if defer is not None:
            if not isinstance(defer, bool):
                raise ConfigError(f"defer-gradient-sync must be true or false, got {defer!r}")
            if self.zero == 2:  # zero 1 hangs on the stack (TrainConfig.check_sharding)
                raise ConfigError("defer-gradient-sync applies to zero 0 (DDP) and zero 3 (FSDP); zero 2 reduces "
                                  "gradients every micro-batch (it keeps only its shard): leave it out")

    @property
    def world(self) -> int:
        """GPUs the layout occupies: tp x pp x cp x dp."""
        return self.tp * self.pp * self.cp * self.dp

    @property
    def expert_data_parallel(self) -> int:
        """Ranks that hold the same experts, and shard and reduce their weights: dp x cp / ep."""
        return self.dp * self.cp // self.ep

    def fewest_data_parallel(self) -> Layout:
        """This layout with the fewest data-parallel ranks its expert parallelism allows (ep must divide
        dp x cp), without its settings of when ranks communicate and how experts' tokens cross nodes (not how
        context parallelism exchanges keys and values: that changes what a rank holds): what one rank's shapes are
        the same under, whatever dp is and however its ranks sync, overlap and dispatch. Never spans more GPUs than this."""
        return replace(self, dp=self.ep // math.gcd(self.ep, self.cp), reshard_after_forward=None,
                       defer_gradient_sync=None, tp_overlap=None, overlap_grad_reduce=None,
                       overlap_param_gather=None, ep_overlap=None, ep_comm=None)

    @property
    def model_parallel(self) -> int:
        """Ranks that share one model replica's parameters: tp x pp."""
        return self.tp * self.pp

    @property
    def chunks(self) -> int:
        """Pipeline chunks the model's layers split into: pp x virtual stages."""
        return self.pp * self.virtual_stages

    def __str__(self) -> str:
        parts = [f"tp {self.tp}" + (" +sp" if self.sp else "")]
        if self.pp > 1:
            schedule = f"interleaved x{self.virtual_stages}" if self.schedule == "interleaved" else self.schedule
            stages = f", stages {split_text(self.stage_layers)}" if self.stage_layers is not None else ""
            parts.append(f"pp {self.pp} ({schedule}{stages})")
        else:
            parts.append("pp 1")
        parts += [f"cp {self.cp}", f"dp {self.dp}", f"zero {self.zero}"]
        if self.ep > 1:
            parts.append(f"ep {self.ep}")
        if self.reshard_after_forward is not None:
            parts.append({True: "reshard", False: "no reshard"}.get(self.reshard_after_forward,
                                                                     f"reshard to {self.reshard_after_forward}"))
        if self.cp_comm is not None:
            parts.append(f"cp by {self.cp_comm}")
        if self.tp_overlap is not None:
            parts.append("tp overlapped" if self.tp_overlap else "tp not overlapped")
        if self.ep_overlap is not None:
            parts.append("ep overlapped" if self.ep_overlap else "ep not overlapped")
        if self.ep_comm is not None:
            parts.append(f"ep by {self.ep_comm}")
        if self.defer_gradient_sync is not None:
            parts.append("gradients synced " + ("once" if self.defer_gradient_sync else "every micro-batch"))
        if self.overlap_grad_reduce is not None:
            parts.append("gradient reduce " + ("overlapped" if self.overlap_grad_reduce else "after backward"))
        if self.overlap_param_gather is not None:
            parts.append("parameter gather " + ("overlapped" if self.overlap_param_gather else "after the step"))
        return ", ".join(parts)

    def check_model(self, name: str, *, n_heads: int, n_kv_heads: int, seq_len: int) -> None:
        """Reject a layout the model cannot be split by: heads by tp, sequence by cp (its layers over the
        pipeline: headroom.core.specs.stages)."""
        if n_heads % self.tp:
            raise ConfigError(f"{name}: its {n_heads} attention heads do not split over tp {self.tp}; "
                              f"use --tp among {divisors_near(n_heads, self.tp)}")
        if n_kv_heads % self.tp:
            raise ConfigError(f"{name}: its {n_kv_heads} key/value heads do not split over tp {self.tp}; "
                              f"use --tp among {divisors_near(n_kv_heads, self.tp)}")
        # Ring attention with causal load balancing splits each sequence into 2 x cp chunks; sequence
        # parallelism then splits each rank's tokens over the tensor-parallel ranks.
        split = (2 * self.cp if self.cp > 1 else 1) * (self.tp if self.sp else 1)
        if seq_len % split:
            why = " x ".join(w for w in ("2 x cp" if self.cp > 1 else "", "tp (sequence parallel)" if self.sp else "") if w)
            raise ConfigError(f"seq-len {seq_len} does not split into {why} = {split} equal parts; "
                              f"use a seq-len divisible by {split}")

    def check_batch(self, global_batch: int) -> None:
        """The global batch must split evenly over the data-parallel ranks."""
        if global_batch % self.dp:
            raise ConfigError(
                f"global batch {global_batch} does not split over {self.dp} data-parallel ranks; "
                f"use --dp among {divisors_near(global_batch, self.dp)}, or a global batch divisible by {self.dp}"
            )


def split_text(layers: tuple[int, ...]) -> str:
    """"7/8x14/7": each pipeline stage's blocks, runs of equal counts folded."""
    runs: list[list[int]] = []
    for n in layers:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return "/".join(f"{n}x{k}" if k > 1 else str(n) for n, k in runs)


SINGLE = Layout()
"""One GPU: no parallelism."""
