"""P/D == aggregated for sparse-mla through real `loom runtime` workers and the P/D proxy: a
prefill (32-token blocks) and a decode (16-token blocks) per connector, NIXL and TCP, on prompts
from one block to ~5x the indexer's top-k; greedy, float64, logprobs compared too. A HiSparse
decode (`--hisparse-host-pool-gib`) behind its own TCP prefill gives the same answers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import torch

from loom_runtime.models.sparse_mla.tiny import INDEX_TOPK
from loom_runtime.testing.processes import Launcher, Proc, poll, post
from loom_runtime.wire.headers import PD_HEADER

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

MAX_TOKENS = 6
LENGTHS = (9, 150, 300)
KINDS = ["nixl", "tcp"]
HISPARSE = ["--kv-connector", "tcp", "--hisparse-host-pool-gib", "0.01"]
COMMON = ["--max-model-len", "1024", "--max-num-seqs", "2", "--num-blocks", "64"]


def body(n: int, seed: int) -> dict[str, object]:
    gen = torch.Generator().manual_seed(seed)
    prompt = [int(t) for t in torch.randint(10, 1000, (n,), generator=gen)]
    return {
        "model": "tiny-pd",
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": 1,
    }


@pytest.fixture(scope="module")
def workers(
    tmp_path_factory: pytest.TempPathFactory, sparse_checkpoint: Path
) -> Iterator[dict[str, Proc]]:
    """An aggregated worker and, per connector, a prefill and a decode behind a proxy."""
    tmp = tmp_path_factory.mktemp("pd-sparse")
    launcher = Launcher(tmp, sparse_checkpoint, family="sparse-mla")
    with ExitStack() as stack:
        urls = {"aggregated": stack.enter_context(launcher.worker("aggregated", *COMMON))}
        for kind in KINDS:
            flags = ["--kv-connector", kind, *COMMON]
            prefill = stack.enter_context(
                launcher.worker("prefill", *flags, "--block-size", "32", name=f"prefill-{kind}")
            )
            decode = stack.enter_context(
                launcher.worker("decode", *flags, "--block-size", "16", name=f"decode-{kind}")
            )
            urls[kind] = stack.enter_context(launcher.proxy(prefill, decode, name=f"proxy-{kind}"))
        flags = ["--kv-connector", "tcp", *COMMON, "--block-size"]
        prefill = stack.enter_context(launcher.worker("prefill", *flags, "32", name="prefill-hs"))
        hisparse = [*HISPARSE, *COMMON, "--block-size", "16"]
        urls["hisparse-decode"] = stack.enter_context(
            launcher.worker("decode", *hisparse, name="decode-hisparse")
        )
        urls["hisparse"] = stack.enter_context(
            launcher.proxy(prefill, urls["hisparse-decode"], name="proxy-hisparse")
        )
        yield urls


@pytest.mark.parametrize("kind", [*KINDS, "hisparse"])
def test_sparse_mla_pd_workers_give_the_aggregated_tokens(
    workers: dict[str, Proc], kind: str
) -> None:
    assert max(LENGTHS) > 4 * INDEX_TOPK
    for i, n in enumerate(LENGTHS):
        url = "/v1/completions"
        _, agg, _ = post(workers["aggregated"].base_url + url, body(n, seed=20 + i))
        status, pd, headers = post(workers[kind].base_url + url, body(n, seed=20 + i))
        assert status == 200, pd
        assert headers[PD_HEADER] == "remote-prefill"  # the KV really came from the prefill
        a, b = pd["choices"][0]["logprobs"], agg["choices"][0]["logprobs"]
        assert len(b["tokens"]) == MAX_TOKENS and a["tokens"] == b["tokens"], (kind, n)
        assert a["token_logprobs"] == pytest.approx(b["token_logprobs"], abs=1e-6), (kind, n)


def test_the_hisparse_decode_worker_reports_its_pulls_and_tiers(workers: dict[str, Proc]) -> None:
    """After its proxy served the prompts: the pulled blocks' keys crossed to the device, the
    host path ran (misses), every hot buffer is released and the pool is whole."""
    _, out, _ = post(workers["hisparse"].base_url + "/v1/completions", body(300, seed=60))
    assert len(out["choices"][0]["logprobs"]["tokens"]) == MAX_TOKENS
    decode = workers["hisparse-decode"]
    poll(decode.pool_whole, 30, "the HiSparse decode's pool to be whole")
    assert decode.metric("loom:hisparse_keys_h2d_bytes_total") > 0
    assert decode.metric("loom:hisparse_hot_misses_total") > 0
    assert decode.metric("loom:hisparse_hot_requests") == 0
    assert decode.metric("loom:kv_pulled_bytes_total") > 0
