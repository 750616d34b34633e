"""The diffusion engine: Wan requests as loops (text encode -> flow-matching denoise -> VAE
decode), batched step by step under a memory ledger and a step cost model.

Owns diffusion requests from admission to frames; never serves HTTP (loom_runtime.serve.diffusion
does) and takes nothing from loom_runtime.engine but its step threads.
"""
