"""`loom runtime` flags -> what the worker loads and how it serves; refusals say what to do."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

from loom_runtime.card import CardError
from loom_runtime.cli import build_parser
from loom_runtime.kv.fp8 import Fp8Format
from loom_runtime.parallel.layout import ParallelLayout
from loom_runtime.serve import main
from loom_runtime.serve.main import UsageError, plan_worker

CARD = """\
apiVersion: loom.dev/v1alpha1
kind: ModelCard
metadata: {{name: my-model}}
spec:
  family: llama
  components:
    - name: decoder
      kind: transformer
      source: {{uri: "{uri}"}}
      weightsVersion: v5
      precision: {{kv: {kv}}}
      requiredFor: [generate]
  loops: [{{name: generate, kind: ar_decode, components: [decoder]}}]
  recipe: {{method: base, assumesLoop: generate, assumesPrecision: bf16}}
{architecture}"""
ARCHITECTURE = """\
  architecture:
    numLayers: 6
    hiddenSize: 256
    numAttentionHeads: 4
    numKeyValueHeads: 2
    headDim: 64
    attention: {kind: gqa, quantGroupSize: 32}
"""


def _card(tmp_path: Path, uri: str = "file:ckpt", kv: str = "bf16", arch: str = "") -> Path:
    path = tmp_path / "card.yaml"
    path.write_text(CARD.format(uri=uri, kv=kv, architecture=arch))
    return path


def _args(card: Path, *flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["runtime", "--card", str(card), *flags])


def test_the_cli_routes_runtime_to_serve_main() -> None:
    args = build_parser().parse_args(["runtime", "--card", "c.yaml", "--port", "9"])
    assert args.run is main.run
    assert (args.role, args.host, args.port, args.block_size) == ("aggregated", "127.0.0.1", 9, 16)


def test_card_and_flags_become_engine_and_serve_settings(tmp_path: Path) -> None:
    card = _card(tmp_path)
    plan = plan_worker(
        _args(card, "--num-blocks", "40", "--max-model-len", "256", "--dtype", "float64",
              "--control-port", "7001"),
        {"LOOM_CONTROL_TOKEN": "from-env"},
    )  # fmt: skip
    assert plan.checkpoint == (tmp_path / "ckpt").resolve()  # file:relative is card-relative
    assert plan.engine.model_name == "my-model"
    assert plan.engine.weights_version == "v5"
    assert (plan.engine.num_blocks, plan.engine.max_model_len) == (40, 256)
    assert plan.engine.dtype == torch.float64
    assert (plan.serve.control_port, plan.serve.control_token) == (7001, "from-env")


def test_a_card_with_fp8_kv_plans_an_fp8_cache_with_the_cards_group_size(tmp_path: Path) -> None:
    assert plan_worker(_args(_card(tmp_path)), {}).engine.kv_fp8 is None  # bf16 KV: --dtype
    fp8 = plan_worker(_args(_card(tmp_path, kv="fp8")), {}).engine.kv_fp8
    assert fp8 == Fp8Format(128)  # no architecture: the card's default group
    grouped = plan_worker(_args(_card(tmp_path, kv="fp8", arch=ARCHITECTURE)), {}).engine
    assert grouped.kv_fp8 == Fp8Format(32) and grouped.dtype == torch.float32


def test_flags_override_the_card_version_and_the_env_token(tmp_path: Path) -> None:
    args = _args(_card(tmp_path), "--weights-version", "v9", "--control-port", "1",
                 "--control-token", "flag")  # fmt: skip
    plan = plan_worker(args, {"LOOM_CONTROL_TOKEN": "env"})
    assert plan.engine.weights_version == "v9"
    assert plan.serve.control_token == "flag"


def test_pd_roles_plan_a_kv_connector(tmp_path: Path) -> None:
    card = _card(tmp_path)
    prefill = plan_worker(
        _args(card, "--role", "prefill", "--host", "10.0.0.7", "--kv-connector", "tcp",
              "--kv-side-port", "7100", "--kv-lease-seconds", "12"),
        {},
    )  # fmt: skip
    assert prefill.disagg is not None and prefill.connector is not None
    assert (prefill.disagg.role, prefill.connector.role) == ("prefill", "prefill")
    assert prefill.connector.kind == "tcp"
    assert (prefill.connector.side_host, prefill.connector.side_port) == ("10.0.0.7", 7100)
    assert prefill.connector.lease_seconds == 12
    decode = plan_worker(_args(card, "--role", "decode", "--on-transfer-failure", "fail"), {})
    assert decode.disagg is not None and decode.connector is not None
    assert decode.disagg.on_transfer_failure == "fail"
    assert decode.connector.kind == "nixl"  # the default
    aggregated = plan_worker(_args(card), {})
    assert (aggregated.disagg, aggregated.connector) == (None, None)


def test_pd_flags_out_of_range_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--kv-lease-seconds"):
        plan_worker(_args(_card(tmp_path), "--role", "prefill", "--kv-lease-seconds", "0"), {})
    with pytest.raises(UsageError, match="--kv-side-host"):  # 0.0.0.0 is no address to reach
        plan_worker(_args(_card(tmp_path), "--role", "prefill", "--host", "0.0.0.0"), {})
    everywhere = plan_worker(
        _args(
            _card(tmp_path), "--role", "prefill", "--host", "0.0.0.0", "--kv-side-host", "10.1.2.3"
        ),
        {},
    )
    assert everywhere.connector is not None
    assert (everywhere.connector.bind_host, everywhere.connector.side_host) == (
        "0.0.0.0",
        "10.1.2.3",
    )


def test_a_control_port_needs_a_token(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="LOOM_CONTROL_TOKEN"):
        plan_worker(_args(_card(tmp_path), "--control-port", "7001"), {})


def test_bad_engine_settings_and_cards_are_reported(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="block_size"):
        plan_worker(_args(_card(tmp_path), "--block-size", "0"), {})
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: ModelCard\nspec: {}\n")
    with pytest.raises(CardError):
        plan_worker(_args(broken), {})


def test_run_exits_2_with_a_message_for_bad_pd_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main.run(_args(_card(tmp_path), "--role", "decode", "--kv-lease-seconds", "-1")) == 2
    assert "--kv-lease-seconds" in capsys.readouterr().err


def test_kv_offload_gib_becomes_the_engines_host_tier(tmp_path: Path) -> None:
    assert plan_worker(_args(_card(tmp_path)), {}).engine.kv_offload_gib == 0.0
    plan = plan_worker(_args(_card(tmp_path), "--kv-offload-gib", "1.5"), {})
    assert plan.engine.kv_offload_bytes == 3 << 29


def test_a_negative_kv_offload_size_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"kv_offload_gib must be >= 0"):
        plan_worker(_args(_card(tmp_path), "--kv-offload-gib", "-2"), {})


def test_no_prefix_caching_turns_the_engines_prefix_cache_off(tmp_path: Path) -> None:
    assert plan_worker(_args(_card(tmp_path)), {}).engine.prefix_caching is True
    engine = plan_worker(_args(_card(tmp_path), "--no-prefix-caching"), {}).engine
    assert engine.prefix_caching is False and not engine.use_prefix_cache
    with pytest.raises(UsageError, match="kv_offload_gib needs prefix_caching"):
        plan_worker(_args(_card(tmp_path), "--no-prefix-caching", "--kv-offload-gib", "1"), {})


def test_batch_invariant_turns_the_engines_batch_invariant_matmuls_on(tmp_path: Path) -> None:
    assert plan_worker(_args(_card(tmp_path)), {}).engine.batch_invariant is False
    assert plan_worker(_args(_card(tmp_path), "--batch-invariant"), {}).engine.batch_invariant


def test_hisparse_flags_become_the_engines_host_pool(tmp_path: Path) -> None:
    assert not plan_worker(_args(_card(tmp_path)), {}).engine.hisparse
    argv = ("--hisparse-host-pool-gib", "0.5", "--hisparse-hot-slots", "33")
    engine = plan_worker(_args(_card(tmp_path), *argv), {}).engine
    assert engine.hisparse_host_pool_bytes == 1 << 29 and engine.hisparse_hot_slots == 33
    # beside CPU KV offload (a decode role's hiSparse.offloadGiB): the offload keeps the pool's
    # evicted blocks (tests/runtime/engine/kv_memory/test_hisparse_offload.py)
    both = plan_worker(_args(_card(tmp_path), *argv, "--kv-offload-gib", "1"), {}).engine
    assert both.hisparse and both.kv_offload_bytes == 1 << 30


def test_parallel_flags_become_the_engines_layout(tmp_path: Path) -> None:
    assert plan_worker(_args(_card(tmp_path)), {}).engine.parallel == ParallelLayout()
    args = _args(_card(tmp_path), "--pcp", "2", "--dcp", "2", "--ep", "2", "--dcp-interleave",
                 "4", "--dcp-comm-backend", "a2a", "--collective-timeout", "30")  # fmt: skip
    engine = plan_worker(args, {}).engine
    assert engine.parallel == ParallelLayout(pcp=2, dcp=2, ep=2, interleave=4)
    assert (engine.dcp_backend, engine.collective_timeout_s) == ("a2a", 30.0)
    tp = plan_worker(_args(_card(tmp_path), "--tp", "2"), {}).engine
    assert tp.parallel == ParallelLayout(tp=2)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--dp", "2", "--pcp", "2"), "pcp > 1 cannot be combined with dp > 1"),
        (("--tp", "2", "--pcp", "2"), "tp combines with no other split"),
        (("--pcp", "2", "--dcp", "3"), "dcp"),
        (("--pcp", "2", "--hisparse-host-pool-gib", "1"), "HiSparse on ranks runs on DP × EP"),
    ],
)
def test_parallel_layouts_the_worker_cannot_run_are_usage_errors(
    tmp_path: Path, flags: tuple[str, ...], says: str
) -> None:
    with pytest.raises(UsageError, match=says):
        plan_worker(_args(_card(tmp_path), *flags), {})


def test_mtp_draft_tokens_become_the_engines_draft_count(tmp_path: Path) -> None:
    assert plan_worker(_args(_card(tmp_path)), {}).engine.mtp_draft_tokens == 0
    engine = plan_worker(_args(_card(tmp_path), "--mtp-draft-tokens", "3"), {}).engine
    assert engine.mtp_draft_tokens == 3
    with pytest.raises(UsageError, match="mtp_draft_tokens must be >= 0"):
        plan_worker(_args(_card(tmp_path), "--mtp-draft-tokens", "-1"), {})
    both = _args(_card(tmp_path), "--mtp-draft-tokens", "2", "--hisparse-host-pool-gib", "1")
    beside = plan_worker(both, {}).engine  # MTP's rows are one more layer of HiSparse's tiers
    assert (beside.mtp_draft_tokens, beside.hisparse_host_pool_gib) == (2, 1.0)


def test_chat_output_is_read_by_the_flags_else_the_cards_parsers_else_the_familys(
    tmp_path: Path,
) -> None:
    def parsers(card: Path, *flags: str) -> tuple[str | None, str | None]:
        chat = plan_worker(_args(card, *flags), {}).serve.chat_parsers
        return chat.tool_call_parser, chat.reasoning_parser

    assert parsers(_card(tmp_path)) == ("llama3_json", None)  # the llama family's
    own = _card(tmp_path, arch="  chat: {toolCallParser: glm45, reasoningParser: deepseek_r1}\n")
    assert parsers(own) == ("glm45", "deepseek_r1")
    flags = ("--tool-call-parser", "glm47", "--reasoning-parser", "glm45")
    assert parsers(own, *flags) == ("glm47", "glm45")
