"""The KV memory an engine runs on: which paged cache and its sizing (pool.py), HiSparse's two
tiers (hisparse.py), and CPU offload reloads on a copy thread (host_reload.py).

Chooses, sizes and reports that memory (loom_runtime.kv implements it); never schedules compute.
"""
