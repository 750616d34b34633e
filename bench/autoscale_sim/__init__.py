"""A discrete-event simulation of a P/D fleet serving a replayed trace while a scaling policy
moves its roles (bench/autoscale.py is its CLI)."""
