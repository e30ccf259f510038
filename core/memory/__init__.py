"""Memory and FLOPs of one step on one rank: static state, the activation ledger (the symbolic
forward that records every tensor autograd keeps), pipeline stages, and `estimate`, which
puts them together for one configuration.
"""
