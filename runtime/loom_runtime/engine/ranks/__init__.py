"""A parallel engine's rank processes as the engine drives them: which ranks start and whether the
settings fit them, the pipes to them, and the runners over sparse-mla's PCP/DCP/EP ranks and
llama's TP ranks.

Owns the rank group from start to close; never schedules or samples (the engine does, as on one
rank).
"""
