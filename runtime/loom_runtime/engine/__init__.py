"""The engine: one batch scheduler driving every loop, one step: schedule -> execute -> advance.

Owns batching decisions; per-request state stays in loop state objects.
"""
