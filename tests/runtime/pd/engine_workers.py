"""The in-process P/D harness: Engines with step threads joined by real connectors (TCP or NIXL
on free ports), a greedy request run to its end, and waits on the pools' accounting.

Owns starting and always shutting down those engines; never asserts what a test checks."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from loom_runtime.engine.collector import OutputCollector
from loom_runtime.engine.config import EngineConfig
from loom_runtime.engine.engine import Engine
from loom_runtime.engine.spec.mtp_runner import Drafter
from loom_runtime.engine.transfer_port import DisaggSettings, TransferParams
from loom_runtime.engine.types import EngineRequest, SamplingParams
from loom_runtime.kv.fp8 import Fp8Format
from loom_runtime.models.loader import LoadedModel
from loom_runtime.parallel.layout import ParallelLayout
from loom_runtime.transfer.connector import ConnectorSettings, KVConnector, build_connector


class Workers:
    """Engines with step threads; every one is shut down (and its connector closed) at the end."""

    def __init__(self, model: LoadedModel) -> None:
        self.model = model
        self.engines: list[Engine] = []
        self.connectors: list[KVConnector] = []

    def engine(
        self,
        role: str | None = None,
        block_size: int = 16,
        lease_s: float = 30.0,
        policy: str = "recompute",
        num_blocks: int | None = None,
        kv_fp8: Fp8Format | None = None,
        kv_offload_gib: float = 0.0,
        kind: str = "tcp",
        mtp_draft_tokens: int = 0,
        drafter: Drafter | None = None,
        hisparse_host_pool_gib: float = 0.0,
        hisparse_hot_slots: int | None = None,
        model: LoadedModel | None = None,
        start: bool = True,
    ) -> tuple[Engine, KVConnector | None]:
        """An engine of `role` (None: aggregated) on the shared model, or on its own `model`
        (one whose weights a test swaps); `start=False`: no step thread (the test steps it)."""
        model = model or self.model
        config = EngineConfig(
            hisparse_host_pool_gib=hisparse_host_pool_gib,
            hisparse_hot_slots=hisparse_hot_slots,
            dtype=torch.float64,
            kv_fp8=kv_fp8,
            kv_offload_gib=kv_offload_gib,
            mtp_draft_tokens=mtp_draft_tokens,
            block_size=block_size,
            max_model_len=1024,
            num_blocks=num_blocks or 2048 // block_size,
            max_num_seqs=4,
        )
        connector = None
        if role is None:
            engine = Engine(model, config, drafter=drafter)
        else:
            settings = ConnectorSettings(kind, role, side_port=0, lease_seconds=lease_s)  # type: ignore[arg-type]
            connector = build_connector(settings)
            self.connectors.append(connector)
            engine = Engine(
                model,
                config,
                disagg=DisaggSettings(role, policy),  # type: ignore[arg-type]
                connector=connector,
                drafter=drafter,
            )
        if start:
            engine.start()
        self.engines.append(engine)
        return engine, connector

    def ranked_engine(
        self,
        checkpoint: Path,
        layout: ParallelLayout,
        role: str = "prefill",
        block_size: int = 16,
        kind: str = "tcp",
        kv_fp8: Fp8Format | None = None,
        mtp_draft_tokens: int = 0,
        drafter: Drafter | None = None,
    ) -> Engine:
        """A P/D engine (`role`) whose forwards run on rank processes of `layout` (gloo),
        started from the checkpoint (its ranks load it too); a decode's ranks draft with MTP."""
        config = EngineConfig(
            dtype=torch.float64,
            block_size=block_size,
            max_model_len=1024,
            num_blocks=2048 // block_size,
            max_num_seqs=4,
            parallel=layout,
            collective_timeout_s=60.0,
            kv_fp8=kv_fp8,
            mtp_draft_tokens=mtp_draft_tokens,
        )
        settings = ConnectorSettings(kind, role, side_port=0, lease_seconds=30.0)  # type: ignore[arg-type]
        connector = build_connector(settings)
        self.connectors.append(connector)
        engine = Engine.from_checkpoint(
            checkpoint,
            config,
            disagg=DisaggSettings(role),
            connector=connector,  # type: ignore[arg-type]
            drafter=drafter,
        )
        engine.start()
        self.engines.append(engine)
        return engine

    def close(self) -> None:
        for engine in self.engines:
            engine.shutdown()
        for connector in self.connectors:
            connector.close()


def run(
    engine: Engine,
    rid: str,
    tokens: tuple[int, ...],
    max_tokens: int,
    kv: TransferParams | None = None,
) -> OutputCollector:
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    req = EngineRequest(rid, tokens, sampling, kv_transfer=kv)
    collector = OutputCollector(req)
    engine.add_request(req, collector)
    assert collector.wait(time.monotonic() + 120), f"{rid} did not finish"
    return collector


def wait_for(check: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def whole(engine: Engine) -> bool:
    s = engine.stats()
    return s.num_free_blocks == s.num_blocks and not s.num_kv_leases and not s.num_kv_pulls
