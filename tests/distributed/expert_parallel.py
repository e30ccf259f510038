"""Expert parallelism on gloo ranks: the collectives of a training step whose routed experts are split over the
ranks, checked against headroom.core.timing.comm's ``ep`` terms.

Each rank holds ``n_experts / ep`` of each mixture-of-experts block's routed experts (headroom.agent.model.Experts; the
router, attention and everything else replicated, as a data-parallel rank holds them) and trains its own
tokens. The tokens go to their experts' ranks and back the way torchtitan's all-to-all token dispatcher sends
them (``AllToAllTokenDispatcher`` in torchtitan/models/common/token_dispatcher.py, and its grouped experts in
models/common/moe.py):

- the (token, choice) rows are sorted by expert, each rank's tokens-per-expert counts are exchanged (an
  all-to-all of ``n_experts`` integers, outside autograd) and the rows are dispatched by an all-to-all;
- each local expert runs on the rows it received, its output cast back to their dtype (torchtitan's
  ``type_as``), and the outputs return by a second all-to-all;
- each row is scaled by its routing weight and added into its token's output.

Backward runs both all-to-alls again, the other way. The data-parallel gradient reductions are not run here:
this measures the expert-parallel traffic alone.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single_autograd

from headroom.agent.bench_train import forward_loss
from headroom.agent.ledger_check import build
from headroom.agent.model import Experts
from headroom.core.specs.config import TrainConfig
from headroom.core.specs.presets import get_preset
from headroom.core.specs.recompute import parse_policy
from tests.distributed.collectives import step_collectives

SPEC = dataclasses.replace(get_preset("bench-llama-tiny"), name="ep-tiny", n_layers=2, n_experts=4,
                           experts_per_token=2, expert_ffn_hidden=64)
"""Two mixture-of-experts blocks of 4 experts, 2 chosen a token: 2 experts a rank over 2 ranks."""
SEQ_LEN, MICRO_BATCH = 32, 2
PRECISIONS = ("bf16-pure", "amp-bf16")
POLICIES = ("none", "full")
STACKS = ("reference", "torchtitan")


class ExpertParallelExperts(nn.Module):
    """``experts``' router and shared expert, and this rank's slice of its routed experts, fed by all-to-all."""

    def __init__(self, experts: Experts, group: dist.ProcessGroup) -> None:
        super().__init__()
        ep, rank, n = group.size(), group.rank(), len(experts.experts)
        if n % ep:
            raise ValueError(f"{n} routed experts do not split over {ep} expert-parallel ranks")
        if experts.spec.capacity_factor:
            raise ValueError("expert parallelism here is dropless: leave the capacity factor out")
        self.group, self.ep, self.n_experts, self.per_rank = group, ep, n, n // ep
        self.local = nn.ModuleList(experts.experts[rank * self.per_rank:(rank + 1) * self.per_rank])
        experts.experts = nn.ModuleList()  # the other ranks' experts
        self.routing = experts  # its router, its routing rules and its shared expert

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, chosen = self.routing.route(flat)
        k = chosen.shape[1]
        order = chosen.flatten().argsort(stable=True)  # (token, choice) rows by expert
        token = order // k
        counts = torch.bincount(chosen.flatten(), minlength=self.n_experts)
        received = torch.empty_like(counts)
        dist.all_to_all_single(received, counts, group=self.group)
        by_source = received.view(self.ep, self.per_rank)  # [source rank, local expert]
        sent_rows = counts.view(self.ep, self.per_rank).sum(1).tolist()
        received_rows = by_source.sum(1).tolist()
        rows = all_to_all_single_autograd(flat[token], received_rows, sent_rows, self.group)

        # Received by source rank, then expert: group them by expert, run each, put them back in place.
        expert_of_row = torch.arange(self.per_rank).repeat(self.ep).repeat_interleave(received)
        by_expert = expert_of_row.argsort(stable=True)
        sizes = by_source.sum(0).tolist()
        outputs = [expert(part).type_as(rows) for expert, part in zip(self.local, rows[by_expert].split(sizes),
                                                                      strict=True)]
        back = torch.cat(outputs)[by_expert.argsort()]

        returned = all_to_all_single_autograd(back, sent_rows, received_rows, self.group)
        scored = (returned.float() * weights.flatten()[order].unsqueeze(-1)).to(flat.dtype)
        routed = flat.new_zeros(flat.shape).index_add(0, token, scored)
        return self.routing.with_shared(routed, flat).view(x.shape)


def config(precision: str, policy: str, stack: str) -> TrainConfig:
    return TrainConfig(seq_len=SEQ_LEN, micro_batch=MICRO_BATCH, attention="flash", precision=precision,
                       recompute=parse_policy(policy), stack=stack)


def case_name(precision: str, stack: str, policy: str) -> str:
    return f"{precision}/{stack}/{policy}"


def measure() -> dict:
    """This rank's step collectives (tests/distributed/collectives.py), by ``case_name``: every rank starts from
    the same weights and trains its own tokens."""
    group, rank = dist.group.WORLD, dist.get_rank()
    generator = torch.Generator().manual_seed(100 + rank)
    tokens, targets = (torch.randint(0, SPEC.vocab_size, (MICRO_BATCH, SEQ_LEN), generator=generator)
                       for _ in range(2))
    measured = {}
    for precision in PRECISIONS:
        for stack in STACKS:
            for policy in POLICIES:
                model, _, _ = build(SPEC, config(precision, policy, stack), "cpu", seed=0)
                for block in model.blocks:
                    block.mlp = ExpertParallelExperts(block.mlp, group)
                measured[case_name(precision, stack, policy)] = step_collectives(
                    functools.partial(forward_loss, model, tokens, targets, precision))[1]
    return measured
