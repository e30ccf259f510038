"""What ``headroom agent run`` can be asked for, by name: its suites and its kinds of benchmark.

Plain constants that import nothing: the CLI parses its flags with them without importing torch, and
headroom.agent.suites builds what each name runs (tests/test_agent.py checks it builds every one).
"""

SUITES = ("smoke", "quick", "standard", "full")
"""``--suite``: from a seconds-long check of the pipeline to every shape the agent knows."""
KINDS = ("matmul", "elementwise", "attention", "dispatch", "train", "collectives")
"""``--only``: the kinds of benchmark a suite runs."""
