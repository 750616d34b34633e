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
  handlers      per kopf handler (and per card loop's look, round and drift reapply, ROUNDS):
                calls, seconds p50/p90/max, Kube API requests per call by verb (tallied through
                a context variable)
  requests      the operator's Kube client by HTTP method (its `requests` counter; leader
                election included) while converging, and per card per second over --steady-s
  rss_mib       the operator's resident memory once started, and its peak (VmHWM)

kopf's own client (watches, kopf's status and annotation patches) and the gRPC and HTTP probes
of pods are not counted. Usage (writes bench/results/operator_scale.json):

    .venv/bin/python bench/operator_scale.py --scales 1,10,100
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # e2e (the harness) is imported from the repository root

from e2e.cluster import control_plane  # noqa: E402
from e2e.providers import Cluster  # noqa: E402
from operator_probe import OperatorProcess, handler_stats  # noqa: E402
from scale_cluster import (  # noqa: E402
    condition,
    delete_cards,
    drop_namespace,
    make_namespace,
    say,
    start_cluster,
    wait,
)

from loom_operator.k8s.kube import Kube, object_path  # noqa: E402
from loom_operator.testing.cards import small_glm  # noqa: E402

STATE = ROOT / ".cache" / "e2e" / "operator-scale"


def glm_docs() -> list[dict[str, Any]]:
    return list(yaml.safe_load_all((ROOT / "examples" / "glm-5-class.yaml").read_text()))


def small_card(name: str, smaller: bool = False) -> dict[str, Any]:
    return small_glm(glm_docs()[1], name, smaller)


def gpus(card: dict[str, Any]) -> int:
    return sum(r["replicas"] * r["resources"]["gpus"] for r in card["spec"]["roles"].values())


def big_card() -> dict[str, Any]:
    card = glm_docs()[1]
    card["spec"]["roles"]["prefill"]["replicas"] = 8
    card["spec"]["roles"]["decode"]["replicas"] = 64
    return card


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


def minus(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in sorted(after) if after[k] > before.get(k, 0)}


class Replicas:
    """The operator's replicas of one scale (`--shards` when more than one): their handler
    records and Kube request totals summed, their memory per replica."""

    def __init__(self, cluster: Cluster, namespace: str, label: str, replicas: int,
                 shards: int) -> None:  # fmt: skip
        flags = ("--shards", str(shards)) if replicas > 1 else ()
        self.ops = [OperatorProcess(cluster.kubeconfig, namespace,
                                    STATE / f"operator-{label}-{i}.log", flags)
                    for i in range(replicas)]  # fmt: skip
        self.log = self.ops[0].log

    @property
    def records(self) -> list[dict[str, Any]]:
        return [r for op in self.ops for r in op.records]

    def stats(self) -> dict[str, int]:
        total: Counter[str] = Counter()
        for op in self.ops:
            total.update(op.stats())
        return dict(total)

    def memory_mib(self) -> dict[str, float]:
        """The largest replica's VmRSS and VmHWM."""
        each = [op.memory_mib() for op in self.ops]
        return {k: max(m.get(k, 0.0) for m in each) for k in ("VmRSS", "VmHWM")}

    def stop(self) -> float | None:
        times = [op.stop() for op in self.ops]
        return None if None in times else max(t for t in times if t is not None)


def balanced(kube: Kube, namespace: str, replicas: int) -> bool:
    """Every shard Lease held, by `replicas` replicas, evenly (within one)."""
    path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
    items = kube.get(path, labelSelector="loom.dev/operator-lease=shard")["items"]
    holders = [(i.get("spec") or {}).get("holderIdentity") for i in items]
    counts = Counter(h for h in holders if h)
    return len(counts) == replicas and max(counts.values()) - min(counts.values()) <= 1


def run_scale(
    cluster: Cluster,
    label: str,
    cards: list[dict[str, Any]],
    args: argparse.Namespace,
    replicas: int = 1,
) -> dict[str, Any]:
    kube, namespace, load = cluster.kube, f"scale-{label}", [os.getloadavg()[0]]
    make_namespace(kube, namespace)
    op = Replicas(cluster, namespace, label, replicas, args.shards)
    try:
        if replicas > 1:
            wait(lambda: balanced(kube, namespace, replicas), 120,
                 f"{replicas} replicas to share the shards (their logs: {op.log} ...)")  # fmt: skip
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
        cleanup: list[str] = []
        try:
            release_s = delete_cards(kube, namespace, min(args.timeout_s, 180.0))
        except Exception as exc:  # an API server too slow to answer: the numbers above stand
            release_s = None
            cleanup.append(f"deleting the cards: {exc!r}"[:300])
        finally:
            if (stop_s := op.stop()) is None:
                say("the operator did not exit 20 s after SIGTERM; it was killed")
    try:
        drop_namespace(kube, namespace, args.timeout_s)
    except Exception as exc:  # as above
        cleanup.append(f"deleting the namespace: {exc!r}"[:300])
    for line in cleanup:
        say(line)
    window = args.steady_s * len(cards)
    return {
        "scale": label, "cards": len(cards), "replicas": replicas,
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
        "cleanup_errors": cleanup,
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


def scenarios(args: argparse.Namespace) -> Iterator[tuple[str, list[dict[str, Any]], int]]:
    for replicas in args.replicas:
        suffix = f"x{replicas}" if replicas > 1 else ""
        for n in args.scales:
            for _ in range(args.repeat):
                cards = [small_card(f"glm-5-{i:04d}", args.smaller_pods) for i in range(n)]
                yield f"{n}{suffix}", cards, replicas
                if n == 1 and args.big:
                    yield f"1-big{suffix}", [big_card()], replicas


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    # fmt: off
    p.add_argument("--scales", type=lambda s: [int(x) for x in s.split(",")], default=[1, 10, 100],
                   help="DeploymentCards per scale, comma-separated (default 1,10,100)")
    p.add_argument("--no-big", dest="big", action="store_false",
                   help="skip the 8 prefill + 64 decode card at scale 1")
    p.add_argument("--repeat", type=int, default=1, help="runs of each scale (medians reported)")
    p.add_argument("--replicas", type=lambda s: [int(x) for x in s.split(",")], default=[1],
                   help="operator replicas, comma-separated: each scale runs with each count "
                        "(more than one: sharded, --shards); default 1")
    p.add_argument("--shards", type=int, default=12, help="shards when replicas > 1 (default 12)")
    p.add_argument("--smaller-pods", action="store_true",
                   help="one GPU per worker and one router per card (for 1,000 cards)")
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
        most = max(args.scales)
        card = small_card("size", args.smaller_pods)
        gpu_nodes = max(100, -(-most * gpus(card) // 8))
        cluster = start_cluster(STATE, gpu_nodes, most * card["spec"]["router"]["replicas"])
        for label, cards, replicas in scenarios(args):
            results.append(run_scale(cluster, label, cards, args, replicas))
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
