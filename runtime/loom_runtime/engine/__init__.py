"""The engine: one scheduler, one model runner, one step loop.

Owns batching decisions; per-request state stays in loop state objects.
"""
