"""Loom control plane: cards, fleet controller, router, Kubernetes and local substrates.

Imports only loom_runtime.card from the runtime, never torch.
"""
