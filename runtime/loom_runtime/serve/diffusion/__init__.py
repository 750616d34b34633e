"""A diffusion worker's servers: the image and video routes, their bodies, the video job store,
PNG/MP4 encoding, /metrics, the control service's view of the engine, and `loom runtime`'s part.

Maps HTTP and gRPC onto loom_runtime.diffusion; never runs engine steps.
"""
