"""`loom vllm-sidecar`: Loom's control calls over gRPC, mapped onto vLLM's own endpoints.

vLLM itself needs a GPU here, so the server behind the sidecar is a stand-in (a test double) that
implements exactly the vLLM 0.33.0 paths the sidecar calls, with vLLM's request shapes
(`/pause?mode=`, `/resume`, `/is_paused`, `/weight_info`, `/collective_rpc`,
`/update_weight_version`, `/reset_prefix_cache`, `/metrics`). The gRPC side is the runtime's real
control service, called by the operator's real client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from loom_operator.control.client import ControlClient, ControlError
from loom_runtime.serve.control_service import ControlService, ControlSettings, start_control_server
from loom_runtime.serve.vllm_sidecar import VllmEngine, VllmError, resolve_source, sample_sum

TOKEN = "t0ken"


@dataclass
class StandInVllm:
    """Test double of a vLLM 0.33.0 server's dev endpoints (VLLM_SERVER_DEV_MODE=1)."""

    in_flight: int = 0
    paused: bool = False
    version: str | None = None
    calls: list[tuple[str, Any]] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/is_paused", self.is_paused)
        app.router.add_get("/weight_info", self.weight_info)
        app.router.add_post("/pause", self.pause)
        app.router.add_post("/resume", self.resume)
        app.router.add_post("/collective_rpc", self.collective_rpc)
        app.router.add_post("/update_weight_version", self.update_weight_version)
        app.router.add_post("/reset_prefix_cache", self.reset)
        return app

    async def metrics(self, _: web.Request) -> web.Response:
        text = (
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{engine="0",model_name="tiny"}} {self.in_flight}.0\n'
            'vllm:num_requests_waiting{engine="0",model_name="tiny"} 0.0\n'
            'vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25\n'
        )
        return web.Response(text=text)

    async def is_paused(self, _: web.Request) -> web.Response:
        return web.json_response({"is_paused": self.paused})

    async def weight_info(self, _: web.Request) -> web.Response:
        return web.json_response({"weight_version": self.version})

    async def pause(self, request: web.Request) -> web.Response:
        mode = request.query.get("mode", "abort")
        self.calls.append(("pause", mode))
        self.paused = True
        if mode == "abort":
            self.in_flight = 0
        while mode == "wait" and self.in_flight:  # vLLM's wait: returns once drained
            await asyncio.sleep(0.05)
        return web.json_response({"status": "paused"})

    async def resume(self, _: web.Request) -> web.Response:
        self.calls.append(("resume", None))
        self.paused = False
        return web.json_response({"status": "resumed"})

    async def collective_rpc(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("collective_rpc", body))
        return web.Response(status=200)

    async def update_weight_version(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("update_weight_version", body))
        self.version = body["new_version"]
        return web.json_response({"success": True, "new_version": self.version})

    async def reset(self, _: web.Request) -> web.Response:
        self.calls.append(("reset_prefix_cache", None))
        return web.Response(status=200)


@dataclass
class Sidecar:
    vllm: StandInVllm
    client: ControlClient


def with_sidecar(scenario: Callable[[Sidecar], Awaitable[None]]) -> None:
    """Run `scenario` against a real control service in front of a stand-in vLLM."""

    async def main() -> None:
        vllm = StandInVllm()
        runner = web.AppRunner(vllm.app())
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        engine = VllmEngine(f"http://127.0.0.1:{port}", "v1", block_size=16)
        settings = ControlSettings(model_name="tiny", role="decode", drain_timeout_s=5.0,
                                   resolve_source=resolve_source, healthy=lambda: True)  # fmt: skip
        server, bound = await start_control_server(
            ControlService(engine, settings), "127.0.0.1", 0, TOKEN
        )
        client = ControlClient(f"127.0.0.1:{bound}", TOKEN)
        try:
            await asyncio.wait_for(scenario(Sidecar(vllm, client)), 60)
        finally:
            await client.close()
            await server.stop(0)
            await runner.cleanup()

    asyncio.run(main())


def test_status_reads_vllm_s_pause_state_version_and_load() -> None:
    with_sidecar(status_scenario)


async def status_scenario(sidecar: Sidecar) -> None:
    sidecar.vllm.in_flight = 3
    status = await sidecar.client.status()
    assert (status.weights_version, status.admission_open, status.in_flight) == ("v1", True, 3)
    assert status.num_running == 3 and status.kv_usage == 0.25 and status.role == "decode"


def test_a_sync_drains_reloads_from_disk_and_resumes(tmp_path: Path) -> None:
    with_sidecar(lambda sidecar: sync_scenario(sidecar, tmp_path))


async def sync_scenario(sidecar: Sidecar, tmp_path: Path) -> None:
    vllm = sidecar.vllm
    vllm.in_flight = 2

    async def finish_requests() -> None:
        await asyncio.sleep(0.3)
        vllm.in_flight = 0

    finishing = asyncio.create_task(finish_requests())
    paused = await sidecar.client.pause("wait", 5.0)
    await finishing
    assert not paused.admission_open and paused.in_flight == 0
    assert ("pause", "wait") in vllm.calls

    loaded = await sidecar.client.load_weights(f"file://{tmp_path}", "v2", 30.0)
    assert loaded.weights_version == "v2" and not loaded.admission_open
    rpc = next(body for name, body in vllm.calls if name == "collective_rpc")
    assert rpc["method"] == "reload_weights" and rpc["kwargs"] == {"weights_path": str(tmp_path)}
    names = [name for name, _ in vllm.calls]
    assert names.index("collective_rpc") < names.index("update_weight_version")
    assert names.index("update_weight_version") < names.index("reset_prefix_cache")

    resumed = await sidecar.client.resume()
    assert resumed.admission_open and resumed.weights_version == "v2"


def test_load_weights_is_refused_while_admitting_or_for_a_remote_source(tmp_path: Path) -> None:
    with_sidecar(lambda sidecar: refusal_scenario(sidecar, tmp_path))


async def refusal_scenario(sidecar: Sidecar, tmp_path: Path) -> None:
    with pytest.raises(ControlError, match="Pause first"):
        await sidecar.client.load_weights(f"file://{tmp_path}", "v2", 30.0)
    await sidecar.client.pause("abort", 0.0)
    with pytest.raises(ControlError, match="local directory"):
        await sidecar.client.load_weights("hf://org/model", "v2", 30.0)
    assert not any(name == "collective_rpc" for name, _ in sidecar.vllm.calls)


def test_a_pvc_source_reloads_from_where_the_pod_mounts_its_claim(tmp_path: Path) -> None:
    with pytest.raises(VllmError, match="/var/lib/loom/models/store/v2"):  # not mounted here
        resolve_source("pvc://store/v2")
    assert resolve_source(f"file://{tmp_path}") == tmp_path


def test_a_wrong_token_is_refused() -> None:
    with_sidecar(token_scenario)


async def token_scenario(sidecar: Sidecar) -> None:
    intruder = ControlClient(sidecar.client.target, "wrong")
    try:
        with pytest.raises(ControlError, match="UNAUTHENTICATED"):
            await intruder.status()
    finally:
        await intruder.close()


def test_metric_samples_are_summed_over_engines() -> None:
    text = 'vllm:num_requests_running{engine="0"} 2.0\nvllm:num_requests_running{engine="1"} 3.0\n'
    assert sample_sum(text, "vllm:num_requests_running") == 5.0
    assert sample_sum(text, "vllm:num_requests_waiting") is None
