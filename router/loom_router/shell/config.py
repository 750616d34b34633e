"""What the router process is told: ROUTER.json (`RouterFileConfig`) and its command line
(`RouterFlags`, with environment fallbacks).

Owns the file's shape, its validation (every problem reported at once, with its field path), the
conversion of the card's router/failover sections to the one RoutingSettings, and the flag names,
defaults and environment fallbacks; never routes. Imports nothing heavy, so the `loom` CLI can
register the flags without loading the router.

    {"model_name": "tiny", "tokenizer_path": "/models/tiny", "block_size": 16,
     "hash_seed": "0", "hash_algo": "sha256_cbor",
     "router": {<DeploymentCard spec.router, camelCase>}, "failover": {<spec.failover>},
     "endpoints": [{"id", "url", "role", "weights_version", "kv_events", "kv_replay"}]}
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from loom_router.core.endpoints import Endpoint
from loom_router.core.settings import RoutingSettings, ScorerWeights
from loom_router.core.workflows import WorkflowRoute, workflows_from_doc
from loom_router.errors import ConfigError
from loom_runtime.card.serving import Failover, Router
from loom_runtime.wire.errors import WireConfigError
from loom_runtime.wire.router_admin import EndpointSpec

ADMIN_TOKEN_ENV = "LOOM_ROUTER_ADMIN_TOKEN"
API_KEYS_ENV = "LOOM_ROUTER_API_KEYS"
Policy = Literal["scored", "random", "round-robin"]
POLICIES: tuple[Policy, ...] = ("scored", "random", "round-robin")
_TOP_LEVEL = frozenset(
    {"model_name", "tokenizer_path", "block_size", "hash_seed", "hash_algo", "router",
     "failover", "endpoints", "diffusion", "scale_from_zero", "workflows"}
)  # fmt: skip
DEFAULT_DIFFUSION_STEPS = 50


@dataclass(frozen=True)
class DiffusionRouting:
    """ROUTER.json's `diffusion` object: the fleet serves images and video, routed by cost."""

    default_steps: int = DEFAULT_DIFFUSION_STEPS
    """The workers' denoise steps for a request that names none (the card's loop steps)."""
    text: bool = False
    """The fleet serves text too (a card with a think-then-draw program): the text routes as
    for any text fleet, and /v1/images/generations (its program) by cost; no video routes."""


@dataclass(frozen=True)
class RouterFileConfig:
    """ROUTER.json, validated: the model, the tokenizer, the routing settings and the first
    endpoints (the admin API and --watch-pods change the endpoints later)."""

    model_name: str
    tokenizer_path: Path | None
    """A tokenizer.json, or a checkpoint directory holding one (None: approximate keys only)."""
    settings: RoutingSettings
    endpoints: tuple[Endpoint, ...] = ()
    diffusion: DiffusionRouting | None = None
    """Set: /v1/images and /v1/videos are served (by predicted cost × load), not text routes
    (with `text`: the text routes and /v1/images only)."""
    workflows: tuple[WorkflowRoute, ...] = ()
    """Servables composed of several cards' requests, the last stage on this fleet."""


def endpoint_from_doc(endpoint_id: str, doc: Mapping[str, Any], where: str) -> Endpoint:
    """An Endpoint from its JSON form (the config file's entries, the admin API's PUT body)."""
    try:
        return Endpoint.from_spec(endpoint_id, EndpointSpec.from_json(doc, where))
    except WireConfigError as exc:
        raise ConfigError(str(exc)) from None


