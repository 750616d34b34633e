"""The sparse-mla forward on real collectives: PCP prefill, DCP-sharded KV and decode, EP MoE.

Implements the model's LayerHooks over process groups; never schedules requests or samples.
"""
