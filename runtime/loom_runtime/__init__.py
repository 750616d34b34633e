"""Loom loop runtime: the data plane that role pods and local workers run.

Subpackages depend one way: card <- loop <- engine/kv/parallel/transfer/models <- serve.
"""
