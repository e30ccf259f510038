"""Memory measured under real torch.distributed on CPU (gloo), rank by rank.

``launch`` runs ``worker`` under torch's own launcher; the worker writes one
JSON per rank. tests/test_distributed_memory.py holds the measurements against
hand-derived numbers and against the analytic core.
"""
