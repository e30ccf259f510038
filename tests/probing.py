"""Build the agent's decoder for a configuration and probe what it saves (shared by tests)."""

from agent.bench_train import forward_loss
from agent.ledger_check import build, probe_config

run_forward = forward_loss
__all__ = ["build", "probe_config", "run_forward"]
