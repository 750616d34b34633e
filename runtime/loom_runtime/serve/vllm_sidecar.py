"""`loom vllm-sidecar`: Loom's control service (loom.control.v1) in front of a vLLM server, so
the operator drives a `backend: vllm` pod exactly as it drives a Loom worker.

Owns the mapping of Loom's control calls onto vLLM 0.33.0's own endpoints (served with
VLLM_SERVER_DEV_MODE=1), each with a timeout:

- Status: `GET /is_paused`, `GET /weight_info`, and `/metrics` (vllm:num_requests_running,
  vllm:num_requests_waiting, vllm:kv_cache_usage_perc).
- Pause(WAIT | ABORT): `POST /pause?mode=wait|abort` (vLLM answers new requests 503 from then
  on); WAIT returns once drained or at its timeout, draining.
- Resume: `POST /resume`.
- LoadWeights(source, version): `POST /collective_rpc` `reload_weights(weights_path=…)` (in
  place, from the checkpoint directory), `POST /update_weight_version`, then
  `POST /reset_prefix_cache` (vLLM publishes AllBlocksCleared: the router forgets the old
  version's blocks).

The gRPC side is the runtime's own ControlService (token check, call order, errors); this
module only supplies the ControlledEngine. Never serves the OpenAI API (vLLM does).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Literal

from loom_runtime.card import load_model_card
from loom_runtime.card.source import Source
from loom_runtime.engine.types import EngineStats
from loom_runtime.errors import LoomError
from loom_runtime.serve.control_service import ControlService, ControlSettings, start_control_server

logger = logging.getLogger(__name__)

TOKEN_ENV = "LOOM_CONTROL_TOKEN"
CALL_TIMEOUT_S = 10.0
LOAD_TIMEOUT_S = 1800.0  # a large checkpoint reloads for minutes
DRAIN_POLL_S = 0.2


class VllmError(LoomError):
    """vLLM refused or did not answer a control call; the message says which and why."""


def sample_sum(text: str, name: str) -> float | None:
    """The sum of every sample of `name` in Prometheus text (None: no sample)."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{", 1)[0] != name:
            continue
        try:
            total += float(value)
        except ValueError:
            continue
        seen = True
    return total if seen else None


class VllmEngine:
    """The ControlledEngine of one vLLM server at `base_url` (sync: called in worker threads)."""

    def __init__(self, base_url: str, weights_version: str, block_size: int) -> None:
        self.base_url = base_url.rstrip("/")
        self._version = weights_version
        self._block_size = block_size

    def _call(
        self, method: str, path: str, body: Any = None, timeout: float = CALL_TIMEOUT_S
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method,
                                         headers={"content-type": "application/json"})  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=timeout) as r:
                text = r.read().decode()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            raise VllmError(f"vLLM {method} {path}: HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise VllmError(f"vLLM {method} {path}: {exc}") from None
        if path == "/metrics":
            return text
        return json.loads(text) if text.strip() else None

    def _metrics(self) -> str:
        text: str = self._call("GET", "/metrics")
        return text

    def in_flight(self) -> int:
        text = self._metrics()
        running = sample_sum(text, "vllm:num_requests_running") or 0.0
        waiting = sample_sum(text, "vllm:num_requests_waiting") or 0.0
        return int(running + waiting)

    def stats(self) -> EngineStats:
        text = self._metrics()
        paused = bool(self._call("GET", "/is_paused").get("is_paused"))
        reported = self._call("GET", "/weight_info").get("weight_version")
        if reported:
            self._version = str(reported)
        return EngineStats(
            num_running=int(sample_sum(text, "vllm:num_requests_running") or 0),
            num_waiting=int(sample_sum(text, "vllm:num_requests_waiting") or 0),
            kv_usage=float(sample_sum(text, "vllm:kv_cache_usage_perc") or 0.0),
            num_blocks=0,
            num_free_blocks=0,
            block_size=self._block_size,
            admission_open=not paused,
            weights_version=self._version,
            num_preemptions=int(sample_sum(text, "vllm:num_preemptions") or 0),
        )

    def pause(self, mode: Literal["wait", "abort"] = "wait", timeout: float | None = None) -> bool:
        """Close admission; `wait` returns once drained or after `timeout` (still draining)."""
        limit = CALL_TIMEOUT_S if timeout is None else max(timeout, 0.01)
        query = urllib.parse.urlencode({"mode": mode})
        try:
            self._call(
                "POST",
                f"/pause?{query}",
                timeout=limit + (CALL_TIMEOUT_S if mode == "abort" else 0),
            )
        except VllmError as exc:
            if "timed out" not in str(exc) or mode != "wait":
                raise
        deadline = time.monotonic() + limit
        while self.in_flight() and time.monotonic() < deadline:
            time.sleep(DRAIN_POLL_S)
        return self.in_flight() == 0

    def resume(self) -> None:
        self._call("POST", "/resume")

    def load_weights(self, path: str, version: str) -> None:
        rpc = {
            "method": "reload_weights",
            "kwargs": {"weights_path": path},
            "timeout": LOAD_TIMEOUT_S,
        }
        self._call("POST", "/collective_rpc", rpc, timeout=LOAD_TIMEOUT_S)
        self._call("POST", "/update_weight_version", {"new_version": version})
        self._call("POST", "/reset_prefix_cache")
        self._version = version


def resolve_source(source: str) -> Path:
    """A LoadWeights source vLLM can reload from: a local checkpoint directory (file://, or a
    pvc:// source where the pod mounts its claim)."""
    if source.startswith("hf://"):
        raise VllmError(
            f"{source}: vLLM reloads weights from a local directory; put the checkpoint on a "
            "claim the pods mount (pvc://claim/path) or the pod's volume (file:///path)"
        )
    mounted = Source(uri=source).mounted_path() if source.startswith("pvc://") else None
    path = Path(mounted) if mounted is not None else Path(source.removeprefix("file://"))
    if not path.is_dir():
        raise VllmError(f"{source}: no checkpoint directory at {path}")
    return path


def add_parser(sub: Any) -> None:
    p = sub.add_parser("vllm-sidecar", help="serve Loom's control API in front of a vLLM server")
    p.add_argument("--card", type=Path, required=True, help="the worker's ModelCard")
    p.add_argument("--vllm-url", default="http://127.0.0.1:8000", help="the vLLM server")
    p.add_argument("--host", default="127.0.0.1", help="control API address")
    p.add_argument("--port", type=int, default=50051, help="control API port")
    p.add_argument("--role", choices=("aggregated", "prefill", "decode"), default="aggregated")
    p.add_argument("--block-size", type=int, default=16, help="vLLM's --block-size")
    p.add_argument("--drain-timeout", type=float, default=60.0, help="Pause(WAIT) upper bound (s)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        print(f"loom vllm-sidecar: set ${TOKEN_ENV} (the control token)")
        return 2
    card = load_model_card(args.card)
    component = card.spec.components[0]
    engine = VllmEngine(args.vllm_url, component.weights_version, args.block_size)
    settings = ControlSettings(
        model_name=card.name, role=args.role, drain_timeout_s=args.drain_timeout,
        resolve_source=resolve_source, healthy=lambda: True,
    )  # fmt: skip
    asyncio.run(_serve(ControlService(engine, settings), args.host, args.port, token))
    return 0


async def _serve(service: ControlService, host: str, port: int, token: str) -> None:
    server, bound = await start_control_server(service, host, port, token)
    logger.info("control API for vLLM on %s:%d", host, bound)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(5.0)
