"""The substrate-agnostic fleet controller and capacity planner.

Decisions are pure functions; I/O lives in the substrates.
"""
