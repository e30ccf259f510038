"""What is trained and on what: the model's shape (from a preset or a HuggingFace config), the
training configuration (precision, optimizer, checkpoint policy, stack), the layout over GPUs,
and the hardware and interconnect it runs on. Everything downstream takes these records.
"""
