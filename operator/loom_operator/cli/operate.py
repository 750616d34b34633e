"""`loom operator`: run the Kubernetes operator (kopf) in-cluster or against a kubeconfig.

Parses flags and hands off to kopf with the handlers of loom_operator.k8s.handlers.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from loom_operator.k8s.leader import LeaseSettings
from loom_operator.k8s.settings import RenderSettings
from loom_operator.k8s.shard_keeper import ShardSettings


def add_parser(sub: Any) -> None:
    defaults = RenderSettings()
    p = sub.add_parser(
        "operator",
        help="run the Kubernetes operator: loom operator [--namespace N | --all-namespaces]",
        description="Reconcile ModelCards and DeploymentCards into role pods and a router.",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--namespace", action="append", default=[], help="watch this namespace "
                       "(repeatable; default: the pod's namespace, or default)")  # fmt: skip
    where.add_argument("--all-namespaces", action="store_true", help="watch every namespace")
    p.add_argument("--kubeconfig", type=Path, help="default: in-cluster, else $KUBECONFIG")
    p.add_argument("--runtime-image", default=defaults.runtime_image, help="worker pods' image")
    p.add_argument("--router-image", default=defaults.router_image, help="router pods' image")
    p.add_argument("--kv-connector", choices=("nixl", "tcp"), help="P/D workers' KV connector")
    p.add_argument("--router-api-keys-secret", metavar="NAME:KEY", help="the routers' API keys "
                   "(comma-separated) from this Secret in each card's namespace")  # fmt: skip
    p.add_argument("--network-policies", action="store_true", help="render NetworkPolicies: "
                   "only the operator reaches control ports")  # fmt: skip
    p.add_argument("--metrics-namespace", action="append", default=[], help="a namespace whose "
                   "pods may scrape the workers' /metrics through the NetworkPolicies")  # fmt: skip
    p.add_argument(
        "--no-leader-elect", dest="leader_elect", action="store_false",
        help="act without holding the loom-operator Lease (only when a single replica runs)",
    )  # fmt: skip
    p.add_argument("--shards", type=int, default=0, metavar="N", help="split the cards into N "
                   "shards that the operator's replicas share (a Lease per shard, rebalanced as "
                   "replicas join or die); 0: one replica acts on every card, the others wait "
                   "for the loom-operator Lease")  # fmt: skip
    p.add_argument("--metrics-port", type=int, default=0, help="serve the operator's "
                   "Prometheus metrics (planner decisions) on this port; 0: none")  # fmt: skip
    p.add_argument("--metrics-address", default="0.0.0.0", help="the address --metrics-port "
                   "binds (the chart passes the pod's IP)")  # fmt: skip
    p.add_argument(
        "--push-port",
        type=int,
        default=0,
        help="serve the weight-push API "
        "(a trainer pushes into a card's workers, docs/rl.md) on this port; 0: off",
    )
    p.add_argument("--push-address", default="0.0.0.0", help="the address --push-port listens on")
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import kopf

    from loom_operator.k8s import handlers
    from loom_operator.k8s.drift import Applied
    from loom_operator.k8s.kube import Kube
    from loom_operator.k8s.leader import LeaderElector
    from loom_operator.k8s.metrics import OperatorMetrics
    from loom_operator.k8s.pushes import PushDesks
    from loom_operator.k8s.shard_keeper import ShardKeeper, Shards
    from loom_operator.k8s.wakers import CardWakers

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # kopf logs every timer run at INFO; the status it writes says the same, once per change.
    logging.getLogger("kopf.objects").setLevel(max(logging.WARNING, logging.getLogger().level))
    if args.kubeconfig is not None:
        os.environ["KUBECONFIG"] = str(args.kubeconfig)
        # kopf's login reads the kubernetes library's default path, fixed when it was imported.
        from kubernetes.config import kube_config

        kube_config.KUBE_CONFIG_DEFAULT_LOCATION = str(args.kubeconfig)
    keys = args.router_api_keys_secret
    settings = RenderSettings(
        runtime_image=args.runtime_image,
        router_image=args.router_image,
        kv_connector=args.kv_connector,
        router_api_keys=None if keys is None else _secret_key(keys),
        network_policies=args.network_policies,
        operator_namespace=os.environ.get("POD_NAMESPACE", "default"),
        metrics_namespaces=tuple(args.metrics_namespace),
    )
    namespaces = args.namespace or [os.environ.get("POD_NAMESPACE", "default")]
    kube = Kube(args.kubeconfig)
    stop, kopf_stop = threading.Event(), threading.Event()
    metrics, wakers = OperatorMetrics(), CardWakers()
    metrics.kube_requests(kube.requests)
    metrics.queue(wakers.pending)
    if args.metrics_port:
        metrics.serve(args.metrics_port, args.metrics_address)
    if args.shards < 0:
        raise SystemExit(f"--shards: expected 0 or more, got {args.shards}")
    shards = Shards(args.shards) if args.shards else None
    memo = kopf.Memo(kube=kube, settings=settings, stop_flag=kopf_stop, metrics=metrics,
                     wakers=wakers, applied=Applied(), shards=shards)  # fmt: skip
    if args.push_port:
        memo.push_desks = PushDesks(shards)
        memo.push_port, memo.push_address = args.push_port, args.push_address
    assert handlers.configure is not None  # the import registers the handlers with kopf
    elector, keeper = None, None
    if shards is not None:
        push_url = push_api_url(args.push_address, args.push_port) if args.push_port else ""
        sharding = replace(shard_settings(namespaces, args.shards), push_url=push_url)
        keeper = ShardKeeper(kube, sharding, shards)
        metrics.shards(lambda: len(shards.acting_on))
        threading.Thread(target=keeper.keep, args=(stop,), daemon=True).start()
    elif args.leader_elect:
        elector = LeaderElector(kube, lease_settings(namespaces))
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            if not elector.acquire(stop):
                return 0
        finally:
            signal.signal(signal.SIGTERM, previous)
        threading.Thread(target=elector.keep, args=(stop,), daemon=True).start()
        threading.Thread(target=_stop_on, args=(elector.lost, kopf_stop), daemon=True).start()
    try:
        kopf.run(
            standalone=True,
            clusterwide=args.all_namespaces,
            namespaces=() if args.all_namespaces else namespaces,
            memo=memo,
            stop_flag=kopf_stop,
        )
    finally:
        stop.set()
        if elector is not None and not elector.lost.is_set():
            elector.release()
        if keeper is not None:
            keeper.release()
    return 1 if elector is not None and elector.lost.is_set() else 0


def push_api_url(address: str, port: int) -> str:
    """The URL the other replicas reach this one's push API at (a wildcard address: the pod's
    IP, else this host's)."""
    host = address
    if address in ("", "0.0.0.0", "::"):
        host = os.environ.get("POD_IP") or socket.gethostbyname(socket.gethostname())
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def _secret_key(text: str) -> tuple[str, str]:
    name, _, key = text.partition(":")
    if not name or not key:
        raise SystemExit(f"--router-api-keys-secret: expected NAME:KEY, got {text!r}")
    return name, key


def _stop_on(lost: threading.Event, kopf_stop: threading.Event) -> None:
    """A replica that lost the lease stops acting at once (its pod is restarted)."""
    lost.wait()
    kopf_stop.set()


def _where(namespaces: list[str]) -> tuple[str, str]:
    """The namespace of this operator's Leases (its own in a pod, else the first it watches)
    and this replica's identity."""
    namespace = os.environ.get("POD_NAMESPACE") or namespaces[0]
    identity = os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
    return namespace, identity


def lease_settings(namespaces: list[str]) -> LeaseSettings:
    """The Lease every replica of this operator contends for."""
    return LeaseSettings("loom-operator", *_where(namespaces))


def shard_settings(namespaces: list[str], shards: int) -> ShardSettings:
    """The shard Leases the replicas of a sharded operator share."""
    namespace, identity = _where(namespaces)
    return ShardSettings(namespace, identity, shards)
