"""The controller's hold on a real router's endpoint table (`python -m loom_router`):
registering, draining, marking down and up, migrating and removing are idempotent, a changed
address or version is re-registered, and the view matches what the router reports."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from loom_operator.control.router_admin import RouterAdmin, RouterAdminError
from loom_operator.local.launch import LaunchOptions, router_argv, router_env
from loom_operator.local.ports import free_ports
from loom_operator.local.routing import RouterLink
from loom_operator.testing.fleet import wait_for
from loom_runtime.wire.router_admin import EndpointSpec

TOKEN = "admin-token"


@pytest.fixture
def admin_url(tmp_path: Path, child_env: dict[str, str]) -> Iterator[str]:
    config = tmp_path / "router.json"
    config.write_text(json.dumps({"model_name": "tiny", "tokenizer_path": None, "endpoints": []}))
    port, admin = free_ports(2)
    argv = router_argv(config, port, admin, LaunchOptions(python=sys.executable))
    log = (tmp_path / "router.log").open("wb")
    proc = subprocess.Popen(argv, env=router_env(child_env, TOKEN), stdout=log, stderr=log)
    url = f"http://127.0.0.1:{admin}"
    try:

        def answers() -> bool:
            assert proc.poll() is None, (tmp_path / "router.log").read_text()
            return asyncio.run(answers_once(url))

        wait_for(answers, 60, "the router's admin API")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


async def answers_once(url: str) -> bool:
    admin = RouterAdmin(url, TOKEN)
    try:
        await admin.endpoints()
        return True
    except RouterAdminError:
        return False
    finally:
        await admin.close()


def spec(version: str = "v1", port: int = 9) -> EndpointSpec:
    return EndpointSpec(f"http://127.0.0.1:{port}", "decode", version, None, None)


def test_router_link_keeps_the_table_in_step(admin_url: str) -> None:
    async def scenario() -> None:
        link = RouterLink(RouterAdmin(admin_url, TOKEN))
        try:
            assert await link.refresh() and link.view == {}
            await link.route_on("w0", spec())
            await link.refresh()
            e = link.view["w0"]
            assert (e.spec.url, e.spec.role, e.spec.weights_version, e.draining) == (
                "http://127.0.0.1:9",
                "decode",
                "v1",
                False,
            )
            assert await link.drain("w0") is True
            await link.refresh()
            assert link.view["w0"].draining and not link.routed("w0")
            assert await link.drain("w0") is False  # already draining: no call
            await link.route_on("w0", spec("v2"))  # new version: re-registered, undrained
            await link.refresh()
            e = link.view["w0"]
            assert (e.spec.weights_version, e.draining) == ("v2", False)
            await link.down("w0")
            await link.refresh()
            assert link.view["w0"].down and not link.view["w0"].down_by_router
            await link.migrate("w0")
            await link.route_on("w1", spec(port=10))
            await link.remove_unknown({"w1"})
            await link.refresh()
            assert set(link.view) == {"w1"}
            await link.remove("w1")
            await link.remove("w1")  # idempotent
            await link.refresh()
            assert link.view == {}
            bad = RouterAdmin(admin_url, "wrong")
            with pytest.raises(RouterAdminError) as err:
                await bad.endpoints()
            await bad.close()
            assert err.value.status == 401
        finally:
            await link.admin.close()

    asyncio.run(scenario())
