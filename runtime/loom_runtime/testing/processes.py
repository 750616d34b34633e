"""Real `loom runtime` workers and P/D proxies as child processes, for tests and benches.

Owns spawning on free 127.0.0.1 ports, readiness polling (never a fixed sleep), one torch thread
per worker, and stopping (terminate, then kill) on every exit path; never judges results.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
WAN_CARD = """\
apiVersion: loom.dev/v1alpha1
kind: ModelCard
metadata: {{name: {name}}}
spec:
  family: dit
  components:
    - {{name: dit, kind: transformer, source: {{uri: "file://{path}"}}, weightsVersion: v1,
       precision: {{weights: fp32, kv: fp32}}, requiredFor: [gen]}}
  loops:
    - {{name: gen, kind: diffusion, components: [dit], steps: {steps}}}
  recipe: {{method: base, assumesLoop: gen, assumesPrecision: fp32}}
"""
"""A diffusion worker's card over a Wan checkpoint at {path} ({steps}: the loop's steps)."""
# One torch thread per worker: on a small shared machine two intra-op threads stall each other.
WORKER_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def free_ports(n: int) -> list[int]:
    """n distinct ports that were free a moment ago on 127.0.0.1."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def poll(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> None:
    """Wait until check() is true; TimeoutError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def post(
    url: str, body: bytes | dict[str, Any], timeout: float = 300
) -> tuple[int, Any, dict[str, str]]:
    """POST JSON (a dict, or raw bytes sent as they are); (status, parsed body, lower-cased
    headers), HTTP errors included."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read()), _lower(resp.headers.items())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), _lower(err.headers.items())


def sse_events(url: str, body: dict[str, Any], timeout: float = 300) -> list[dict[str, Any]]:
    """POST a streamed request (stream forced true) and return its SSE events' JSON, [DONE]
    left out; raises urllib's HTTPError on a non-200 answer."""
    req = urllib.request.Request(url, data=json.dumps({**body, "stream": True}).encode())
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        lines = resp.read().decode().splitlines()
    return [json.loads(x[6:]) for x in lines if x.startswith("data: ") and x != "data: [DONE]"]


def get_json(url: str, timeout: float = 30) -> tuple[int, Any]:
    """GET JSON; (status, parsed body), HTTP errors included."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def scrape(base_url: str) -> dict[str, float]:
    """`name{labels}` -> value for every sample of base_url/metrics."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def _lower(items: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in items}


class ProcessExitedError(RuntimeError):
    """A child process died while we waited for it to become ready."""


@dataclass
class Proc:
    """A running child process (worker or proxy) and how to reach it."""

    name: str
    base_url: str
    log: Path
    proc: subprocess.Popen[bytes]
    model: str = ""
    side_port: int = 0

    def metrics(self) -> dict[str, float]:
        """`name{labels}` -> value for every sample of /metrics."""
        return scrape(self.base_url)

    def metric(self, name: str) -> float:
        return self.metrics().get(f'{name}{{model_name="{self.model}"}}', float("nan"))

    def pool_whole(self) -> bool:
        """Every KV block free or evictable: no request, lease or pull holds one."""
        m = self.metrics()
        label = f'{{model_name="{self.model}"}}'
        info = next(k for k in m if k.startswith("vllm:cache_config_info"))
        total = int(info.split('num_gpu_blocks="')[1].split('"')[0])
        return (
            m[f"loom:kv_free_blocks{label}"] == total
            and m[f"loom:kv_leases{label}"] == 0
            and m[f"loom:kv_pulls_in_flight{label}"] == 0
        )

    def kill(self) -> None:
        """SIGKILL: the worker dies without any cleanup."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
        self.proc.kill()
        self.proc.wait(timeout=30)

    def pause(self) -> None:
        """SIGSTOP: the process stops answering (its sockets still accept connections)."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGCONT)  # a paused process cannot handle SIGTERM
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def _ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> bool:
    if proc.poll() is not None:
        raise ProcessExitedError(f"exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


@contextmanager
def spawn(
    name: str,
    cmd: list[str],
    log: Path,
    url: str,
    ready_path: str,
    env: dict[str, str] | None = None,
) -> Iterator[Proc]:
    """Run `cmd` (with `env` added to ours) until the context ends; yields once GET
    url+ready_path answers 200."""
    env = {**os.environ, **WORKER_ENV, "LOOM_CACHE": str(log.parent / "cache"), **(env or {})}
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    handle = Proc(name, url, log, proc)
    try:
        poll(lambda: _ready(url + ready_path, proc, log), READY_TIMEOUT_S, f"{name} ready", 0.1)
        yield handle
    finally:
        handle.stop()


@dataclass(frozen=True)
class Launcher:
    """Starts `loom runtime` workers of one checkpoint, and P/D proxies, under one directory."""

    tmp: Path
    checkpoint: Path
    model: str = "tiny-pd"
    dtype: str = "float64"
    family: str = "llama"  # the card's family: llama | sparse-mla

    @contextmanager
    def worker(self, role: str, *flags: str, name: str | None = None) -> Iterator[Proc]:
        name = name or role
        card = self.tmp / f"{name}-card.yaml"
        text = CARD.format(name=self.model, path=self.checkpoint)
        card.write_text(text.replace("family: llama", f"family: {self.family}"))
        http, side = free_ports(2)
        cmd = [
            sys.executable, "-m", "loom_runtime", "runtime", "--card", str(card),
            "--role", role, "--port", str(http), "--kv-side-port", str(side),
            "--dtype", self.dtype, *flags,
        ]  # fmt: skip
        url = f"http://127.0.0.1:{http}"
        with spawn(name, cmd, self.tmp / f"{name}.log", url, "/ready") as proc:
            proc.model = self.model
            proc.side_port = side
            yield proc

    @contextmanager
    def proxy(self, prefill: Proc, decode: Proc, name: str = "proxy") -> Iterator[Proc]:
        (port,) = free_ports(1)
        cmd = [
            sys.executable, "-m", "loom_runtime.testing.pd_proxy", "--prefill", prefill.base_url,
            "--decode", decode.base_url, "--port", str(port),
        ]  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        with spawn(name, cmd, self.tmp / f"{name}.log", url, "/health") as proc:
            proc.model = self.model
            yield proc
