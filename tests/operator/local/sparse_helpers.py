"""What the `loom up` tests of the sparse-mla examples share: running an example on the tiny
checkpoint, a JSON POST, the one-rank greedy reference, and a worker's /metrics text."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from loom_operator.local.snapshot import WorkerRow
from loom_operator.testing.fleet import FleetProcess, run_fleet
from loom_runtime.models.sparse_mla.loader import load_sparse_mla

ROOT = Path(__file__).resolve().parents[3]


@contextmanager
def example_fleet(
    name: str,
    root: Path,
    checkpoint: Path,
    env: dict[str, str],
    source: str = "loom://tiny-sparse-mla",
) -> Iterator[FleetProcess]:
    """`loom up examples/NAME.yaml` with its `source` (a whole line's URI) at `checkpoint`."""
    card = root / f"{name}.yaml"
    text = (ROOT / "examples" / f"{name}.yaml").read_text()
    card.write_text(text.replace(f"{source}\n", f"file://{checkpoint}\n"))
    with run_fleet(card, root / "state", env) as fleet:
        yield fleet


def post(url: str, body: dict[str, object]) -> Any:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as reply:
        return json.loads(reply.read())


def one_rank(checkpoint: Path, prompt: list[int], steps: int) -> list[int]:
    """Greedy tokens of the one-sequence forward in float32 (the example cards' precision)."""
    model = load_sparse_mla(checkpoint, dtype=torch.float32).model
    cache = model.new_cache(len(prompt) + steps)
    logits = model.forward(torch.tensor(prompt), cache)
    out: list[int] = []
    for _ in range(steps):
        out.append(int(logits[-1].argmax()))
        logits = model.forward(torch.tensor(out[-1:]), cache)
    return out


def metrics(worker: WorkerRow) -> str:
    base = worker.address if worker.address.startswith("http") else f"http://{worker.address}"
    with urllib.request.urlopen(f"{base}/metrics", timeout=30) as reply:
        return str(reply.read().decode())


def rank_labels(text: str) -> set[str]:
    """The ranks a worker's /metrics reports KV for."""
    return {line.split('rank="')[1].split('"')[0] for line in text.splitlines()
            if line.startswith("loom:rank_kv_bytes_per_token{")}  # fmt: skip


def sample(text: str, name: str) -> float:
    """The value of a one-sample metric family (its first sample named `name`)."""
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} is not in the metrics")
