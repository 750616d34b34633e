"""HTTP header names that workers, the router, proxies and clients must agree on.

Owns the names only (and what each value says); never reads or writes a request.
"""

from __future__ import annotations

REQUEST_ID_HEADER = "x-request-id"
"""The request's id, passed router → worker and echoed back, threaded through every log line."""
WEIGHTS_HEADER = "x-loom-weights-version"
"""The weights version that produced an answer (worker → router → client)."""
ENDPOINT_HEADER = "x-loom-endpoint"
"""The router's answer: the id of the worker that served the request."""
MIGRATED_HEADER = "x-loom-migrated"
"""The router's answer: the request moved workers (from where, why, and a version change)."""
PD_HEADER = "x-loom-pd"
"""remote-prefill | local-prefill: how the decode got the prompt's KV."""
PD_FALLBACK_HEADER = "x-loom-pd-fallback"
"""Set when a remote prefill was planned and failed: why, and on which worker."""
IGNORED_FIELDS_HEADER = "x-loom-ignored-fields"
"""The worker's answer: request fields it does not define and ignored (comma-separated paths,
as vLLM ignores them); the router relays it. A worker run with --strict-fields refuses them."""
