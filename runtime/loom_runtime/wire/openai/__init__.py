"""The OpenAI codec: request validation, response and stream-chunk encoding, logprobs, usage,
SSE framing and request ids, shared by the worker's server and the router.

Imports nothing heavy (no torch, no aiohttp), so the router encodes what it relays with the very
code the workers answer with, byte for byte.
"""
