"""One pod on a stand-in node: its volumes, its containers as processes, probes and status.

Owns the pod's lifecycle from bind to final delete (restarts with back-off, graceful
termination, status patches); never picks nodes or IPs (the agent does) and never shares
state with another pod's runner.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from e2e.node_agent.container import ContainerProcess
from e2e.node_agent.env import EnvError, Lookup, container_env, expand
from e2e.node_agent.probes import ProbeState, run_probe
from e2e.node_agent.status import ContainerView, Terminated, pod_status, restart_backoff
from e2e.node_agent.volumes import Mount, TokenRequest, materialise, mounts
from loom_operator.k8s.kube import STRATEGIC, Kube, KubeError, pod_path

logger = logging.getLogger(__name__)

TICK_S = 0.25
BACKOFF_RESET_S = 600.0  # a container that ran this long starts its back-off afresh


@dataclass
class Settings:
    """What every runner of one agent shares."""

    root: Path  # per-pod folders live under root/<namespace>_<name>_<uid>
    api_server: tuple[str, int]
    backoff_base_s: float = 10.0
    env: dict[str, str] = field(default_factory=dict)  # the environment pods inherit


@dataclass
class _Container:
    spec: dict[str, Any]
    view: ContainerView
    proc: ContainerProcess | None = None
    env: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    restart_at: float = 0.0
    backoff_restarts: int = 0
    probes: dict[str, ProbeState] = field(default_factory=dict)


class PodRunner:
    """Runs one pod on a thread of its own (`start`, `terminate`, `join`)."""

    def __init__(
        self,
        kube: Kube,
        pod: dict[str, Any],
        pod_ip: str,
        settings: Settings,
        lookup: Lookup,
        token: TokenRequest,
        on_exit: Callable[[str], None],
    ) -> None:
        meta = pod["metadata"]
        self.name = f"pod-{meta['namespace']}/{meta['name']}"
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self.kube, self.pod, self.ip, self.settings = kube, pod, pod_ip, settings
        self.uid: str = meta["uid"]
        self._lookup, self._token, self._on_exit = lookup, token, on_exit
        self.dir = settings.root / f"{meta['namespace']}_{meta['name']}_{self.uid[:8]}"
        self._halt = threading.Event()
        self._grace_s = float(pod["spec"].get("terminationGracePeriodSeconds", 30))
        self._delete_after = True
        self._containers = [
            _Container(c, ContainerView(c["name"], c.get("image", ""), "waiting"))
            for c in pod["spec"]["containers"]
        ]
        self._start_time = time.time()
        self._last_status: dict[str, Any] | None = None

    # -- control, from the agent's thread ---------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    def terminate(self, grace_s: float, delete: bool = True) -> None:
        """Stop the pod's containers (SIGTERM, grace, SIGKILL); then delete the pod if asked."""
        self._grace_s, self._delete_after = grace_s, delete
        self._halt.set()

    # -- the runner's own thread ------------------------------------------------------------
    def _run(self) -> None:
        try:
            if self._setup():
                while not self._halt.is_set():
                    self._tick(time.time())
                    self._halt.wait(TICK_S)
            self._shutdown()
        except Exception:  # the runner must never die silently with processes left behind
            logger.exception("pod runner failed: %s", self.name)
            self._kill_all(0.0)
        finally:
            self._on_exit(self.uid)

    def _setup(self) -> bool:
        """Volumes and env; retried (as the kubelet does) until they resolve or the pod goes."""
        while not self._halt.is_set():
            try:
                folders = materialise(
                    self.dir / "volumes", self.pod, self.ip, self._lookup, self._token
                )
                for c in self._containers:
                    c.mounts = mounts(c.spec, folders)
                    c.env = container_env(
                        c.spec, self.pod, self.ip, self._lookup, self.settings.api_server
                    )
                return True
            except (EnvError, KeyError) as exc:
                for c in self._containers:
                    c.view = replace(c.view, reason="CreateContainerConfigError", message=str(exc))
                self._report()
                self._halt.wait(2.0)
        return False

    def _start(self, c: _Container, now: float) -> None:
        env = {**self.settings.env, **c.env}
        argv = [expand(a, env) for a in (c.spec.get("command") or []) + (c.spec.get("args") or [])]
        if not c.spec.get("command"):
            c.view = replace(
                c.view,
                reason="CreateContainerError",
                message="the stand-in kubelet runs no images: the container needs a command",
            )
            c.restart_at = float("inf")
            return
        cwd = Path(c.spec.get("workingDir") or self.dir / "work" / c.spec["name"])
        log = self.dir / f"{c.spec['name']}.log"
        c.proc = ContainerProcess(argv, env, cwd, c.mounts, log)
        ready = "readinessProbe" not in c.spec
        started = "startupProbe" not in c.spec
        c.view = replace(
            c.view, state="running", reason="", message="", pid=c.proc.pid, started_at=now,
            ready=ready and started, started=started, terminated=None,
        )  # fmt: skip
        c.probes = {
            kind: ProbeState(c.spec[kind], now)
            for kind in ("startupProbe", "readinessProbe", "livenessProbe")
            if kind in c.spec
        }
        self._event("Started", f"Started container {c.spec['name']}")

    def _tick(self, now: float) -> None:
        policy = self.pod["spec"].get("restartPolicy", "Always")
        for c in self._containers:
            if c.proc is None:
                if now >= c.restart_at:
                    self._start(c, now)
                continue
            code = c.proc.exit_code()
            if code is None:
                self._probe(c, now)
                continue
            self._exited(c, code, now, policy)
        self._report()

    def _exited(self, c: _Container, code: int, now: float, policy: str) -> None:
        assert c.proc is not None
        ran = Terminated(code, "Completed" if code == 0 else "Error", c.view.started_at, now)
        c.proc = None
        if policy == "Never" or (policy == "OnFailure" and code == 0):
            c.view = replace(c.view, state="terminated", ready=False, terminated=ran, pid=0)
            c.restart_at = float("inf")
            return
        if now - ran.started_at >= BACKOFF_RESET_S:
            c.backoff_restarts = 0
        delay = (
            0.0
            if c.backoff_restarts == 0
            else restart_backoff(c.backoff_restarts, self.settings.backoff_base_s)
        )
        c.backoff_restarts += 1
        c.restart_at = now + delay
        c.view = replace(
            c.view, state="waiting", ready=False, started=False, pid=0, last=ran,
            restart_count=c.view.restart_count + 1,
            reason="CrashLoopBackOff" if delay else "ContainerCreating",
            message=f"back-off {delay:.0f}s restarting failed container={c.spec['name']}"
            if delay else "",
        )  # fmt: skip
        if delay:
            self._event("BackOff", c.view.message, "Warning")

    def _probe(self, c: _Container, now: float) -> None:
        assert c.proc is not None
        ports = c.spec.get("ports") or []
        startup = c.probes.get("startupProbe")
        started = startup is None or startup.ok
        for kind, state in c.probes.items():
            # The startup probe runs until it succeeds; readiness and liveness only after.
            if (kind == "startupProbe") != started and state.due(now):
                state.record(now, run_probe(state.spec, self.ip, ports, c.proc.pid))
        started = startup is None or startup.ok
        readiness = c.probes.get("readinessProbe")
        ready = started and (readiness is None or readiness.ok)
        c.view = replace(c.view, started=started, ready=ready)
        for kind in ("startupProbe", "livenessProbe"):
            probe = c.probes.get(kind)
            if probe is not None and probe.failed:
                self._event("Unhealthy", f"{kind} failed; restarting {c.spec['name']}", "Warning")
                grace = float(self.pod["spec"].get("terminationGracePeriodSeconds", 30))
                c.proc.stop(grace)
                return

    def _report(self) -> None:
        status = pod_status(
            [c.view for c in self._containers],
            self.pod["spec"].get("restartPolicy", "Always"),
            self.ip,
            self._start_time,
            self._scheduled_condition(),
            self._last_status,
        )
        if status == self._last_status:
            return
        meta = self.pod["metadata"]
        try:
            self.kube.patch(
                pod_path(meta["namespace"], meta["name"], "status"), {"status": status}, STRATEGIC
            )
            self._last_status = status
        except KubeError as exc:
            if exc.status == 404:
                self._halt.set()  # gone without a graceful delete (force delete)
                self._grace_s = 0.0
            else:
                logger.warning("status patch of %s failed: %s", self.name, exc.message)

    def _scheduled_condition(self) -> dict[str, Any] | None:
        for cond in (self.pod.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled":
                return dict(cond)
        return None

    def _kill_all(self, grace_s: float) -> None:
        running = [c for c in self._containers if c.proc is not None]
        for c in running:
            assert c.proc is not None
            c.proc.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for c in running:
            assert c.proc is not None
            c.proc.stop(max(deadline - time.monotonic(), 0.0))
            c.proc = None

    def _shutdown(self) -> None:
        if self._delete_after:
            self._event("Killing", "Stopping container(s)")
        self._kill_all(self._grace_s)
        shutil.rmtree(self.dir / "volumes", ignore_errors=True)
        if not self._delete_after:
            return
        meta = self.pod["metadata"]
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}}
        try:
            self.kube.delete(pod_path(meta["namespace"], meta["name"]), body)
        except KubeError as exc:
            if exc.status not in (404, 409):
                logger.warning("final delete of %s failed: %s", self.name, exc.message)

    def _event(self, reason: str, message: str, kind: str = "Normal") -> None:
        meta = self.pod["metadata"]
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "kind": "Pod", "name": meta["name"], "namespace": meta["namespace"],
                "uid": self.uid, "apiVersion": "v1",
            },
            "reason": reason, "message": message, "type": kind,
            "source": {"component": "kubelet", "host": self.pod["spec"].get("nodeName", "")},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }  # fmt: skip
        with contextlib.suppress(KubeError, OSError):
            self.kube.create(f"/api/v1/namespaces/{meta['namespace']}/events", body)
