"""The rendered `vllm serve` commands, parsed by vLLM 0.33.0's own CLI parser in its own cached
virtual environment (`make vllm-venv`; no GPU needed to parse): every flag accepted."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from loom_operator.api.documents import load_documents, parse_documents
from loom_operator.k8s.render.vllm import VLLM_VERSION, vllm_args, vllm_env
from loom_runtime.wire.engine_settings import SETTINGS

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parents[2] / "examples"
VENV = Path(os.environ.get("LOOM_VLLM_VENV", Path.home() / ".cache/loom/vllm" / f"v{VLLM_VERSION}"))


def parse(argvs: list[list[str]]) -> list[dict[str, Any]]:
    python = VENV / "bin" / "python"
    assert python.exists(), f"no vLLM {VLLM_VERSION} environment at {VENV}: run `make vllm-venv`"
    concrete = [[a.replace("$(POD_IP)", "127.0.0.1") for a in argv] for argv in argvs]
    out = subprocess.run([str(python), str(HERE / "vllm_parse.py")], input=json.dumps(concrete),
                         capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, VLLM_TARGET_DEVICE="cpu"))  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    results: list[dict[str, Any]] = json.loads(out.stdout.strip().splitlines()[-1])
    return results


@pytest.fixture(scope="module")
def reference() -> list[list[str]]:
    cards = load_documents(EXAMPLES / "glm-5-class.yaml")
    (model,), (deployment,) = cards.model_cards, cards.deployment_cards
    return [vllm_args(model, deployment, role) for role in ("prefill", "decode")]


def no_prefix_caching_prefill() -> list[str]:
    """The reference prefill with its engine's prefixCaching false (and no kvOffload, which
    needs prefix caching), and a KV pool of 1.5 GiB (kvCacheGiB)."""
    cards = load_documents(EXAMPLES / "glm-5-class.yaml")
    (model,), (deployment,) = cards.model_cards, cards.deployment_cards
    doc = deployment.model_dump(mode="json", by_alias=True, exclude_none=True)
    prefill = doc["spec"]["roles"]["prefill"]
    prefill.pop("kvOffload")
    prefill["engine"]["prefixCaching"] = False
    prefill["engine"]["kvCacheGiB"] = 1.5
    (off,) = parse_documents([(0, doc)], "test").deployment_cards
    return vllm_args(model, off, "prefill")


def test_vllm_accepts_every_flag_of_the_reference_deployment(reference: list[list[str]]) -> None:
    bogus = [*reference[0][:3], "--prefill-context-parallelism", "8"]  # a made-up flag
    prefill, decode, refused, uncached = parse([*reference, bogus, no_prefix_caching_prefill()])
    assert prefill == {"ok": True, "model": "zai-org/GLM-5", "block_size": 64, "pcp": 8, "dcp": 8,
                       "prefix_caching": True, "kv_cache_memory_bytes": None}  # fmt: skip
    assert decode["ok"] is True, decode
    assert refused["ok"] is False, "the parser must refuse a flag vLLM does not have"
    assert uncached == {**prefill, "prefix_caching": False, "kv_cache_memory_bytes": 3 * 2**29}


def test_vllm_reads_the_variables_the_renderer_writes() -> None:
    """Each engine setting vLLM reads from its environment is one of vLLM's own variables, and
    the value the renderer writes turns it on (vllm/envs.py parses it)."""
    names = [s.vllm_env for s in SETTINGS if s.vllm_env is not None]
    assert names == ["VLLM_BATCH_INVARIANT"]
    cards = load_documents(EXAMPLES / "tiny-aggregated.yaml")
    (model,), (deployment,) = cards.model_cards, cards.deployment_cards
    doc = deployment.model_dump(mode="json", by_alias=True, exclude_none=True)
    doc["spec"]["roles"]["aggregated"]["engine"]["batchInvariant"] = True
    (invariant,) = parse_documents([(0, doc)], "test").deployment_cards
    written = {e["name"]: e["value"] for e in vllm_env(model, invariant, "aggregated")}
    read = f"import json, vllm.envs as e; print(json.dumps([getattr(e, n) for n in {names!r}]))"
    python = VENV / "bin" / "python"
    assert python.exists(), f"no vLLM {VLLM_VERSION} environment at {VENV}: run `make vllm-venv`"
    base = {k: v for k, v in os.environ.items() if k not in names} | {"VLLM_TARGET_DEVICE": "cpu"}
    for env, expected in (({n: written[n] for n in names}, True), ({}, False)):
        out = subprocess.run(
            [str(python), "-c", read], capture_output=True, text=True, timeout=300,
            env=base | env,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        assert json.loads(out.stdout.strip().splitlines()[-1]) == [expected] * len(names)
