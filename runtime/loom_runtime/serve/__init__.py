"""The worker's servers: OpenAI HTTP, metrics, health and the gRPC control service.

Maps typed errors to status codes in one place; never blocks the engine's step loop.
"""
