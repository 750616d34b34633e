"""The container process: a private mount namespace with the pod's volumes, and SIGTERM first."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from e2e.node_agent.container import ContainerProcess
from e2e.node_agent.ips import IPPool, IPPoolExhausted
from e2e.node_agent.volumes import Mount

needs_unshare = pytest.mark.skipif(
    shutil.which("unshare") is None, reason="needs util-linux unshare"
)


@needs_unshare
def test_volumes_are_bind_mounted_only_inside_the_container(tmp_path: Path) -> None:
    volume = tmp_path / "vol"
    volume.mkdir()
    (volume / "card.yaml").write_text("kind: ModelCard\n")
    target = f"/tmp/loom-e2e-mount-{tmp_path.name}"
    log = tmp_path / "c.log"
    env = {"PATH": "/usr/bin:/bin"}
    proc = ContainerProcess(
        ["cat", f"{target}/card.yaml"], env, tmp_path, [Mount(volume, target, True)], log
    )
    try:
        assert proc.wait(30.0) == 0, log.read_text()
        assert log.read_text() == "kind: ModelCard\n"
        assert not Path(target, "card.yaml").exists(), "the mount leaked out of the container"
    finally:
        shutil.rmtree(target, ignore_errors=True)


def test_stop_sends_sigterm_before_sigkill(tmp_path: Path) -> None:
    script = "trap 'echo got-term; exit 0' TERM; echo up; while true; do sleep 0.05; done"
    log = tmp_path / "c.log"
    proc = ContainerProcess(["sh", "-c", script], {"PATH": "/usr/bin:/bin"}, tmp_path, [], log)
    deadline = time.monotonic() + 10
    while "up" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.stop(10.0) == 0
    assert "got-term" in log.read_text()


def test_ip_pool_never_hands_out_one_address_twice() -> None:
    pool = IPPool("127.0.20.0/24")
    ips = {pool.take(str(i)) for i in range(253)}
    assert len(ips) == 253 and all(ip.startswith("127.0.20.") for ip in ips)
    with pytest.raises(IPPoolExhausted):
        pool.take("one-too-many")
    first = pool.take("0")  # a pod asking again keeps its address
    pool.release("0")
    assert pool.take("new") == first
    with pytest.raises(ValueError, match=r"127\.0\.0\.0/8"):
        IPPool("10.0.0.0/24")
