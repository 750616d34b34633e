"""Wire contracts the runtime, the router and the operator share: prefix block hashing, KV
events, prompt rendering and tokenization, the P/D bodies and kv_transfer_params, header names,
the router admin API's JSON, the OpenAI codec (`openai/`), metric names, the engine settings
(`engine_settings.py`: card field, runtime flag, vLLM flag), and how a server process logs and
stops (`process.py`).

Imports nothing heavy (no torch, no sockets), so the router and the operator use the very code
the workers run instead of copies kept in step by tests.
"""
