"""Wire contracts the runtime and the router must share: prefix block hashing and KV events.

Imports nothing heavy (no torch, no sockets): the operator's router imports it to hash and decode
exactly as the engine does.
"""
