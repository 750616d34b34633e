"""Fixtures for the server tests: tiny checkpoints, and real `loom runtime` worker processes.

Workers bind free ports on 127.0.0.1, are awaited by polling /ready, and are always stopped.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from loom_runtime.models.tiny import init_tiny

MODEL = "tiny-serve"
TOKEN = "test-control-token"
READY_TIMEOUT_S = 120.0
CARD = """\
apiVersion: loom.dev/v1alpha1
kind: ModelCard
metadata:
  name: {name}
spec:
  family: llama
  components:
    - name: decoder
      kind: transformer
      source:
        uri: file://{path}
      weightsVersion: v1
      precision: {{weights: fp32, kv: fp32}}
      requiredFor: [generate]
  loops:
    - name: generate
      kind: ar_decode
      components: [decoder]
      cachePolicy: prefix
  recipe: {{method: base, assumesLoop: generate, assumesPrecision: fp32}}
"""


@dataclass(frozen=True)
class Worker:
    """A running `loom runtime` process and how to reach it."""

    base_url: str  # http://127.0.0.1:PORT
    control: str  # 127.0.0.1:PORT of the gRPC control service
    kv_events: str  # tcp://127.0.0.1:PORT of the KV event PUB socket
    token: str
    model: str
    log: Path
    proc: subprocess.Popen[bytes]

    @property
    def api(self) -> str:
        return f"{self.base_url}/v1"

    def get_json(self, path: str) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(self.base_url + path, timeout=30) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    def post(self, path: str, body: bytes | dict[str, Any]) -> tuple[int, Any, dict[str, str]]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method="POST")
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, json.loads(resp.read()), _lower(resp.headers.items())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read()), _lower(err.headers.items())

    def metrics(self) -> dict[str, float]:
        """`name{labels}` -> value for every sample of /metrics."""
        with urllib.request.urlopen(self.base_url + "/metrics", timeout=30) as resp:
            text = resp.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def metric(self, name: str, **labels: str) -> float:
        """One sample's value (labels besides model_name must be given in sorted order)."""
        parts = ",".join(
            f'{k}="{v}"' for k, v in sorted({**labels, "model_name": self.model}.items())
        )
        return self.metrics().get(f"{name}{{{parts}}}", 0.0)


def _lower(items: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in items}


def free_ports(n: int) -> list[int]:
    """n distinct ports that were free a moment ago on 127.0.0.1."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def poll(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> None:
    """Wait until check() is true; fail the test naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@pytest.fixture
def wait_until() -> Callable[[Callable[[], bool], float, str], None]:
    """wait_until(check, timeout_s, what): poll until check() holds, fail naming `what`."""
    return lambda check, timeout, what: poll(check, timeout, what)


@pytest.fixture(scope="session")
def tiny_v1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_tiny(tmp_path_factory.mktemp("tiny-v1"), seed=0)


@pytest.fixture(scope="session")
def tiny_v2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same architecture and tokenizer as tiny_v1, other weights."""
    return init_tiny(tmp_path_factory.mktemp("tiny-v2"), seed=1)


def _ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> bool:
    if proc.poll() is not None:
        pytest.fail(f"worker exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
    try:
        with urllib.request.urlopen(url + "/ready", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


@contextmanager
def _run_worker(tmp: Path, checkpoint: Path, extra: list[str]) -> Iterator[Worker]:
    card = tmp / "card.yaml"
    card.write_text(CARD.format(name=MODEL, path=checkpoint))
    http, control, kv = free_ports(3)
    log = tmp / "worker.log"
    cmd = [
        sys.executable, "-m", "loom_runtime", "runtime", "--card", str(card),
        "--role", "aggregated", "--port", str(http), "--control-port", str(control),
        "--kv-events-port", str(kv), "--max-model-len", "512", "--num-blocks", "96",
        "--max-num-seqs", "8", *extra,
    ]  # fmt: skip
    env = {**os.environ, "LOOM_CONTROL_TOKEN": TOKEN, "LOOM_CACHE": str(tmp / "cache")}
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        url = f"http://127.0.0.1:{http}"
        poll(lambda: _ready(url, proc, log), READY_TIMEOUT_S, "the worker's /ready", 0.1)
        yield Worker(url, f"127.0.0.1:{control}", f"tcp://127.0.0.1:{kv}", TOKEN, MODEL, log, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def launch(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., AbstractContextManager[Worker]]]:
    """launch(checkpoint, *flags) -> a context manager running a worker."""

    def start(checkpoint: Path, *extra: str) -> AbstractContextManager[Worker]:
        return _run_worker(tmp_path_factory.mktemp("worker"), checkpoint, list(extra))

    yield start
