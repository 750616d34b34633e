"""The operator at scale, by simulation: time for DeploymentCards to converge, what a reconcile
costs in time and API requests, and the operator's memory, at 1, 10 and 100 cards.

The e2e harness's real control plane (docs/e2e.md) in its own state folder
(.cache/e2e/operator-scale: no test cluster is touched), without the stand-in kubelet: 100 kwok
nodes of `nvidia.com/gpu: 8` take the workers and 3 untainted kwok nodes the routers; kwok marks
each bound pod Running and Ready and nothing serves. Per scale: a fresh namespace, `loom
operator` watching it (the CLI's own `main`, leader election on, in a child process whose
handlers are timed), the ModelCard (waited to Valid), then N DeploymentCards at once, shaped like
examples/glm-5-class.yaml but small (1 prefill + 1 decode replica of 2 GPUs: 100 cards take 400
of the 800 GPUs); scale 1 also runs the big card (8 prefill + 64 decode of 8 GPUs). A card has
converged when its status has a current observedGeneration, every role ready = desired, and a
phase in --expect-phase (kwok pods never serve, so a card whose Ready needs routable workers
stays Progressing). Reported per scale:

  converge_s    first create -> every card converged (card_p50_s: the median card)
  handlers      per kopf handler (and per daemon round, ROUNDS): calls, seconds p50/p90/max,
                Kube API requests per call by verb (tallied through a context variable)
  requests      the operator's Kube client by HTTP method (its `requests` counter; leader
                election included) while converging, and per card per second over --steady-s
  rss_mib       the operator's resident memory once started, and its peak (VmHWM)

kopf's own client (watches, kopf's status and annotation patches) and the gRPC and HTTP probes
of pods are not counted. Usage (writes bench/results/operator_scale.json):

    .venv/bin/python bench/operator_scale.py --scales 1,10,100
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import functools
import inspect
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # e2e (the harness) is imported from the repository root

from e2e.cluster import control_plane, kwok  # noqa: E402
from e2e.providers import Cluster, node_ready  # noqa: E402
from e2e.tools import ensure_tools  # noqa: E402

from loom_operator.k8s.kube import APPLY, RESOURCES, Kube, object_path  # noqa: E402

STATE = ROOT / ".cache" / "e2e" / "operator-scale"
GPU_NODES, ROUTER_NODES = 100, 3
GPU_NODE = {"nvidia.com/gpu": "8", "cpu": "128", "memory": "2Ti"}
ROUTER_NODE = {"cpu": "64", "memory": "256Gi"}
PLURALS = {plural for _, plural in RESOURCES.values()} | {"leases", "events"}
ROUNDS = {"_fleet_round": "fleet_round"}
"""Functions of loom_operator.k8s.handlers that a daemon calls once per round, timed as such."""
START = time.monotonic()
_TALLY: contextvars.ContextVar[Counter[str] | None] = contextvars.ContextVar("tally", default=None)


def say(text: str) -> None:
    print(f"[{time.monotonic() - START:7.1f}s] {text}", flush=True)


def wait(probe: Callable[[], Any], timeout: float, what: str, interval: float = 1.0) -> Any:
    """Polls `probe` until it returns something truthy other than a string (a string says what
    is still missing, and goes into the error when `timeout` passes)."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        last = probe()
        if last and not isinstance(last, str):
            return last
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what} ({last})")


def glm_docs() -> list[dict[str, Any]]:
    return list(yaml.safe_load_all((ROOT / "examples" / "glm-5-class.yaml").read_text()))


def small_card(name: str) -> dict[str, Any]:
    """glm-5-class with one 2-GPU replica per role (CPU and memory scaled with the GPUs)."""
    card = glm_docs()[1]
    card["metadata"] = {"name": name}
    roles = card["spec"]["roles"]
    roles["prefill"]["parallelism"] = {"dp": 1, "tp": 1, "pcp": 2, "dcp": 2, "ep": 2}
    roles["decode"]["parallelism"] = {"dp": 2, "tp": 1, "ep": 2}
    for role in roles.values():
        role["replicas"], role["resources"] = 1, {"cpu": 24, "memory": "250Gi", "gpus": 2}
    return card