def file_config_from_dict(doc: Mapping[str, Any], base: Path | None = None) -> RouterFileConfig:
    """Validate a ROUTER.json document; ConfigError lists every problem found."""
    if not isinstance(doc, Mapping):
        raise ConfigError("ROUTER.json must hold a JSON object")
    problems = [f"{k}: unknown field" for k in sorted(set(doc) - _TOP_LEVEL)]
    model = doc.get("model_name")
    if not isinstance(model, str) or not model:
        problems.append("model_name: required, a non-empty string")
    tok = doc.get("tokenizer_path")
    if tok is not None and not isinstance(tok, str):
        problems.append("tokenizer_path: must be a string or null")
    router = _card_part(Router, doc.get("router", {}), "router", problems)
    failover = _card_part(Failover, doc.get("failover", {}), "failover", problems)
    endpoints: list[Endpoint] = []
    raw = doc.get("endpoints", [])
    if not isinstance(raw, list):
        problems.append("endpoints: must be a list")
        raw = []
    for i, item in enumerate(raw):
        where = f"endpoints[{i}]"
        try:
            eid = item.get("id") if isinstance(item, Mapping) else None
            if not isinstance(eid, str) or not eid:
                raise ConfigError(f"{where}.id: required, a non-empty string")
            rest = {k: v for k, v in item.items() if k != "id"}
            endpoints.append(endpoint_from_doc(eid, rest, where))
        except ConfigError as exc:
            problems.append(str(exc))
    diffusion = _diffusion(doc.get("diffusion"), problems)
    workflows = workflows_from_doc(doc.get("workflows"), problems)
    problems += _unserved(workflows, diffusion)
    settings: RoutingSettings | None = None
    if router is not None and failover is not None:
        try:
            settings = settings_from_spec(router, failover, doc)
        except ConfigError as exc:
            problems.append(str(exc))
    if problems or settings is None:
        raise ConfigError("ROUTER.json: " + "; ".join(problems))
    path = None if tok is None else Path(tok)
    if path is not None and not path.is_absolute() and base is not None:
        path = base / path
    return RouterFileConfig(str(model), path, settings, tuple(endpoints), diffusion, workflows)


def _unserved(flows: tuple[WorkflowRoute, ...], diffusion: DiffusionRouting | None) -> list[str]:
    """A workflow's last stage runs here, so this fleet must serve its route."""
    routes = set() if diffusion is None else {"images"} if diffusion.text else {"images", "videos"}
    return [
        f"workflows: {w.name} ends with a {w.route} stage, which this fleet does not serve"
        for w in flows
        if w.route not in routes
    ]


def _diffusion(raw: Any, problems: list[str]) -> DiffusionRouting | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or set(raw) - {"default_steps", "text"}:
        problems.append('diffusion: must be an object with only "default_steps" and "text"')
        return None
    text = raw.get("text", False)
    if not isinstance(text, bool):
        problems.append(f"diffusion.text: true or false, got {text!r}")
        return None
    steps = raw.get("default_steps", DEFAULT_DIFFUSION_STEPS)
    if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= 1000:
        problems.append(f"diffusion.default_steps: an integer in [1, 1000], got {steps!r}")
        return None
    return DiffusionRouting(steps, text)


