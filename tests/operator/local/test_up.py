"""`loom up` end to end with real processes (router + workers): it prints a working endpoint,
`loom status` shows the fleet, `loom apply` scales it, a killed worker or router comes back, a
broken card edit is refused while the fleet keeps serving, a restarted controller adopts running
workers, Ctrl-C drains requests in flight before stopping, and `loom down` stops a fleet from
another shell — leaving no process behind."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from loom_operator.local.process import pid_alive
from loom_operator.local.state import ProcessTable, StatePaths, controller_running, load_processes
from loom_operator.testing.cards import card_text
from loom_operator.testing.fleet import FleetProcess, run_fleet, wait_for

SETTLE_S = 180.0
ROOT = Path(__file__).resolve().parents[3]


def loom(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loom_operator.cli", *args],
        capture_output=True, text=True, env=env, timeout=240,
    )  # fmt: skip


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory,
    checkpoints: tuple[Path, Path],
    child_env: dict[str, str],
) -> Iterator[FleetProcess]:
    root = tmp_path_factory.mktemp("up")
    card = root / "card.yaml"
    card.write_text(card_text(f"file://{checkpoints[0]}", name="up"))
    with run_fleet(card, root / "state", child_env) as f:
        yield f


def test_up_prints_an_endpoint_that_serves_its_curl_line(fleet: FleetProcess) -> None:
    out = fleet.output()
    assert f"OpenAI endpoint: {fleet.endpoint}" in out
    curl = next(line.strip() for line in out.splitlines() if line.strip().startswith("curl "))
    reply = json.loads(subprocess.run(curl, shell=True, capture_output=True, text=True,
                                      timeout=60, check=True).stdout)  # fmt: skip
    assert reply["system_fingerprint"] == "v1"
    assert reply["choices"][0]["text"] and reply["usage"]["completion_tokens"] == 16
    status = next(line.split("  (")[0].strip() for line in out.splitlines() if " status " in line)
    ran = subprocess.run(status, shell=True, capture_output=True, text=True, timeout=120,
                         env=dict(fleet.env))  # fmt: skip
    assert ran.returncode == 0 and "Ready" in ran.stdout, (status, ran.stdout, ran.stderr)
    assert any(" down --state-dir " in line for line in out.splitlines())
    assert any(" apply " in line and "--state-dir" in line for line in out.splitlines())


def test_status_shows_workers_and_conditions(
    fleet: FleetProcess, child_env: dict[str, str]
) -> None:
    shown = loom("status", "--state-dir", str(fleet.state.root), "--json", env=child_env)
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    assert doc["controller_running"] is True
    (w,) = doc["workers"]
    assert (w["name"], w["role"], w["version"], w["state"]) == (
        "up-aggregated-0",
        "aggregated",
        "v1",
        "serving",
    )
    assert w["ready"] and w["routed"] and w["kv_free_blocks"] == w["kv_blocks"] > 0
    ready = next(c for c in doc["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "AllReplicasReady")
    table = loom(
        "status", "--state-dir", str(fleet.state.root), env={**child_env, "COLUMNS": "200"}
    )
    assert "up-aggregated-0" in table.stdout and "AllReplicasReady" in table.stdout


def test_apply_scales_up_then_down(
    fleet: FleetProcess, checkpoints: tuple[Path, Path], child_env: dict[str, str], tmp_path: Path
) -> None:
    card = tmp_path / "two.yaml"
    card.write_text(card_text(f"file://{checkpoints[0]}", name="up", roles={"aggregated": 2}))
    applied = loom("apply", str(card), "--state-dir", str(fleet.state.root), env=child_env)
    assert applied.returncode == 0 and "aggregated ×2" in applied.stdout, applied.stdout
    two = fleet.wait(lambda s: len(s.workers) == 2 and all(w.ready and w.routed for w in s.workers),
                     SETTLE_S, "a second worker")  # fmt: skip
    extra = next(w for w in two.workers if w.name == "up-aggregated-1")
    card.write_text(card_text(f"file://{checkpoints[0]}", name="up", roles={"aggregated": 1}))
    assert (
        loom("apply", str(card), "--state-dir", str(fleet.state.root), env=child_env).returncode
        == 0
    )
    one = fleet.wait(
        lambda s: [w.name for w in s.workers] == ["up-aggregated-0"], SETTLE_S, "scale-down"
    )
    wait_for(lambda: not pid_alive(extra.pid, None), 60, "the extra worker to exit")
    assert one.workers[0].restarts == 0
    fleet.wait_settled(SETTLE_S)


def test_killed_worker_is_restarted_with_backoff(fleet: FleetProcess) -> None:
    victim = fleet.wait_settled(SETTLE_S).workers[0]
    os.kill(victim.pid, signal.SIGKILL)
    back = fleet.wait(lambda s: s.workers[0].restarts == victim.restarts + 1 and s.workers[0].ready
                      and s.workers[0].routed, SETTLE_S, "the restart")  # fmt: skip
    assert back.workers[0].pid != victim.pid
    out = fleet.output()
    assert f"{victim.name} exited (exit status -9)" in out
    assert re.search(rf"restarted {victim.name} on v1 \(attempt \d+, after \d+s\)", out)
    assert "Degraded True (WorkerFailed)" in out
    settled = fleet.wait_settled(SETTLE_S)
    assert settled.condition("Degraded").status == "False"  # type: ignore[union-attr]


def test_a_killed_router_is_restarted_on_the_same_port(fleet: FleetProcess) -> None:
    before = fleet.wait_settled(SETTLE_S)
    os.kill(before.router_pid, signal.SIGKILL)
    after = fleet.wait(
        lambda s: (
            s.router_pid not in (0, before.router_pid)
            and all(w.ready and w.routed for w in s.workers)
        ),
        SETTLE_S,
        "the router's restart",
    )
    assert "the router exited; restarting it" in fleet.output()
    assert after.endpoint == before.endpoint
    request = urllib.request.Request(
        f"{fleet.endpoint}/completions",
        data=json.dumps({"model": "tiny", "prompt": "hello", "max_tokens": 4}).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        assert json.load(reply)["usage"]["completion_tokens"] == 4


def test_a_broken_card_edit_is_refused_and_the_fleet_keeps_serving(fleet: FleetProcess) -> None:
    good = fleet.card.read_text()
    try:
        fleet.edit_card(good.replace("replicas: 1", "replicas: many"))
        wait_for(lambda: "not applied, still serving the previous card" in fleet.output(), 60,
                 "the refusal")  # fmt: skip
        assert "replicas" in fleet.output().split("not applied")[-1]
        assert fleet.wait_settled(SETTLE_S).workers[0].version == "v1"
    finally:
        fleet.edit_card(good)


def test_restarted_controller_adopts_and_down_stops_leftovers(
    fleet: FleetProcess, child_env: dict[str, str]
) -> None:
    before = fleet.wait_settled(SETTLE_S)
    fleet.kill_controller()
    assert all(pid_alive(w.pid, None) for w in before.workers)  # workers outlive the controller
    fleet.start()
    after = fleet.wait_settled(SETTLE_S)
    assert [(w.name, w.pid, w.restarts) for w in after.workers] == [
        (w.name, w.pid, w.restarts) for w in before.workers
    ]
    assert (
        "adopted 1 running worker(s)" in fleet.output() and "adopted the router" in fleet.output()
    )
    fleet.kill_controller()
    down = loom("down", "--state-dir", str(fleet.state.root), env=child_env)
    assert down.returncode == 0 and "no controller was running" in down.stdout, down.stdout
    assert fleet.leftovers() == []


def test_ctrl_c_finishes_requests_in_flight_then_stops_everything(
    checkpoints: tuple[Path, Path], child_env: dict[str, str], tmp_path: Path
) -> None:
    from openai import OpenAI

    card = tmp_path / "card.yaml"
    card.write_text(card_text(f"file://{checkpoints[0]}", name="drain"))
    with run_fleet(card, tmp_path / "state", child_env) as fleet:
        client = OpenAI(base_url=fleet.endpoint, api_key="unused", max_retries=0, timeout=120)
        result: dict[str, object] = {}
        started = threading.Event()

        def long_request() -> None:
            stream = client.completions.create(model="tiny", prompt="Once", max_tokens=300,
                                               temperature=0, stream=True)  # fmt: skip
            chunks: list[str] = []
            for event in stream:
                started.set()
                chunks.extend(c.text for c in event.choices if c.text)
            result["chunks"] = len(chunks)

        t = threading.Thread(target=long_request)
        t.start()
        assert started.wait(60)
        assert fleet.interrupt() == 0
        t.join(60)
        assert result.get("chunks") == 300  # finished whole, though Ctrl-C came mid-way
        assert fleet.leftovers() == []
        assert "Loom: stopped." in fleet.output()
        status = fleet.status()
        assert status is not None and status.stopped and status.workers == ()


def test_readme_snippets_work_against_make_run_card(
    child_env: dict[str, str], tmp_path: Path
) -> None:
    """`make run` serves examples/tiny-pd.yaml; the README's curl and openai snippets work."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^CARD\s*\?= examples/tiny-pd\.yaml$", makefile, re.M)
    assert "$(BIN)/loom up $(CARD) --port $(PORT)" in makefile
    curl = re.search(r"```bash\n(curl .*?)```", section, re.S)
    python = re.search(r"```python\n(.*?)```", section, re.S)
    assert curl and python
    with run_fleet(ROOT / "examples/tiny-pd.yaml", tmp_path / "state", child_env) as fleet:
        port = str(fleet.port)
        out = subprocess.run(curl.group(1).replace("8000", port), shell=True, capture_output=True,
                             text=True, timeout=120, check=True)  # fmt: skip
        assert json.loads(out.stdout)["choices"][0]["text"]
        code = python.group(1).replace("8000", port)
        ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120, env=child_env)  # fmt: skip
        assert ran.returncode == 0 and ran.stdout.strip(), ran.stderr
        down = loom("down", "--state-dir", str(fleet.state.root), env=child_env)
        assert down.returncode == 0 and "stopped" in down.stdout, down.stdout
        assert fleet.proc is not None and fleet.proc.wait(timeout=60) == 0
        assert fleet.leftovers() == []


def test_up_refuses_a_taken_port_and_a_bad_card_cleanly(
    checkpoints: tuple[Path, Path], child_env: dict[str, str], tmp_path: Path
) -> None:
    card = tmp_path / "card.yaml"
    card.write_text(card_text(f"file://{checkpoints[0]}", name="taken"))
    state = tmp_path / "state"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = str(s.getsockname()[1])
        up = loom("up", str(card), "--state-dir", str(state), "--port", port, env=child_env)
    assert up.returncode == 1 and f"port {port} (the fleet's endpoint) is in use" in up.stdout
    assert not controller_running(StatePaths(state))
    assert load_processes(StatePaths(state)) == ProcessTable()
    assert not state.exists(), "a failed start leaves no state folder (finding 4)"
    assert "its logs are in" in up.stdout
    card.write_text(card_text("hf://org/model", name="taken"))
    bad = loom("up", str(card), "--state-dir", str(state), env=child_env)
    assert bad.returncode == 2 and "loads local checkpoints only" in bad.stdout
