"""P/D faults with real worker processes: a prefill killed between prefill and pull, and a decode
killed mid-pull. Each ends with a clear outcome (the aggregated tokens under "recompute", a 500
kv_transfer_failed under "fail", an expired lease on the prefill) and no leaked block on the
survivor, checked through its /metrics pool accounting. Both connectors, NIXL and TCP."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.types import SamplingParams
from loom_runtime.testing.processes import Launcher, Proc, poll, post
from loom_runtime.wire.kv_transfer import FIELD
from loom_runtime.wire.pd import decode_body, prefill_body

MODEL = "tiny-pd"
MAX_TOKENS = 6
COMMON = ["--max-model-len", "1024", "--num-blocks", "128", "--max-num-seqs", "4"]
KINDS = ["nixl", "tcp"]


def prompt(n: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return [int(t) for t in torch.randint(10, 4000, (n,), generator=gen)]


def request(tokens: list[int]) -> dict[str, Any]:
    return {
        "model": MODEL,
        "prompt": tokens,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": 0,
    }


@pytest.fixture(scope="module")
def aggregated(tiny_checkpoint: Path) -> Iterator[Engine]:
    """The reference: an in-process aggregated engine on the same float64 weights."""
    engine = Engine.from_checkpoint(
        tiny_checkpoint, EngineConfig(dtype=torch.float64, max_model_len=1024, num_blocks=128)
    )
    yield engine
    engine.shutdown()


def expected_tokens(engine: Engine, tokens: list[int]) -> list[str]:
    sampling = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    out = engine.generate(tokens, sampling).output_token_ids
    return [engine.tokenizer.decode([t]) for t in out]


def prefill_step(prefill: Proc, tokens: list[int]) -> dict[str, Any]:
    """Step 1 of the proxy's flow; returns the prefill's answer (with the lease)."""
    status, answer, _ = post(prefill.base_url + "/v1/completions", prefill_body(request(tokens)))
    assert status == 200, answer
    assert answer["kv_transfer_params"]["do_remote_prefill"] is True
    # The worker's stats snapshot is taken after the step that answered: a scrape may precede it.
    poll(lambda: prefill.metric("loom:kv_leases") == 1, 10, "the prefill to hold one KV lease")
    return dict(answer)


@pytest.fixture(scope="module", params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def decodes(launcher: Launcher, kind: str) -> Iterator[dict[str, Proc]]:
    """One decode per transfer-failure policy; they survive every test of the module."""
    flags = ["--kv-connector", kind, *COMMON]
    with (
        launcher.worker(
            "decode", *flags, "--on-transfer-failure", "recompute", name=f"decode-recompute-{kind}"
        ) as recompute,
        launcher.worker(
            "decode", *flags, "--on-transfer-failure", "fail", name=f"decode-fail-{kind}"
        ) as fail,
    ):
        yield {"recompute": recompute, "fail": fail}


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_prefill_killed_between_prefill_and_pull(
    launcher: Launcher, kind: str, decodes: dict[str, Proc], aggregated: Engine, policy: str
) -> None:
    decode = decodes[policy]
    tokens = prompt(400, seed=11 if policy == "recompute" else 12)
    failures = decode.metric("loom:kv_transfer_failures_total")
    with launcher.worker(
        "prefill", "--kv-connector", kind, *COMMON, name=f"prefill-{kind}-{policy}"
    ) as prefill:
        answer = prefill_step(prefill, tokens)
        prefill.kill()
    status, body, _ = post(
        decode.base_url + "/v1/completions", decode_body(request(tokens), answer[FIELD])
    )
    if policy == "recompute":
        assert status == 200, body
        assert body["choices"][0]["logprobs"]["tokens"] == expected_tokens(aggregated, tokens)
    else:
        assert status == 500, body
        assert body["error"]["code"] == "kv_transfer_failed"
        assert "KV pull" in body["error"]["message"] and "failed" in body["error"]["message"]
    assert decode.metric("loom:kv_transfer_failures_total") == failures + 1
    poll(decode.pool_whole, 30, "no leaked block on the surviving decode")


def test_decode_killed_mid_pull(launcher: Launcher, kind: str) -> None:
    tokens = prompt(400, seed=13)
    with (
        launcher.worker(
            "prefill",
            "--kv-connector",
            kind,
            "--kv-lease-seconds",
            "3",
            *COMMON,
            name=f"prefill-{kind}-victim",
        ) as prefill,
        launcher.worker(
            "decode", "--kv-connector", kind, *COMMON, name=f"decode-{kind}-victim"
        ) as decode,
    ):
        answer = prefill_step(prefill, tokens)
        prefill.pause()  # the decode's pull now hangs on the prefill's side channel

        def send() -> None:
            url, body = (
                decode.base_url + "/v1/completions",
                decode_body(request(tokens), answer[FIELD]),
            )
            with contextlib.suppress(OSError):  # the decode dies under this request
                post(url, body, timeout=60)

        try:
            sender = threading.Thread(target=send, daemon=True)
            sender.start()
            poll(lambda: decode.metric("loom:kv_pulls_in_flight") == 1, 30, "the pull to start")
            decode.kill()
        finally:
            prefill.resume()
        sender.join(timeout=60)
        poll(prefill.pool_whole, 60, "the prefill to take its blocks back (lease expiry)")
        assert prefill.metric("loom:kv_expired_total") == 1
        assert prefill.metric("loom:kv_free_blocks") == 128
