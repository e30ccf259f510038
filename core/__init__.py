"""Headroom's analytic core: specs, FLOPs, memory and roofline accounting.

Pure Python over frozen dataclasses. Nothing here imports outside the standard
library (tests/test_core_purity.py enforces it), so a laptop can plan without
torch and every other package can build on it. docs/accounting.md explains
the formulas with their sources; docs/plan-contract.md what a plan promises.
"""