def big_card() -> dict[str, Any]:
    card = glm_docs()[1]
    card["spec"]["roles"]["prefill"]["replicas"] = 8
    card["spec"]["roles"]["decode"]["replicas"] = 64
    return card


# --- the operator, in a child process ----------------------------------------------------------


def verb(method: str, path: str, content_type: str) -> str:
    if method == "GET":
        return "list" if path.rstrip("/").rsplit("/", 1)[-1] in PLURALS else "get"
    if method == "PATCH":
        return "apply" if content_type == APPLY else "patch"
    return {"POST": "create", "PUT": "update", "DELETE": "delete"}.get(method, method)


class Recorder:
    """In the child: one record per handler call (seconds, requests by verb, error), and the
    operator's Kube client, whose `call` it wraps once to tally requests to the call in hand."""

    def __init__(self) -> None:
        self.lock, self.records = threading.Lock(), list[dict[str, Any]]()
        self.kube: Kube | None = None

    def _found(self, kube: Kube) -> None:
        if self.kube is not None:
            return
        self.kube, inner = kube, kube.call

        def call(method: str, path: str, *args: Any, **kwargs: Any) -> Any:
            if (tally := _TALLY.get()) is not None:
                tally[verb(method, path, kwargs.get("content_type", "application/json"))] += 1
            return inner(method, path, *args, **kwargs)

        kube.call = call  # type: ignore[method-assign]

    @contextlib.contextmanager
    def _record(
        self, handler: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Iterator[None]:
        if (kube := getattr(kwargs.get("memo"), "kube", None)) is not None:
            self._found(kube)
        body = next((a for a in args if hasattr(a, "metadata")), kwargs.get("body"))
        tally: Counter[str] = Counter()
        token, began, error = _TALLY.set(tally), time.monotonic(), ""
        try:
            yield
        except BaseException as exc:
            error = repr(exc)[:300]
            raise
        finally:
            _TALLY.reset(token)
            card, seconds = body and str(body.metadata.name), time.monotonic() - began
            record = {"handler": handler, "card": card, "s": seconds, "requests": dict(tally),
                      "error": error}  # fmt: skip
            with self.lock:
                self.records.append(record)

    def timed(self, handler: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                with self._record(handler, args, kwargs):
                    return await fn(*args, **kwargs)

            return run_async

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with self._record(handler, args, kwargs):
                return fn(*args, **kwargs)

        return run

    def instrument(self, handlers: Any) -> None:
        """Every change and timer handler, and each round of a daemon (a daemon never returns:
        what it does outside its rounds shows only in the client's totals)."""
        import kopf

        for name, label in ROUNDS.items():
            if hasattr(handlers, name):
                setattr(handlers, name, self.timed(label, getattr(handlers, name)))
        registry = kopf.get_default_registry()
        for part in (registry._changing, registry._spawning):
            for h in part.get_all_handlers():
                if type(h).__name__ != "DaemonHandler":
                    object.__setattr__(h, "fn", self.timed(str(h.id).split("/")[0], h.fn))

    def serve(self, conn: Connection) -> None:
        """Answers each request with the records since the last one and the client's totals."""
        with contextlib.suppress(EOFError):
            while conn.recv():
                with self.lock:
                    batch, self.records = self.records, []
                totals: dict[str, int] = dict(self.kube.requests) if self.kube else {}
                conn.send({"records": batch, "totals": totals})


def operator_main(conn: Connection, kubeconfig: str, namespace: str, log: str) -> None:
    """The child: `loom operator` with its handlers timed, its output in `log`."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    from loom_operator.cli import main
    from loom_operator.k8s import handlers  # the import registers the handlers with kopf

    recorder = Recorder()
    recorder.instrument(handlers)
    threading.Thread(target=recorder.serve, args=(conn,), daemon=True).start()
    sys.exit(main(["operator", "--kubeconfig", kubeconfig, "--namespace", namespace,
                   "--kv-connector", "tcp"]))  # fmt: skip


class OperatorProcess:
    def __init__(self, kubeconfig: Path, namespace: str, log: Path) -> None:
        # kopf logs in through the kubernetes library, which reads $KUBECONFIG when imported:
        # before `loom operator --kubeconfig` sets it. The child inherits it from here.
        os.environ["KUBECONFIG"] = str(kubeconfig)
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.log, self.records = log, list[dict[str, Any]]()
        self.proc = ctx.Process(target=operator_main, daemon=True,
                                args=(child, str(kubeconfig), namespace, str(log)))  # fmt: skip
        self.proc.start()

    def stats(self) -> dict[str, int]:
        """Collects the new handler records; the client's request totals by method."""
        if not self.proc.is_alive():
            raise RuntimeError(f"the operator exited ({self.proc.exitcode}); see {self.log}")
        self.conn.send("stats")
        if not self.conn.poll(30):
            raise TimeoutError(f"the operator did not report its stats in 30 s; see {self.log}")
        out = self.conn.recv()
        self.records += out["records"]
        return dict(out["totals"])

    def memory_mib(self) -> dict[str, float]:
        """VmRSS (now) and VmHWM (the peak) of the operator process."""
        out = {}
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = round(int(value.split()[0]) / 1024, 1)
        return out

    def stop(self, timeout: float = 20.0) -> float | None:
        """SIGTERM; the seconds it took to exit, or None when it was killed after `timeout`."""
        t0 = time.monotonic()
        self.proc.terminate()
        self.proc.join(timeout)
        if not self.proc.is_alive():
            return time.monotonic() - t0
        say(f"the operator did not exit {timeout:.0f} s after SIGTERM; killing it")
        self.proc.kill()
        self.proc.join(10)
        return None


# --- the cluster -------------------------------------------------------------------------------


def start_cluster(root: Path) -> Cluster:
    say(f"starting the control plane under {root.relative_to(ROOT)}")
    state = control_plane.up(root)
    cluster = Cluster("local", Path(state.kubeconfig), ensure_tools(), False, root)
    say(f"registering {GPU_NODES} kwok nodes of 8 GPUs and {ROUTER_NODES} for the routers")
    nodes = cluster.add_fake_nodes(GPU_NODES, GPU_NODE)
    for name in kwok.add_nodes(cluster.kube, ROUTER_NODES, ROUTER_NODE, prefix="kwok-router"):
        cluster.kube.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": None}})
        nodes.append(name)

    def ready() -> bool | str:
        items = cluster.kube.get("/api/v1/nodes")["items"]
        up = sum(1 for n in items if n["metadata"]["name"] in nodes and node_ready(n))
        return up == len(nodes) or f"{up}/{len(nodes)} Ready"

    wait(ready, 180, f"the kwok nodes to be Ready (see {root / 'logs' / 'kwok.log'})")
    say("installing the CRDs")
    cluster.kubectl("apply", "--server-side", "-f", str(ROOT / "crds"))
    for crd in ("deploymentcards.loom.dev", "modelcards.loom.dev"):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")
    return cluster


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind), {})


