"""Card files for local-fleet tests and benches: the tiny model, any roles, a chosen weights source
and version, fp64 engines (greedy ties vanish, so outputs compare exactly) and small KV pools;
and the small GLM-5-class cards the operator's scale bench and suites place on kwok nodes.

Owns the text of those cards; never starts anything.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


def small_glm(deployment: Mapping[str, Any], name: str, smaller: bool = False) -> dict[str, Any]:
    """examples/glm-5-class.yaml's DeploymentCard (`deployment`) with one 2-GPU replica per role
    (CPU and memory scaled with the GPUs); `smaller`: one GPU per worker (no splits) and one
    router replica."""
    card = copy.deepcopy(dict(deployment))
    card["metadata"] = {"name": name}
    roles = card["spec"]["roles"]
    roles["prefill"]["parallelism"] = {"dp": 1, "tp": 1, "pcp": 2, "dcp": 2, "ep": 2}
    roles["decode"]["parallelism"] = {"dp": 2, "tp": 1, "ep": 2}
    for role in roles.values():
        role["replicas"], role["resources"] = 1, {"cpu": 24, "memory": "250Gi", "gpus": 2}
    if smaller:
        for role in roles.values():
            role["parallelism"] = {"dp": 1, "tp": 1, "pcp": 1, "dcp": 1, "ep": 1}
            role["resources"] = {"cpu": 12, "memory": "125Gi", "gpus": 1}
        card["spec"]["router"]["replicas"] = 1
    return card


CARD = """\
apiVersion: loom.dev/v1alpha1
kind: ModelCard
metadata:
  name: {model}
spec:
  family: llama
  components:
    - name: decoder
      kind: transformer
      source:
        uri: {source}
      weightsVersion: {version}
      precision: {{weights: fp32, kv: fp32}}
      requiredFor: [generate]
  loops:
    - name: generate
      kind: ar_decode
      components: [decoder]
      cachePolicy: prefix
  recipe: {{method: base, assumesLoop: generate, assumesPrecision: fp32}}
---
apiVersion: loom.dev/v1alpha1
kind: DeploymentCard
metadata:
  name: {name}
spec:
  modelCard: {model}
  roles:
{roles}
  router:
    disaggregation: {{minUncachedTokens: {min_uncached}}}
  weightSync:
    strategy: {strategy}
    maxUnavailable: {max_unavailable}
    drainTimeoutSeconds: {drain}
  failover: {{healthTimeoutSeconds: {health_timeout}}}
{autoscaling}"""
ROLE = """\
    {role}:
      replicas: {replicas}
      engine:
        blockSize: 16
        maxModelLen: {max_model_len}
        maxNumSeqs: {max_num_seqs}
        maxNumBatchedTokens: 256
        dtype: {dtype}
"""


def card_text(
    source: str,
    version: str = "v1",
    roles: Mapping[str, int] | None = None,
    name: str = "tiny-local",
    model: str = "tiny",
    strategy: str = "Rolling",
    max_unavailable: int = 1,
    drain: int = 30,
    health_timeout: float = 5.0,
    min_uncached: int = 0,
    dtype: str = "fp64",
    max_model_len: int = 512,
    max_num_seqs: int = 8,
    autoscaling: str = "",
) -> str:
    """A ModelCard + DeploymentCard for `loom up` as YAML (default: one aggregated worker);
    `autoscaling`: the section's YAML body (indented under `autoscaling:`), if any."""
    role_text = "".join(
        ROLE.format(
            role=r,
            replicas=n,
            dtype=dtype,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
        )
        for r, n in (roles or {"aggregated": 1}).items()
    )
    return CARD.format(
        source=source,
        version=version,
        roles=role_text,
        name=name,
        model=model,
        strategy=strategy,
        max_unavailable=max_unavailable,
        drain=drain,
        health_timeout=health_timeout,
        min_uncached=min_uncached,
        autoscaling=f"  autoscaling:\n{autoscaling}" if autoscaling else "",
    )
