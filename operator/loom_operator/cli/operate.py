"""`loom operator`: run the Kubernetes operator (kopf) in-cluster or against a kubeconfig.

Parses flags and hands off to kopf with the handlers of loom_operator.k8s.handlers.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Any

from loom_operator.k8s.settings import RenderSettings


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
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import kopf

    from loom_operator.k8s import handlers
    from loom_operator.k8s.kube import Kube

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # kopf logs every timer run at INFO; the status it writes says the same, once per change.
    logging.getLogger("kopf.objects").setLevel(max(logging.WARNING, logging.getLogger().level))
    if args.kubeconfig is not None:
        os.environ["KUBECONFIG"] = str(args.kubeconfig)  # kopf's own login reads it
    settings = RenderSettings(
        runtime_image=args.runtime_image,
        router_image=args.router_image,
        kv_connector=args.kv_connector,
    )
    namespaces = args.namespace or [os.environ.get("POD_NAMESPACE", "default")]
    memo = kopf.Memo(kube=Kube(args.kubeconfig), settings=settings)
    assert handlers.configure is not None  # the import registers the handlers with kopf
    kopf.run(
        standalone=True,
        clusterwide=args.all_namespaces,
        namespaces=() if args.all_namespaces else namespaces,
        memo=memo,
    )
    return 0