def make_namespace(kube: Kube, namespace: str) -> None:
    kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                       "metadata": {"name": namespace}})  # fmt: skip
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts"
    wait(lambda: kube.get(path)["items"], 60, f"the default ServiceAccount of {namespace}", 0.25)


def delete_cards(kube: Kube, namespace: str, timeout: float) -> float | None:
    """Deletes the DeploymentCards while the operator runs (its daemons hold a finalizer): the
    seconds until they are gone, or None if it never let go (their finalizers are then cut)."""
    say(f"deleting the DeploymentCards of {namespace}")
    path, t0 = object_path("DeploymentCard", namespace), time.monotonic()
    kube.delete(path)
    try:
        wait(lambda: not kube.get(path)["items"], timeout, "the operator to release the cards")
        return time.monotonic() - t0
    except TimeoutError as exc:
        say(f"{exc}; removing their finalizers")
        for card in kube.get(path)["items"]:
            name = object_path("DeploymentCard", namespace, card["metadata"]["name"])
            kube.patch(name, {"metadata": {"finalizers": None}})
        return None


def drop_namespace(kube: Kube, namespace: str, timeout: float) -> None:
    say(f"deleting namespace {namespace}")
    kube.delete(f"/api/v1/namespaces/{namespace}")

    def gone() -> bool | str:
        names = [n["metadata"]["name"] for n in kube.get("/api/v1/namespaces")["items"]]
        pods = kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
        if pods:  # kwok waits out each pod's grace period (a worker's: its drain timeout)
            kube.delete(f"/api/v1/namespaces/{namespace}/pods", {"gracePeriodSeconds": 0})
        return namespace not in names or f"{len(pods)} pods left"

    wait(gone, timeout, f"namespace {namespace} to be deleted", 2.0)


