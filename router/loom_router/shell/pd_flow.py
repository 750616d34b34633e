"""The P/D two-step flow: prefill on one worker, then decode on another with its KV.

Owns running step 1 and judging the prefill's answer (the bodies are loom_runtime.wire.pd's, the
contract of docs/pd.md); never picks workers and never falls back silently: every outcome says
what happened (x-loom-pd header, metric, log).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from loom_router.core.endpoints import Endpoint
from loom_router.errors import UpstreamError, UpstreamRefusedError
from loom_router.shell.upstream import Upstream
from loom_runtime.wire.headers import WEIGHTS_HEADER
from loom_runtime.wire.kv_transfer import FIELD
from loom_runtime.wire.pd import PDMode, prefill_body

logger = logging.getLogger(__name__)

FallbackReason = Literal["refused", "unavailable", "status", "no_params", "version_mismatch"]


@dataclass(frozen=True)
class PrefillOutcome:
    """What step 1 gave: params for the decode, or why the decode must prefill itself."""

    params: Mapping[str, Any] | None
    fallback: FallbackReason | None = None
    detail: str = ""

    @property
    def mode(self) -> PDMode:
        return "remote-prefill" if self.params else "local-prefill"

    def header(self, prefill_id: str) -> str | None:
        if self.fallback is None:
            return None
        return f"{self.fallback} on {prefill_id}: {self.detail}"[:512]


def judge_prefill(
    status: int, answer: Any, headers: Mapping[str, str], decode: Endpoint
) -> PrefillOutcome:
    """Whether a prefill's answer can feed `decode` (pure). Same weights version or nothing:
    KV computed by other weights must never reach a decode (DESIGN.md invariant 5)."""
    if status != 200:
        message = ""
        if isinstance(answer, Mapping) and isinstance(answer.get("error"), Mapping):
            message = str(answer["error"].get("message", ""))
        return PrefillOutcome(None, "status", f"answered {status} {message}".strip())
    params = answer.get(FIELD) if isinstance(answer, Mapping) else None
    if not isinstance(params, Mapping) or not params.get("do_remote_prefill"):
        return PrefillOutcome(None, "no_params", f"the answer has no usable {FIELD}")
    version = params.get("weights_version") or headers.get(WEIGHTS_HEADER)
    if version is not None and version != decode.weights_version:
        return PrefillOutcome(
            None,
            "version_mismatch",
            f"prefill ran weights {version}, decode {decode.id} serves {decode.weights_version}",
        )
    return PrefillOutcome(dict(params))


async def run_prefill(
    upstream: Upstream,
    prefill: Endpoint,
    decode: Endpoint,
    path: str,
    body: Mapping[str, Any],
    headers: Mapping[str, str],
    timeout_s: float,
) -> PrefillOutcome:
    """Step 1 against `prefill`; never raises for a worker's failure (it is an outcome).

    UpstreamRefusedError is re-raised after nothing else happened, so the caller can mark the
    worker down; the caller then falls back like for any other outcome.
    """
    try:
        reply = await upstream.post(prefill, path, prefill_body(body), headers, timeout_s)
    except UpstreamRefusedError:
        raise
    except UpstreamError as exc:
        return PrefillOutcome(None, "unavailable", str(exc))
    outcome = judge_prefill(reply.status, reply.json(), reply.headers, decode)
    if outcome.fallback is not None:
        logger.warning(
            "remote prefill failed; the decode prefills locally",
            extra={"prefill": prefill.id, "decode": decode.id, "why": outcome.detail},
        )
    return outcome
