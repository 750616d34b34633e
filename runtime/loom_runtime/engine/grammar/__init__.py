"""Structured outputs in the engine: grammars compiled for the checkpoint's tokenizer, one
matcher per constrained request, and the token mask the batched sampler applies."""
