"""Headroom's analytic core: what a training step holds, how long it takes, and what to run.

Pure Python over frozen dataclasses. Nothing here imports outside the standard
library (tests/test_core_purity.py enforces it), so a laptop can plan without
torch and every other package can build on it. Sub-packages, in the order
records flow through them:

- ``specs``: the model, the training configuration, the layout, the hardware;
- ``memory``: static memory, the activation ledger, FLOPs, one configuration's estimate;
- ``timing``: the ops of a step and what each costs, communication, MFU and run cost;
- ``planning``: the search over layouts and configurations, and advice when nothing fits;
- ``measured``: a device's stored measurements as a profile and a calibration;
- ``exports``: a recommendation as a training framework's settings.

``errors``, ``units``, ``divisors``, ``safe_text`` and ``collector`` serve them all.
docs/accounting.md explains the formulas with their sources;
docs/plan-contract.md what a plan promises.
"""
