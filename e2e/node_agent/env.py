"""A container's environment: env and envFrom resolved, and Kubernetes' `$(VAR)` expansion.

Owns the pure rules of what a container process sees; never reads the API itself (the
caller passes a lookup over the ConfigMaps and Secrets it fetched).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

# (kind "configMap" | "secret", name) -> the object's data, decoded, or None when absent.
Lookup = Callable[[str, str], dict[str, str] | None]

_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_LABEL_REF = re.compile(r"metadata\.(labels|annotations)\['(.+)'\]")


class EnvError(ValueError):
    """A referenced ConfigMap/Secret key is missing (the kubelet's CreateContainerConfigError)."""


def expand(text: str, env: Mapping[str, str]) -> str:
    """`$(VAR)` becomes its value when VAR is defined; `$$` is a literal `$` (as in Kubernetes)."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _REF.sub(sub, text)


def field_value(path: str, pod: Mapping[str, Any], pod_ip: str) -> str:
    """The downward API: the pod fields a fieldRef may name."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    m = _LABEL_REF.fullmatch(path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    values = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": pod_ip,
        "status.hostIP": "127.0.0.1",
    }
    if path not in values:
        raise EnvError(f"fieldRef {path!r} is not supported by the stand-in kubelet")
    return str(values[path] or "")


def container_env(
    container: Mapping[str, Any],
    pod: Mapping[str, Any],
    pod_ip: str,
    lookup: Lookup,
    api_server: tuple[str, int],
) -> dict[str, str]:
    """The variables Kubernetes would give this container (service links excepted)."""
    env = {
        "KUBERNETES_SERVICE_HOST": api_server[0],
        "KUBERNETES_SERVICE_PORT": str(api_server[1]),
        "HOSTNAME": str((pod.get("metadata") or {}).get("name", "")),
    }
    for source in container.get("envFrom") or []:
        for kind, ref_field in (("configMap", "configMapRef"), ("secret", "secretRef")):
            ref = source.get(ref_field)
            if ref is None:
                continue
            data = lookup(kind, ref["name"])
            if data is None and not ref.get("optional"):
                raise EnvError(f"{kind} {ref['name']!r} not found (envFrom)")
            for key, value in (data or {}).items():
                env[source.get("prefix", "") + key] = value
    for var in container.get("env") or []:
        env[var["name"]] = _value(var, pod, pod_ip, lookup, env)
    return env


def _value(
    var: Mapping[str, Any],
    pod: Mapping[str, Any],
    pod_ip: str,
    lookup: Lookup,
    env: Mapping[str, str],
) -> str:
    if "value" in var:
        return expand(str(var["value"]), env)
    source = var.get("valueFrom") or {}
    if "fieldRef" in source:
        return field_value(source["fieldRef"]["fieldPath"], pod, pod_ip)
    for kind, ref_field in (("configMap", "configMapKeyRef"), ("secret", "secretKeyRef")):
        ref = source.get(ref_field)
        if ref is None:
            continue
        value = (lookup(kind, ref["name"]) or {}).get(ref["key"])
        if value is None:
            if ref.get("optional"):
                return ""
            raise EnvError(f"{kind} {ref['name']}/{ref['key']} not found (env {var['name']})")
        return value
    return ""