def load_file_config(path: Path) -> RouterFileConfig:
    try:
        doc = json.loads(path.read_text("utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    except ValueError as exc:
        raise ConfigError(f"{path} is not JSON: {exc}") from exc
    return file_config_from_dict(doc, path.parent)


def settings_from_spec(
    router: Router, failover: Failover, doc: Mapping[str, Any]
) -> RoutingSettings:
    """RoutingSettings from the card's sections plus the engines' hashing parameters."""
    block_size = doc.get("block_size", 16)
    seed = doc.get("hash_seed", "0")
    algo = doc.get("hash_algo", "sha256_cbor")
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size <= 0:
        raise ConfigError(f"block_size: a positive integer, got {block_size!r}")
    if not isinstance(seed, str) or not isinstance(algo, str):
        raise ConfigError("hash_seed and hash_algo: strings")
    from_zero = doc.get("scale_from_zero", False)
    if not isinstance(from_zero, bool):
        raise ConfigError(f"scale_from_zero: true or false, got {from_zero!r}")
    return RoutingSettings(
        weights=ScorerWeights(**router.scorers.model_dump()),
        prefix_scorer=router.prefix_scorer,
        min_uncached_tokens=router.disaggregation.min_uncached_tokens,
        session_affinity=router.session_affinity.enabled,
        session_header=router.session_affinity.header,
        spill_margin=router.hotspot.spill_margin,
        block_size=block_size,
        hash_algo=algo,
        hash_seed=seed,
        migration_limit=failover.migration_limit,
        health_timeout_s=failover.health_timeout_seconds,
        on_transfer_failure=failover.on_transfer_failure,
        in_flight_prefix_s=router.in_flight_prefix_s,
        max_held=router.hold.max_requests,
        hold_s=router.hold.timeout_seconds,
        hold_when_empty=from_zero,
    )


def _card_part(cls: Any, value: Any, where: str, problems: list[str]) -> Any:
    try:
        return cls.model_validate(value)
    except ValidationError as exc:
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            problems.append(f"{where}.{loc}: {err['msg']}" if loc else f"{where}: {err['msg']}")
    return None


# --- flags ---------------------------------------------------------------------------------


class FlagsError(ValueError):
    """The flags ask for something impossible; the message says what to pass instead."""


@dataclass(frozen=True)
class RouterFlags:
    """The router's command line (flags, or their environment fallbacks): where to listen, who
    may call, the policy. The routing settings come from ROUTER.json (`RouterFileConfig`); only
    --max-index-entries overrides one of them."""

    config: Path
    """ROUTER.json (--config)."""
    host: str = "127.0.0.1"
    port: int = 8080
    admin_host: str = "127.0.0.1"
    admin_port: int = 8081
    admin_token: str = ""
    api_keys: tuple[str, ...] = ()
    """Empty: the OpenAI routes are open; else `Authorization: Bearer <one of them>`."""
    policy: Policy = "scored"
    """scored (filters → scorers → picker) | random | round-robin (baselines for benchmarks)."""
    seed: int = 0
    scrape_interval_s: float = 0.1
    log_level: str = "INFO"
    max_index_entries: int | None = None
    """Cap of the precise prefix index ((endpoint, block) entries); None: the default (1M)."""
    watch_pods: str | None = None
    """A label selector: the endpoints are the worker pods it matches (Kubernetes), kept in
    step by a pod watch; None: ROUTER.json's list and the admin API only."""
    namespace: str = "default"
    """Where --watch-pods looks."""
    max_body_bytes: int = 64 << 20
    """Largest request body the OpenAI routes accept; a larger one gets 413."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, required=True, help="ROUTER.json")
    p.add_argument("--host", default="127.0.0.1", help="OpenAI API address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="OpenAI API port (default 8080)")
    p.add_argument("--admin-host", default="127.0.0.1", help="admin API address")
    p.add_argument("--admin-port", type=int, default=8081, help="admin API port (default 8081)")
    p.add_argument("--admin-token", help=f"admin bearer token (default ${ADMIN_TOKEN_ENV})")
    p.add_argument(
        "--api-key",
        action="append",
        default=[],
        help=f"accepted API key; repeatable (also ${API_KEYS_ENV}, comma-separated)",
    )
    p.add_argument("--policy", choices=POLICIES, default="scored", help="default scored")
    p.add_argument(
        "--seed", type=int, default=0, help="seed of --policy random (scored picks: request id)"
    )
    p.add_argument(
        "--scrape-interval", type=float, default=0.1, help="seconds between /metrics scrapes"
    )
    p.add_argument("--log-level", default="INFO", help="default INFO")
    p.add_argument(
        "--max-index-entries",
        type=int,
        help="cap of the precise prefix index, in (endpoint, block) entries of ~0.3 KiB "
        "(default 1,000,000)",
    )
    p.add_argument(
        "--watch-pods",
        metavar="SELECTOR",
        help="route to the worker pods matching this label selector (in-cluster or $KUBECONFIG)",
    )
    p.add_argument("--namespace", help="namespace of --watch-pods (default $POD_NAMESPACE)")
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=RouterFlags.max_body_bytes,
        help="largest request body accepted; larger ones get 413 (default 64 MiB)",
    )


def flags_from_args(args: argparse.Namespace, env: dict[str, str]) -> RouterFlags:
    token = args.admin_token or env.get(ADMIN_TOKEN_ENV, "")
    if not token:
        raise FlagsError(
            f"the admin API needs a token: pass --admin-token or set ${ADMIN_TOKEN_ENV}"
        )
    keys = [*args.api_key, *(k.strip() for k in env.get(API_KEYS_ENV, "").split(","))]
    if args.scrape_interval <= 0:
        raise FlagsError(f"--scrape-interval must be > 0, got {args.scrape_interval}")
    if args.max_index_entries is not None and args.max_index_entries <= 0:
        raise FlagsError(f"--max-index-entries must be > 0, got {args.max_index_entries}")
    if args.max_body_bytes < 1024:
        raise FlagsError(f"--max-body-bytes must be at least 1024, got {args.max_body_bytes}")
    if args.port == args.admin_port and args.host == args.admin_host:
        raise FlagsError("--port and --admin-port must differ")
    return RouterFlags(
        config=args.config,
        host=args.host,
        port=args.port,
        admin_host=args.admin_host,
        admin_port=args.admin_port,
        admin_token=token,
        api_keys=tuple(k for k in keys if k),
        policy=args.policy,
        seed=args.seed,
        scrape_interval_s=args.scrape_interval,
        log_level=args.log_level,
        max_index_entries=args.max_index_entries,
        watch_pods=args.watch_pods,
        namespace=args.namespace or env.get("POD_NAMESPACE") or "default",
        max_body_bytes=args.max_body_bytes,
    )


def env() -> dict[str, str]:
    return dict(os.environ)
