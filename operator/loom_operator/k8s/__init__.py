"""Kubernetes substrate: kopf handlers and pure manifest renderers.

Renderers never call the API server.
"""
