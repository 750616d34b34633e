"""A pod's volumes as files on this machine, and the bind mounts each container gets.

Owns the pod's volume folder (ConfigMap, Secret, emptyDir, projected service-account token,
downward API, hostPath); never writes outside it except the mount points themselves.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.node_agent.env import EnvError, Lookup, field_value

# (namespace, service account, audience or None, expirationSeconds) -> a signed token.
TokenRequest = Callable[[str, str, str | None, int], str]


@dataclass(frozen=True)
class Mount:
    """One bind mount into a container's private mount namespace."""

    source: Path
    target: str
    read_only: bool


def _write_items(folder: Path, data: Mapping[str, str], items: list[dict[str, Any]] | None) -> None:
    pairs = [(i["key"], i["path"]) for i in items] if items else [(k, k) for k in data]
    for key, rel in pairs:
        if key not in data:
            raise EnvError(f"key {key!r} not found for volume {folder.name}")
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(data[key])


def _projected(
    folder: Path,
    sources: list[dict[str, Any]],
    pod: Mapping[str, Any],
    pod_ip: str,
    lookup: Lookup,
    token: TokenRequest,
) -> None:
    meta, spec = pod["metadata"], pod["spec"]
    for source in sources:
        if "serviceAccountToken" in source:
            sat = source["serviceAccountToken"]
            value = token(
                meta["namespace"],
                spec.get("serviceAccountName") or "default",
                sat.get("audience"),
                int(sat.get("expirationSeconds") or 3607),
            )
            (folder / sat["path"]).write_text(value)
        for kind, key in (("configMap", "configMap"), ("secret", "secret")):
            if key in source:
                ref = source[key]
                data = lookup(kind, ref["name"])
                if data is None:
                    if ref.get("optional"):
                        continue
                    raise EnvError(f"{kind} {ref['name']!r} not found (projected volume)")
                _write_items(folder, data, ref.get("items"))
        if "downwardAPI" in source:
            _downward(folder, source["downwardAPI"].get("items") or [], pod, pod_ip)


def _downward(
    folder: Path, items: list[dict[str, Any]], pod: Mapping[str, Any], pod_ip: str
) -> None:
    for item in items:
        if "fieldRef" in item:
            path = folder / item["path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(field_value(item["fieldRef"]["fieldPath"], pod, pod_ip))


def materialise(
    root: Path, pod: Mapping[str, Any], pod_ip: str, lookup: Lookup, token: TokenRequest
) -> dict[str, Path]:
    """Writes every volume of the pod under `root/<volume>`; returns volume name → folder.

    Raises EnvError when a required ConfigMap or Secret is missing (the caller retries, as
    the kubelet does).
    """
    folders: dict[str, Path] = {}
    for volume in pod["spec"].get("volumes") or []:
        name = volume["name"]
        if "hostPath" in volume:
            folders[name] = Path(volume["hostPath"]["path"])
            continue
        folder = root / name
        if "emptyDir" in volume and folder.exists():
            folders[name] = folder  # an emptyDir outlives container restarts
            continue
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        if "configMap" in volume or "secret" in volume:
            kind = "configMap" if "configMap" in volume else "secret"
            ref = volume[kind]
            data = lookup(kind, ref.get("name") or ref.get("secretName", ""))
            if data is None and not ref.get("optional"):
                raise EnvError(f"{kind} for volume {name!r} not found")
            _write_items(folder, data or {}, ref.get("items"))
        elif "projected" in volume:
            _projected(folder, volume["projected"].get("sources") or [], pod, pod_ip, lookup, token)
        elif "downwardAPI" in volume:
            _downward(folder, volume["downwardAPI"].get("items") or [], pod, pod_ip)
        folders[name] = folder
    return folders


def mounts(container: Mapping[str, Any], folders: Mapping[str, Path]) -> list[Mount]:
    """The bind mounts of one container, in its volumeMounts order."""
    out = []
    for vm in container.get("volumeMounts") or []:
        source = folders[vm["name"]]
        if vm.get("subPath"):
            source = source / vm["subPath"]
        out.append(Mount(source, vm["mountPath"], bool(vm.get("readOnly"))))
    return out
