"""The router process's configuration (`RouterConfig`), read once from ROUTER.json.

Owns the file's shape, its validation (every problem reported at once, with its field path) and
the conversion of the card's router/failover sections to RouterSettings; never routes.

    {"model_name": "tiny", "tokenizer_path": "/models/tiny", "block_size": 16,
     "hash_seed": "0", "hash_algo": "sha256_cbor",
     "router": {<DeploymentCard spec.router, camelCase>}, "failover": {<spec.failover>},
     "endpoints": [{"id", "url", "role", "weights_version", "kv_events", "kv_replay"}]}
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from loom_operator.api.serving import Failover, Router
from loom_operator.router.endpoints import ROLES, Endpoint
from loom_operator.router.errors import RouterConfigError
from loom_operator.router.settings import RouterSettings

TransferFailurePolicy = Literal["recompute", "fail"]
_TOP_LEVEL = frozenset(
    {"model_name", "tokenizer_path", "block_size", "hash_seed", "hash_algo", "router",
     "failover", "endpoints"}
)  # fmt: skip
_ENDPOINT_FIELDS = frozenset({"id", "url", "role", "weights_version", "kv_events", "kv_replay"})


@dataclass(frozen=True)
class FailoverPolicy:
    """What the shell does when a worker fails (the card's spec.failover)."""

    migration_limit: int = 3
    """Times one request may move to another worker before the client gets an error."""
    health_timeout_s: float = 5.0
    """Longest wait for a probe or a connection before the worker counts as down."""
    on_transfer_failure: TransferFailurePolicy = "recompute"
    """A failed remote prefill: decode prefills locally (recompute) or the request fails."""


@dataclass(frozen=True)
class RouterConfig:
    model_name: str
    tokenizer_path: Path | None
    """A tokenizer.json, or a checkpoint directory holding one (None: approximate keys only)."""
    settings: RouterSettings
    failover: FailoverPolicy
    endpoints: tuple[Endpoint, ...] = ()


def endpoint_from_doc(endpoint_id: str, doc: Mapping[str, Any], where: str) -> Endpoint:
    """An Endpoint from its JSON form (the config file's entries, the admin API's PUT body)."""
    if not isinstance(doc, Mapping):
        raise RouterConfigError(f"{where}: must be an object")
    unknown = sorted(set(doc) - _ENDPOINT_FIELDS)
    problems = [f"{where}.{k}: unknown field" for k in unknown]
    for key in ("url", "role", "weights_version"):
        if not isinstance(doc.get(key), str) or not doc.get(key):
            problems.append(f"{where}.{key}: required, a non-empty string")
    for key in ("kv_events", "kv_replay"):
        if doc.get(key) is not None and not isinstance(doc.get(key), str):
            problems.append(f"{where}.{key}: must be a string or null")
    if isinstance(doc.get("role"), str) and doc["role"] not in ROLES:
        problems.append(f"{where}.role: must be one of {', '.join(ROLES)}")
    url = doc.get("url")
    if isinstance(url, str) and not url.startswith(("http://", "https://")):
        problems.append(f"{where}.url: must start with http:// or https://, got {url!r}")
    if problems:
        raise RouterConfigError("; ".join(problems))
    return Endpoint(
        id=endpoint_id,
        url=str(doc["url"]).rstrip("/"),
        role=doc["role"],
        weights_version=doc["weights_version"],
        kv_events=doc.get("kv_events") or None,
        kv_replay=doc.get("kv_replay") or None,
    )


def config_from_dict(doc: Mapping[str, Any], base: Path | None = None) -> RouterConfig:
    """Validate a ROUTER.json document; RouterConfigError lists every problem found."""
    if not isinstance(doc, Mapping):
        raise RouterConfigError("ROUTER.json must hold a JSON object")
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
                raise RouterConfigError(f"{where}.id: required, a non-empty string")
            rest = {k: v for k, v in item.items() if k != "id"}
            endpoints.append(endpoint_from_doc(eid, rest, where))
        except RouterConfigError as exc:
            problems.append(str(exc))
    settings: RouterSettings | None = None
    if router is not None and failover is not None:
        try:
            settings = settings_from_spec(router, failover, doc)
        except RouterConfigError as exc:
            problems.append(str(exc))
    if problems or settings is None or failover is None:
        raise RouterConfigError("ROUTER.json: " + "; ".join(problems))
    path = None if tok is None else Path(tok)
    if path is not None and not path.is_absolute() and base is not None:
        path = base / path
    policy = FailoverPolicy(
        failover.migration_limit, failover.health_timeout_seconds, failover.on_transfer_failure
    )
    return RouterConfig(str(model), path, settings, policy, tuple(endpoints))


def load_config(path: Path) -> RouterConfig:
    try:
        doc = json.loads(path.read_text("utf-8"))
    except OSError as exc:
        raise RouterConfigError(f"cannot read {path}: {exc}") from exc
    except ValueError as exc:
        raise RouterConfigError(f"{path} is not JSON: {exc}") from exc
    return config_from_dict(doc, path.parent)


def settings_from_spec(
    router: Router, failover: Failover, doc: Mapping[str, Any]
) -> RouterSettings:
    """RouterSettings from the card's sections plus the engines' hashing parameters."""
    block_size = doc.get("block_size", 16)
    seed = doc.get("hash_seed", "0")
    algo = doc.get("hash_algo", "sha256_cbor")
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size <= 0:
        raise RouterConfigError(f"block_size: a positive integer, got {block_size!r}")
    if not isinstance(seed, str) or not isinstance(algo, str):
        raise RouterConfigError("hash_seed and hash_algo: strings")
    return RouterSettings.from_parts(router, failover, block_size, algo, seed)


def _card_part(cls: Any, value: Any, where: str, problems: list[str]) -> Any:
    try:
        return cls.model_validate(value)
    except ValidationError as exc:
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            problems.append(f"{where}.{loc}: {err['msg']}" if loc else f"{where}: {err['msg']}")
    return None
