"""The llm-d-style endpoint picker and OpenAI proxy.

Routing decisions are pure; HTTP lives in the proxy shell.
"""
