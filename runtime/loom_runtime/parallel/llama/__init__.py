"""Tensor parallelism for the llama family: the head and MLP shards of each rank, and the rank
program a TP worker runs under the engine."""
