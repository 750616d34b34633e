"""`WeightSync`: a trainer pushes its weights into a running Loom fleet.

Owns the trainer's side of one push (open it with the fleet controller, send the manifest and
the buckets, wait for the swap); never holds more than one bucket of packed bytes beyond the
trainer's own tensors, and never imports Loom's runtime, operator or router.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

import torch

from loom_trainer.errors import PushFailed, PushRefused
from loom_trainer.group import Rendezvous, TransferGroup
from loom_trainer.nixl_path import MISSING, NixlSource, nixl_api
from loom_trainer.protocol import DEFAULT_BUCKET_BYTES, plan_buckets, spec_of
from loom_trainer.sender import send_push

Mode = Literal["barrier", "rolling", "keep"]
MODES: tuple[Mode, ...] = ("barrier", "rolling", "keep")
KV = Literal["keep", "recompute"]
KVS: tuple[KV, ...] = ("keep", "recompute")
Transport = Literal["gloo", "nixl"]
TRANSPORTS: tuple[Transport, ...] = ("gloo", "nixl")
POLL_S = 0.1
HTTP_TIMEOUT_S = 30.0
RETRY_WINDOW_S = 30.0
"""How long a 503 with Retry-After (the controller cannot reach the card's desk yet: a sharded
operator's shard moving) is waited out before it is an error."""


@dataclass(frozen=True)
class Opened:
    """What the controller answers when it opens an update."""

    update_id: str
    host: str
    port: int
    workers: tuple[str, ...]
    """Worker names; worker i is rank i + 1."""


@dataclass(frozen=True)
class PushResult:
    """A completed push: the fleet serves `version` on every worker."""

    version: str
    update_id: str
    workers: tuple[str, ...]
    buckets: int
    bytes_sent: int
    largest_bucket: int
    """Bytes of the largest bucket: the extra memory a push costs a worker (and the trainer)."""
    transport: Transport
    transfer_s: float
    """Open → every worker staged every bucket (the fleet served meanwhile)."""
    send_s: float
    """First bucket → commit: the bytes moving (`bytes_sent / send_s` is the push's rate)."""
    total_s: float
    """Open → every worker serves `version`."""


def free_port() -> int:
    """A port free on this machine now (the push's TCPStore binds it, on every interface, right
    after the controller answers)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


class WeightSync:
    """A connection to one fleet controller (`loom up`'s weight API)."""

    def __init__(self, fleet_url: str, token: str, store_host: str | None = None) -> None:
        self.url = fleet_url.rstrip("/")
        self._token = token
        self.store_host = store_host

    @classmethod
    def connect(cls, fleet_url: str, token: str, store_host: str | None = None) -> WeightSync:
        """Check that the controller answers and accepts `token`; PushRefused if not.

        `store_host`: the address of this machine the fleet's workers reach it at; each push
        then hosts its group's TCPStore there, on a free port (required by the operator on
        Kubernetes, whose workers run on other machines; `loom up` picks one on its own machine
        when it is None)."""
        sync = cls(fleet_url, token, store_host)
        sync._request("GET", "/v1/weights/updates")
        return sync

    def push(
        self,
        named_tensors: Mapping[str, torch.Tensor],
        version: str,
        mode: Mode = "barrier",
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        timeout_s: float = 60.0,
        swap_timeout_s: float = 600.0,
        on_bucket: Callable[[int, int], None] | None = None,
        kv: KV | None = None,
        transport: Transport = "gloo",
    ) -> PushResult:
        """Make `named_tensors` the fleet's weights, as `version`.

        barrier: every worker switches together (no request sees two versions); rolling: the
        fleet's drain-correct rolling order; keep: every worker swaps under its running
        requests, which go on (each token tagged with the version that sampled it) over the KV
        of the old weights (`kv="keep"`, the default) or re-prefilled under the new ones
        (`kv="recompute"`). `timeout_s` bounds the rendezvous and every collective;
        `on_bucket(index, count)` runs after each bucket is sent. `transport`: how the bytes
        move — "gloo", the transfer group's broadcasts, or "nixl", each worker READing every
        bucket from one buffer of this process that NIXL registered (one more bucket of memory
        here; the group still carries the manifest, checksums and verdicts). Raises PushRefused
        (nothing moved) or PushFailed (the fleet keeps its last complete version).
        """
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if kv is not None and (mode != "keep" or kv not in KVS):
            raise ValueError(f"kv is mode keep's option, one of {', '.join(KVS)}; got {kv!r}")
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
        if transport == "nixl" and nixl_api() is None:
            raise PushRefused(f"transport nixl: {MISSING} in the trainer's environment")
        started = time.monotonic()
        specs = [spec_of(n, t) for n, t in named_tensors.items()]
        buckets = plan_buckets(specs, bucket_bytes)
        opened = self._open(version, mode, timeout_s, kv or ("keep" if mode == "keep" else ""))
        rv = Rendezvous(
            opened.host, opened.port, 0, len(opened.workers) + 1, timeout_s, opened.update_id
        )
        largest = max((b.nbytes for b in buckets), default=0)
        source = None
        try:
            if transport == "nixl":
                source = NixlSource(opened.update_id, largest)
            group = TransferGroup(rv)
            send_s = send_push(group, opened.workers, buckets, named_tensors, on_bucket, source)
        except RuntimeError as exc:  # a collective failed or timed out (a worker died)
            raise PushFailed(self._broken(opened.update_id, version, exc)) from exc
        finally:
            if source is not None:
                source.close()
        transfer_s = time.monotonic() - started
        self._wait_done(opened.update_id, swap_timeout_s)
        return PushResult(
            version, opened.update_id, opened.workers, len(buckets),
            sum(b.nbytes for b in buckets), largest, transport, transfer_s, send_s,
            time.monotonic() - started,
        )  # fmt: skip

    def latest(self) -> dict[str, object] | None:
        """The controller's latest update (None before the first push)."""
        doc = self._request("GET", "/v1/weights/updates")["update"]
        return doc if isinstance(doc, dict) else None

    def update(self, update_id: str) -> dict[str, object]:
        """The controller's record of one update (state, version, workers, error)."""
        return self._request("GET", f"/v1/weights/updates/{update_id}")

    def _open(self, version: str, mode: Mode, timeout_s: float, kv: str) -> Opened:
        body: dict[str, object] = {"version": version, "mode": mode, "timeout_seconds": timeout_s}
        if kv:
            body["kv"] = kv
        if self.store_host is not None:
            body["store_address"] = f"{self.store_host}:{free_port()}"
        doc = self._request("POST", "/v1/weights/updates", body)
        workers = doc["workers"]
        assert isinstance(workers, list)
        return Opened(
            str(doc["update_id"]), str(doc["store_host"]), int(str(doc["store_port"])),
            tuple(str(w) for w in workers),
        )  # fmt: skip

    def _broken(self, update_id: str, version: str, exc: RuntimeError) -> str:
        """What to tell when the group broke: the workers' reasons if the controller has them."""
        why = f"push {update_id} of {version} broke: {exc}"
        try:
            error = self.update(update_id).get("error")
        except PushRefused:
            error = None
        if error:
            return f"{why}; the workers said: {error}"
        return f"{why}; GET {self.url}/v1/weights/updates/{update_id} says what the workers saw"

    def _wait_done(self, update_id: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            doc = self.update(update_id)
            if doc["state"] == "done":
                return
            if doc["state"] == "failed":
                raise PushFailed(f"push {update_id}: {doc.get('error', 'failed')}")
            if time.monotonic() > deadline:
                raise PushFailed(
                    f"push {update_id} did not finish its swap within {timeout_s:g}s "
                    f"(state {doc['state']})"
                )
            time.sleep(POLL_S)

    def _request(
        self, method: str, path: str, body: Mapping[str, object] | None = None
    ) -> dict[str, object]:
        data = None if body is None else json.dumps(body).encode()
        deadline = time.monotonic() + RETRY_WINDOW_S
        while True:
            req = urllib.request.Request(self.url + path, data=data, method=method)
            req.add_header("Authorization", f"Bearer {self._token}")
            req.add_header("Content-Type", "application/json")
            try:
                with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as r:
                    doc = json.loads(r.read().decode())
                break
            except urllib.error.HTTPError as exc:
                try:
                    message = str(json.loads(exc.read().decode())["error"])
                except (ValueError, KeyError):
                    message = f"HTTP {exc.code}"
                wait = _retry_after(exc)
                if wait is None or time.monotonic() + wait > deadline:
                    raise PushRefused(f"{method} {path}: {message}") from None
                time.sleep(wait)
            except (urllib.error.URLError, OSError) as exc:
                why = f"cannot reach the fleet controller at {self.url}: {exc}"
                raise PushRefused(why) from None
        assert isinstance(doc, dict)
        return doc


def _retry_after(exc: urllib.error.HTTPError) -> float | None:
    """Seconds a 503 asks the client to wait (None: not a 503 to wait out)."""
    if exc.code != 503:
        return None
    try:
        return max(0.0, float(exc.headers.get("Retry-After", "")))
    except ValueError:
        return None
