"""torch.distributed groups for PCP, DCP, TP and EP.

Shard math and collectives only; never decides scheduling.
"""
