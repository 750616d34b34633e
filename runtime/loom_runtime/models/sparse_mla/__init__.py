"""The sparse-mla family (GLM-5 class): MLA attention, the DSA indexer, MoE FFNs, MTP weights.

Pure compute and checkpoint loading over a per-sequence cache; never schedules requests.
"""
