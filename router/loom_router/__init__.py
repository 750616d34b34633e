"""Loom's router: an llm-d-style endpoint picker and OpenAI proxy, in its own process.

Decisions are pure (`core/`); HTTP, ZMQ and the attempt loop live in `shell/`. Imports from the
runtime only its cards, wire and control contracts, and never the operator.
"""
