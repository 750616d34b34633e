"""Fixtures for the server tests: tiny checkpoints, and real `loom runtime` worker processes.

Workers bind free ports on 127.0.0.1, are awaited by polling /ready, and are always stopped.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from loom_runtime.models.tiny import init_tiny
from loom_runtime.testing.processes import CARD, free_ports, get_json, poll, post, scrape, spawn

MODEL = "tiny-serve"
TOKEN = "test-control-token"


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
        return get_json(self.base_url + path)

    def post(self, path: str, body: bytes | dict[str, Any]) -> tuple[int, Any, dict[str, str]]:
        return post(self.base_url + path, body, timeout=60)

    def metrics(self) -> dict[str, float]:
        """`name{labels}` -> value for every sample of /metrics."""
        return scrape(self.base_url)

    def metric(self, name: str, **labels: str) -> float:
        """One sample's value (labels besides model_name must be given in sorted order)."""
        parts = ",".join(
            f'{k}="{v}"' for k, v in sorted({**labels, "model_name": self.model}.items())
        )
        return self.metrics().get(f"{name}{{{parts}}}", 0.0)


@pytest.fixture
def wait_until() -> Callable[[Callable[[], bool], float, str], None]:
    """wait_until(check, timeout_s, what): poll until check() holds, fail naming `what`."""
    return lambda check, timeout, what: poll(check, timeout, what)


@pytest.fixture
def client(worker: Any) -> Iterator[openai.OpenAI]:
    """The official openai client on the test module's `worker`."""
    c = openai.OpenAI(base_url=worker.api, api_key="unused", max_retries=0)
    yield c
    c.close()


@pytest.fixture(scope="session")
def tiny_v1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_tiny(tmp_path_factory.mktemp("tiny-v1"), seed=0)


@pytest.fixture(scope="session")
def tiny_v2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same architecture and tokenizer as tiny_v1, other weights."""
    return init_tiny(tmp_path_factory.mktemp("tiny-v2"), seed=1)


@contextmanager
def _run_worker(tmp: Path, checkpoint: Path, extra: list[str], kv: str) -> Iterator[Worker]:
    card = tmp / "card.yaml"
    card.write_text(CARD.format(name=MODEL, path=checkpoint).replace("kv: fp32", f"kv: {kv}"))
    http, control, kv = free_ports(3)
    cmd = [
        sys.executable, "-m", "loom_runtime", "runtime", "--card", str(card),
        "--role", "aggregated", "--port", str(http), "--control-port", str(control),
        "--kv-events-port", str(kv), "--max-model-len", "512", "--num-blocks", "96",
        "--max-num-seqs", "8", *extra,
    ]  # fmt: skip
    url = f"http://127.0.0.1:{http}"
    env = {"LOOM_CONTROL_TOKEN": TOKEN}
    with spawn("worker", cmd, tmp / "worker.log", url, "/ready", env) as proc:
        yield Worker(
            url, f"127.0.0.1:{control}", f"tcp://127.0.0.1:{kv}", TOKEN, MODEL, proc.log, proc.proc
        )


@pytest.fixture(scope="module")
def launch(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., AbstractContextManager[Worker]]]:
    """launch(checkpoint, *flags, kv="fp32") -> a context manager running a worker (`kv`: the
    card's precision.kv)."""

    def start(checkpoint: Path, *extra: str, kv: str = "fp32") -> AbstractContextManager[Worker]:
        return _run_worker(tmp_path_factory.mktemp("worker"), checkpoint, list(extra), kv)

    yield start
