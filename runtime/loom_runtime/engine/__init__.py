"""The LLM engine: one batcher driving every AR-decode loop, one step: schedule -> execute ->
advance; the KV memory it runs on (kv_memory/), MTP speculation (spec/) and a parallel engine's
rank processes (ranks/) in their own sub-packages, and the step threads the diffusion engine
shares (step_thread.py, shared_step_thread.py).

Owns batching decisions; per-request state stays in loop state objects; never serves HTTP.
"""
