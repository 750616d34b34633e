"""Fixtures for router integration tests: real `loom runtime` workers (tiny checkpoint, float64,
KV events on) and real router processes, on free 127.0.0.1 ports, awaited by polling, always
stopped (loom_runtime.testing.processes does the spawning)."""

from __future__ import annotations

import http.client
import json
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from loom_operator.testing.router import router_command
from loom_runtime.models.tiny import init_tiny
from loom_runtime.testing.processes import CARD, Proc, free_ports, poll, scrape, spawn

MODEL = "tiny-router"
TOKEN = "admin-token"


@dataclass
class Worker:
    proc: Proc
    spec: dict[str, Any]
    """The endpoint as ROUTER.json / the admin API's PUT take it (plus "id")."""

    @property
    def id(self) -> str:
        return str(self.spec["id"])

    @property
    def url(self) -> str:
        return self.proc.base_url

    def counter(self, name: str) -> float:
        """Sum of every series of a worker metric (0 when absent)."""
        return sum(v for k, v in self.proc.metrics().items() if k.split("{")[0] == name)


class Stream:
    """A streamed response read event by event (http.client: the test controls the socket)."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        self.conn = conn
        self.resp = resp
        self.status = resp.status
        self.headers = {k.lower(): v for k, v in resp.getheaders()}
        self.comments: list[str] = []

    def events(self) -> Iterator[dict[str, Any]]:
        while True:
            line = self.resp.fp.readline()
            if not line:
                return
            line = line.strip()
            if line.startswith(b":"):
                self.comments.append(line[1:].decode().strip())
            elif line.startswith(b"data: "):
                data = line[6:].decode()
                if data == "[DONE]":
                    return
                yield json.loads(data)

    def close(self) -> None:
        self.conn.close()


def _request(url: str, method: str, body: Any, headers: dict[str, str]) -> urllib.request.Request:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    for k, v in headers.items():
        req.add_header(k, v)
    return req


def _call(req: urllib.request.Request, timeout: float) -> tuple[int, Any, dict[str, str]]:
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw, status, items = resp.read(), resp.status, resp.headers.items()
    except urllib.error.HTTPError as err:
        raw, status, items = err.read(), err.code, err.headers.items()
    try:
        body = json.loads(raw) if raw else None
    except ValueError:
        body = raw.decode()
    return status, body, {k.lower(): v for k, v in items}


@dataclass
class Router:
    proc: Proc
    admin_url: str
    log: Path
    token: str = TOKEN
    extra_headers: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.proc.base_url

    def post(
        self, path: str, body: Any, headers: dict[str, str] | None = None, timeout: float = 300
    ) -> tuple[int, Any, dict[str, str]]:
        all_headers = {**self.extra_headers, **(headers or {})}
        return _call(_request(self.url + path, "POST", body, all_headers), timeout)

    def get(
        self, path: str, headers: dict[str, str] | None = None
    ) -> tuple[int, Any, dict[str, str]]:
        return _call(_request(self.url + path, "GET", None, headers or {}), 30)

    def stream(
        self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> Stream:
        host, port = self.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=300)
        all_headers = {"Content-Type": "application/json", **self.extra_headers, **(headers or {})}
        conn.request("POST", path, json.dumps({**body, "stream": True}), all_headers)
        return Stream(conn, conn.getresponse())

    def admin(
        self, method: str, path: str, body: Any = None, token: str | None = None
    ) -> tuple[int, Any]:
        auth = {"Authorization": f"Bearer {self.token if token is None else token}"}
        status, doc, _ = _call(_request(self.admin_url + path, method, body, auth), 30)
        return status, doc

    def endpoints(self) -> dict[str, dict[str, Any]]:
        status, doc = self.admin("GET", "/admin/endpoints")
        assert status == 200, doc
        return {e["id"]: e for e in doc["endpoints"]}

    def metrics(self) -> dict[str, float]:
        return scrape(self.url)

    def metric(self, name: str, **labels: str) -> float:
        parts = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        return self.metrics().get(f"{name}{{{parts}}}" if parts else name, 0.0)

    def wait(self, check: Callable[[], bool], what: str, timeout: float = 30) -> None:
        poll(check, timeout, what, 0.05)

    def wait_fresh(self, ids: list[str]) -> None:
        """Until every endpoint in `ids` has a fresh /metrics scrape in the router."""

        def fresh() -> bool:
            m = self.metrics()
            return all(m.get(f'loom_router:scrape_stale{{endpoint="{i}"}}') == 0.0 for i in ids)

        self.wait(fresh, f"fresh scrapes of {ids}")


def worker_spec(
    name: str, url: str, role: str, version: str, kv: int | None, replay: int | None
) -> dict[str, Any]:
    return {
        "id": name,
        "url": url,
        "role": role,
        "weights_version": version,
        "kv_events": None if kv is None else f"tcp://127.0.0.1:{kv}",
        "kv_replay": None if replay is None else f"tcp://127.0.0.1:{replay}",
    }


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_tiny(tmp_path_factory.mktemp("router-tiny"), seed=0)


LaunchWorker = Callable[..., AbstractContextManager[Worker]]
LaunchRouter = Callable[..., AbstractContextManager[Router]]


@pytest.fixture(scope="module")
def launch_worker(tmp_path_factory: pytest.TempPathFactory, tiny: Path) -> LaunchWorker:
    """launch_worker(name, role="aggregated", *flags, version="v1", http_port=None,
    registered_version=None) -> a running worker (KV events on)."""
    tmp = tmp_path_factory.mktemp("workers")

    @contextmanager
    def start(
        name: str,
        role: str = "aggregated",
        *flags: str,
        version: str = "v1",
        http_port: int | None = None,
        registered_version: str | None = None,
        kv_events: bool = True,
    ) -> Iterator[Worker]:
        card = tmp / f"{name}-card.yaml"
        card.write_text(CARD.format(name=MODEL, path=tiny))
        ports = free_ports(3)
        http = http_port or ports[0]
        kv, replay, side = ports[1], ports[2], free_ports(1)[0]
        cmd = [
            sys.executable,
            "-m",
            "loom_runtime",
            "runtime",
            "--card",
            str(card),
            "--role",
            role,
            "--port",
            str(http),
            "--kv-side-port",
            str(side),
            "--dtype",
            "float64",
            "--weights-version",
            version,
            "--max-model-len",
            "2048",
            "--max-num-seqs",
            "8",
            *flags,
        ]
        if kv_events:
            cmd += ["--kv-events-port", str(kv), "--kv-events-replay-port", str(replay)]
        url = f"http://127.0.0.1:{http}"
        with spawn(name, cmd, tmp / f"{name}.log", url, "/ready") as proc:
            proc.model = MODEL
            spec = worker_spec(
                name,
                url,
                role,
                registered_version or version,
                kv if kv_events else None,
                replay if kv_events else None,
            )
            yield Worker(proc, spec)

    return start


@pytest.fixture(scope="module")
def launch_router(tmp_path_factory: pytest.TempPathFactory, tiny: Path) -> LaunchRouter:
    """launch_router(workers, router={...card spec.router}, failover={...}, flags=[...],
    config={...other ROUTER.json keys})."""
    tmp = tmp_path_factory.mktemp("routers")
    count = [0]

    @contextmanager
    def start(
        workers: list[Worker],
        router: dict[str, Any] | None = None,
        failover: dict[str, Any] | None = None,
        flags: tuple[str, ...] = (),
        tokenizer: bool = True,
        config: dict[str, Any] | None = None,
    ) -> Iterator[Router]:
        count[0] += 1
        name = f"router{count[0]}"
        config = {
            "model_name": MODEL,
            "tokenizer_path": str(tiny) if tokenizer else None,
            "block_size": 16,
            "hash_seed": "0",
            "hash_algo": "sha256_cbor",
            "router": router or {},
            "failover": failover or {},
            "endpoints": [w.spec for w in workers],
            **(config or {}),
        }
        path = tmp / f"{name}.json"
        path.write_text(json.dumps(config))
        port, admin = free_ports(2)
        flags = ("--scrape-interval", "0.05", "--log-level", "DEBUG", *flags)
        cmd = router_command(path, port, admin, TOKEN, *flags)
        log = tmp / f"{name}.log"
        with spawn(name, cmd, log, f"http://127.0.0.1:{port}", "/health") as proc:
            yield Router(proc, f"http://127.0.0.1:{admin}", log)

    return start


@pytest.fixture(scope="module")
def worker(launch_worker: Any) -> Iterator[Worker]:
    """One aggregated worker, "w0" (a module that needs others makes its own)."""
    with launch_worker("w0") as w:
        yield w


@pytest.fixture(scope="module")
def router(worker: Worker, launch_router: LaunchRouter) -> Iterator[Router]:
    """A router over `worker` alone."""
    with launch_router([worker]) as r:
        yield r