# --- one scale ---------------------------------------------------------------------------------


def card_states(kube: Kube, namespace: str, phases: set[str]) -> dict[str, tuple[bool, str]]:
    """Per card: converged, and what it shows (`phase / Ready reason`, `pods starting` or
    `stale`: its status is not of its current generation)."""
    out = {}
    for card in kube.get(object_path("DeploymentCard", namespace))["items"]:
        status = card.get("status") or {}
        roles = (status.get("roles") or {}).values()
        current = status.get("observedGeneration") == card["metadata"].get("generation")
        full = current and bool(roles) and all(r.get("ready") == r.get("desired") for r in roles)
        shows = (f"{status.get('phase')} / {condition(card, 'Ready').get('reason')}" if full
                 else "pods starting" if current else "stale")  # fmt: skip
        out[card["metadata"]["name"]] = (full and status.get("phase") in phases, shows)
    return out


def wait_converged(
    kube: Kube, namespace: str, count: int, t0: float, op: OperatorProcess, args: argparse.Namespace
) -> dict[str, float]:
    """Each card's seconds from `t0` (its first create) to converged."""
    at, said = dict[str, float](), 0.0
    while len(at) < count:
        now = time.monotonic()
        states = card_states(kube, namespace, args.expect_phase)
        at |= {name: now - t0 for name, (done, _) in states.items() if done and name not in at}
        seen = ", ".join(
            f"{s} {n}" for s, n in sorted(Counter(s for _, s in states.values()).items())
        )
        if now - said >= 5 or len(at) == count:
            say(f"  {len(at)}/{count} cards converged ({seen or 'no status yet'})")
            said = now
        if now - t0 > args.timeout_s:
            raise TimeoutError(f"{count - len(at)} cards in {namespace} not converged after "
                               f"{args.timeout_s:.0f} s (every role ready, observedGeneration "
                               f"current, phase in {sorted(args.expect_phase)}): {seen}; "
                               f"the operator's log: {op.log}")  # fmt: skip
        op.stats()  # collects the records as they come (the pipe stays small)
        time.sleep(args.poll_s)
    return at


