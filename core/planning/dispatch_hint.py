"""What DeepEP would change in a plan whose experts' tokens cross nodes by all-to-all.

A recommendation with expert parallelism across nodes, on a stack that can dispatch by DeepEP or HybridEP
(headroom.core.specs.stack.Stack.hierarchical_dispatch) and left to its default all-to-all, is evaluated again with
``--ep-comm deepep`` (headroom.core.timing.expert_dispatch): where that is faster, the plan says by how much, so that
a planner sees what the dispatcher is worth before choosing to install it. The layout search does not try it on its
own: DeepEP is a library to install, not a setting every cluster has.
"""

from __future__ import annotations

from dataclasses import replace

from headroom.core.errors import ConfigError
from headroom.core.planning.planner import NEAR, Plan, evaluate
from headroom.core.specs.stack import get_stack
from headroom.core.timing.comm import crosses_nodes


def dispatch_hint(result: Plan) -> str | None:
    """One sentence: the recommendation's expert traffic across nodes by all-to-all, and its step by DeepEP, the
    recommendation's own configuration but for the dispatcher; None where there is nothing to say (no
    recommendation, no experts across nodes, a dispatcher already chosen, a stack without DeepEP, a capacity factor,
    which DeepEP's dropless dispatch cannot keep, or no gain beyond the search's near tie)."""
    best = result.recommendation
    if best is None:
        return None
    layout, train, request = best.layout, best.config, result.request
    if layout.ep == 1 or layout.ep_comm is not None or not get_stack(train.stack).hierarchical_dispatch \
            or request.spec.capacity_factor:
        return None
    if not crosses_nodes("ep", layout, request.cluster_for(result.profile)):
        return None
    dispatched = replace(layout, ep_comm="deepep")
    try:  # the recommendation's recipe (a searched precision or FP8 recipe), not the request's
        changed = replace(request.on_layout(dispatched), train=replace(train, layout=dispatched))
        deep = evaluate(changed, result.profile, result.calibration, train.micro_batch, train.recompute)
    except ConfigError:  # whatever else DeepEP cannot run with: nothing to say
        return None
    if deep.tokens_per_s <= best.tokens_per_s * (1 + NEAR):
        return None
    by_all_to_all = sum(t.seconds for t in best.time.communication if t.axis == "ep")
    by_deepep = sum(t.seconds for t in deep.time.communication if t.axis == "ep")
    return (f"the experts' tokens cross nodes by all-to-all, {by_all_to_all:.3f} s of collectives a step; by DeepEP or "
            f"HybridEP (--ep-comm deepep or hybridep) each token crosses once to each node of its experts: "
            f"{by_deepep:.3f} s, {deep.tokens_per_s:,.0f} tokens/s ({deep.tokens_per_s / best.tokens_per_s - 1:+.0%})"
            + ("" if deep.rejection is None else f", but {deep.rejection}"))
