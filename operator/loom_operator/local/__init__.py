"""Local substrate: the same fleet as processes on one machine.

Starts and stops processes; routing and sync decisions live elsewhere.
"""