def handler_stats(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for handler in sorted({r["handler"] for r in records}):
        mine = [r for r in records if r["handler"] == handler]
        s, verbs = sorted(r["s"] for r in mine), Counter[str]()
        for r in mine:
            verbs.update(r["requests"])
        errors = [r["error"] for r in mine if r["error"]]
        out[handler] = {
            "calls": len(mine), "p50_s": round(statistics.median(s), 4),
            "p90_s": round(s[int(0.9 * (len(s) - 1))], 4), "max_s": round(s[-1], 4),
            "requests_per_call": {v: round(n / len(mine), 2) for v, n in sorted(verbs.items())},
            "errors": len(errors), "first_error": errors[0] if errors else None,
        }  # fmt: skip
    return out


def minus(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in sorted(after) if after[k] > before.get(k, 0)}


def run_scale(
    cluster: Cluster, label: str, cards: list[dict[str, Any]], args: argparse.Namespace
) -> dict[str, Any]:
    kube, namespace, load = cluster.kube, f"scale-{label}", [os.getloadavg()[0]]
    make_namespace(kube, namespace)
    op = OperatorProcess(cluster.kubeconfig, namespace, STATE / f"operator-{label}.log")
    try:
        model = glm_docs()[0] | {"metadata": {"name": "glm-5", "namespace": namespace}}
        kube.create(object_path("ModelCard", namespace), model)
        path = object_path("ModelCard", namespace, "glm-5")
        wait(lambda: condition(kube.get(path), "Valid").get("status") == "True", 120,
             f"the operator to mark ModelCard glm-5 Valid (its log: {op.log})")  # fmt: skip
        before, rss_start = op.stats(), op.memory_mib()
        say(f"scale {label}: creating {len(cards)} DeploymentCards")
        t0 = time.monotonic()
        for card in cards:
            card["metadata"]["namespace"] = namespace
            kube.create(object_path("DeploymentCard", namespace), card)
        at = wait_converged(kube, namespace, len(cards), t0, op, args)
        converged, shows = op.stats(), card_states(kube, namespace, args.expect_phase)
        load.append(os.getloadavg()[0])
        say(f"scale {label}: converged in {max(at.values()):.1f} s; {args.steady_s:.0f} s steady")
        time.sleep(args.steady_s)  # the window for the steady request rates
        steady, memory = op.stats(), op.memory_mib()
        load.append(os.getloadavg()[0])
    finally:
        try:
            release_s = delete_cards(kube, namespace, min(args.timeout_s, 180.0))
        finally:
            stop_s = op.stop()
    drop_namespace(kube, namespace, args.timeout_s)
    window = args.steady_s * len(cards)
    return {
        "scale": label, "cards": len(cards),
        "worker_pods": sum(r["replicas"] for c in cards for r in c["spec"]["roles"].values()),
        "router_pods": sum(c["spec"]["router"]["replicas"] for c in cards),
        "converge_s": round(max(at.values()), 2),
        "card_p50_s": round(statistics.median(at.values()), 2),
        "shows": dict(Counter(s for _, s in shows.values())),
        "handlers": handler_stats(op.records),
        "requests_while_converging": minus(converged, before),
        "steady_requests_per_card_s": {k: round(v / window, 3)
                                       for k, v in minus(steady, converged).items()},
        "rss_mib": {"start": rss_start.get("VmRSS"), "peak": memory.get("VmHWM")},
        "cards_deleted_s": release_s and round(release_s, 2),
        "operator_exit_s": stop_s and round(stop_s, 2),  # None: SIGTERM did not stop it
        "load_1min": [round(x, 2) for x in load],
    }  # fmt: skip


# --- report ------------------------------------------------------------------------------------


def _handler(result: dict[str, Any], names: tuple[str, ...]) -> str:
    """`p50 / max ms | requests per call` of the first of `names` the operator ran."""
    h = next((result["handlers"][n] for n in names if n in result["handlers"]), None)
    if h is None:
        return "- | -"
    verbs = " ".join(f"{v} {n:g}" for v, n in h["requests_per_call"].items())
    return f"{h['p50_s'] * 1000:.0f} / {h['max_s'] * 1000:.0f} | {verbs or 0}"


def table(results: list[dict[str, Any]]) -> str:
    rows = ["| scale | pods (workers + routers) | converge s (median card) "
            "| reconcile ms p50 / max | requests per reconcile | round ms p50 / max "
            "| requests per round | steady req/s per card | RSS MiB start / peak |",
            "|---" * 9 + "|"]  # fmt: skip
    for r in results:
        steady = " ".join(f"{k} {v:g}" for k, v in r["steady_requests_per_card_s"].items())
        rows.append(f"| {r['scale']} | {r['worker_pods']} + {r['router_pods']} "
                    f"| {r['converge_s']:.1f} ({r['card_p50_s']:.1f}) "
                    f"| {_handler(r, ('apply_deployment_card',))} "
                    f"| {_handler(r, ('fleet_round', 'observe'))} | {steady} "
                    f"| {r['rss_mib']['start']:.0f} / {r['rss_mib']['peak']:.0f} |")  # fmt: skip
    return "\n".join(rows)


def headline(r: dict[str, Any]) -> dict[str, float]:
    rec = r["handlers"].get("apply_deployment_card") or {}
    return {"converge_s": r["converge_s"], "card_p50_s": r["card_p50_s"],
            "reconcile_p50_s": rec.get("p50_s", float("nan")),
            "rss_peak_mib": r["rss_mib"]["peak"]}  # fmt: skip


def medians(results: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per scale, the median over its runs of the headline numbers."""
    out = {}
    for scale in dict.fromkeys(r["scale"] for r in results):
        runs = [headline(r) for r in results if r["scale"] == scale]
        out[scale] = {k: statistics.median(h[k] for h in runs) for k in runs[0]} | {
            "runs": len(runs)
        }
    return out


def scenarios(args: argparse.Namespace) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    for n in args.scales:
        for _ in range(args.repeat):
            yield str(n), [small_card(f"glm-5-{i:03d}") for i in range(n)]
            if n == 1 and args.big:
                yield "1-big", [big_card()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    # fmt: off
    p.add_argument("--scales", type=lambda s: [int(x) for x in s.split(",")], default=[1, 10, 100],
                   help="DeploymentCards per scale, comma-separated (default 1,10,100)")
    p.add_argument("--no-big", dest="big", action="store_false",
                   help="skip the 8 prefill + 64 decode card at scale 1")
    p.add_argument("--repeat", type=int, default=1, help="runs of each scale (medians reported)")
    p.add_argument("--expect-phase", type=lambda s: set(s.split(",")),
                   default={"Ready", "Progressing"},
                   help="phases a converged card may show (default Ready,Progressing)")
    p.add_argument("--steady-s", type=float, default=30.0,
                   help="window after convergence for the steady request rates (default 30)")
    p.add_argument("--timeout-s", type=float, default=900.0,
                   help="bound of each wait: convergence, deletion (default 900)")
    p.add_argument("--poll-s", type=float, default=1.0, help="status poll interval (default 1)")
    p.add_argument("--keep", action="store_true", help="leave the cluster running at the end")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "operator_scale.json")
    # fmt: on
    return p.parse_args(argv)


def tree() -> str:
    """The commit the operator ran from, and the operator files changed since (if any)."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "status", "--porcelain", "--", "operator"],
                           capture_output=True, text=True).stdout.split("\n")  # fmt: skip
    changed = sorted(line[3:] for line in dirty if line.strip())
    return head.stdout.strip() + (f" + uncommitted {', '.join(changed)}" if changed else "")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results: list[dict[str, Any]] = []
    report: dict[str, Any] = {
        "command": " ".join(["bench/operator_scale.py", *(sys.argv[1:] if argv is None else argv)]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
        "load_avg_start": [round(x, 2) for x in os.getloadavg()],
        "expect_phase": sorted(args.expect_phase), "steady_s": args.steady_s,
        "operator_tree": tree(),
    }  # fmt: skip
    try:
        cluster = start_cluster(STATE)
        for label, cards in scenarios(args):
            results.append(run_scale(cluster, label, cards, args))
    except (TimeoutError, RuntimeError, OSError) as exc:
        report["error"] = str(exc)
        say(f"stopped: {exc}")
    finally:
        if not args.keep:
            say("stopping the cluster")
            control_plane.down(STATE)
    report |= {"load_avg_end": [round(x, 2) for x in os.getloadavg()],
               "medians": medians(results), "results": results}  # fmt: skip
    print(table(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    say(f"wrote {args.out}")
    return 1 if "error" in report else 0


if __name__ == "__main__":
    sys.exit(main())
