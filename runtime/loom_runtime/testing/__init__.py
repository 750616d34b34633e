"""Helpers that stand in for fleet parts in tests and benches (a P/D proxy for now).

Owns nothing a production worker imports; never used by the runtime itself.
"""
