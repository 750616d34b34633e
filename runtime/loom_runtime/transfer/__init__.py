"""KV connectors: NIXL and a plain-socket fallback.

Moves KV bytes between workers; never decides what to move.
"""
