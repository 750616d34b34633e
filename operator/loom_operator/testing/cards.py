"""Card files for local-fleet tests and benches: the tiny model, any roles, a chosen weights source
and version, fp64 engines (greedy ties vanish, so outputs compare exactly) and small KV pools.

Owns the text of those cards; never starts anything.
"""

from __future__ import annotations

from collections.abc import Mapping

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
