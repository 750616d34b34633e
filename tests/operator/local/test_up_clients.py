"""Real clients, unmodified, against `loom up examples/tiny-pd.yaml` (router, one prefill, one
decode): lm-evaluation-harness's `local-completions` runs a log-likelihood task and a generation
task (bench/lm_eval/tasks) and its log-likelihoods equal a transformers forward of the same
checkpoint; `vllm bench serve` runs 20 random requests with none failed. Each client runs from
its own cached environment (`make lm-eval-venv`, `make vllm-venv`)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.operator.local.sparse_helpers import ROOT, post

from loom_operator.testing.fleet import FleetProcess

LM_EVAL_PYTHON = Path.home() / ".cache/loom/lm-eval/v0.4.13/bin/python"
VLLM_PYTHON = Path.home() / ".cache/loom/vllm/v0.33.0/bin/python"
LL_TOL = 1e-4  # the card serves fp32 (cards have no fp64): the 1e-9 parity is the engine tests'
CLIENT_ENV = {
    "HF_HUB_OFFLINE": "1",  # the hub is not reachable here: the tasks and tokenizer are local
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "NO_COLOR": "1",
    "VLLM_TARGET_DEVICE": "cpu",  # the vLLM environment's CLI on this CPU-only machine
}


def need(tool: Path, target: str) -> Path:
    if not tool.exists():
        pytest.fail(f"{tool} is missing: run `make {target}` (a cached environment of its own)")
    return tool


EXAMPLE = "tiny-pd"


@pytest.fixture(scope="module")
def fleet(tiny_example: FleetProcess) -> FleetProcess:
    return tiny_example


def run_tool(cmd: list[str], cwd: Path, log: Path, timeout: float) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    with log.open("wb") as out:
        done = subprocess.run(cmd, cwd=cwd, env={**env, **CLIENT_ENV}, stdout=out,
                              stderr=subprocess.STDOUT, timeout=timeout, check=False)  # fmt: skip
    assert done.returncode == 0, f"{cmd[0]} failed ({done.returncode}):\n{log.read_text()[-4000:]}"


def lm_eval_command(endpoint: str, checkpoint: Path, out: Path) -> list[str]:
    """The documented command (docs/benchmarks.md), `endpoint` the router's /v1."""
    return [
        str(need(LM_EVAL_PYTHON, "lm-eval-venv")), "-m", "lm_eval", "--model", "local-completions",
        "--model_args", f"model=tiny,base_url={endpoint}/completions,tokenizer_backend=huggingface,"
        f"tokenizer={checkpoint},num_concurrent=1,max_retries=1,tokenized_requests=True",
        "--tasks", "loom_tiny_mc,loom_tiny_gen", "--include_path", "bench/lm_eval/tasks",
        "--batch_size", "1", "--log_samples", "--output_path", str(out),
    ]  # fmt: skip


def samples(out: Path, task: str) -> list[dict[str, Any]]:
    [path] = out.rglob(f"samples_{task}_*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def reference_loglikelihood(checkpoint: Path) -> Any:
    """log P(continuation | context) from a float64 transformers forward, tokenized as lm-eval's
    causal API models do (trailing spaces of the context move to the continuation; the whole
    string is encoded without special tokens and split at the context's length)."""
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(checkpoint)
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float64)

    @torch.no_grad()
    def score(context: str, continuation: str) -> float:
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole = tok(context + continuation, add_special_tokens=False).input_ids
        n = len(tok(context, add_special_tokens=False).input_ids)
        logp = torch.log_softmax(model(torch.tensor([whole])).logits[0], dim=-1)
        return sum(logp[i - 1, whole[i]].item() for i in range(n, len(whole)))

    return score


def test_lm_eval_local_completions_loglikelihoods_equal_transformers(
    fleet: FleetProcess, checkpoints: tuple[Path, Path], tmp_path: Path
) -> None:
    out = tmp_path / "lm-eval"
    cmd = lm_eval_command(fleet.endpoint, checkpoints[0], out)
    run_tool(cmd, ROOT, tmp_path / "lm-eval.log", timeout=600)
    score = reference_loglikelihood(checkpoints[0])
    mc = samples(out, "loom_tiny_mc")
    assert len(mc) == 4
    compared = 0
    for sample in mc:
        for args, resp in zip(sample["arguments"].values(), sample["resps"], strict=True):
            got = float(resp[0][0])
            assert got == pytest.approx(score(args["arg_0"], args["arg_1"]), abs=LL_TOL)
            compared += 1
    assert compared == 11  # every choice of every question
    gen = samples(out, "loom_tiny_gen")
    assert len(gen) == 3
    tok = pytest.importorskip("transformers").AutoTokenizer.from_pretrained(checkpoints[0])
    for sample in gen:  # each answer is what the server generates for the ids lm-eval sends
        [args] = sample["arguments"].values()
        ids = tok(args["arg_0"], add_special_tokens=False).input_ids
        body = {"model": "tiny", "prompt": ids, "max_tokens": 8, "temperature": 0,
                "stop": ["\n"]}  # fmt: skip
        want = post(f"{fleet.endpoint}/completions", body)["choices"][0]["text"]
        assert sample["resps"][0][0] == want
    [results] = out.rglob("results_*.json")
    metrics = json.loads(results.read_text())["results"]
    assert "acc,none" in metrics["loom_tiny_mc"] and "exact_match,none" in metrics["loom_tiny_gen"]


def test_vllm_bench_serve_has_no_failed_requests(
    fleet: FleetProcess, checkpoints: tuple[Path, Path], tmp_path: Path
) -> None:
    base = fleet.endpoint.removesuffix("/v1")
    cmd = [
        str(need(VLLM_PYTHON, "vllm-venv")), "-m", "vllm.entrypoints.cli.main", "bench", "serve",
        "--backend", "openai", "--base-url", base, "--endpoint", "/v1/completions",
        "--model", "tiny", "--tokenizer", str(checkpoints[0]), "--dataset-name", "random",
        "--random-input-len", "64", "--random-output-len", "16", "--num-prompts", "20",
        "--max-concurrency", "4", "--seed", "0", "--save-result", "--result-dir", str(tmp_path),
        "--result-filename", "bench.json",
    ]  # fmt: skip
    log = tmp_path / "bench.log"
    run_tool(cmd, tmp_path, log, timeout=600)
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["completed"] == 20 and result["failed"] == 0, log.read_text()[-3000:]
    assert result["total_output_tokens"] > 0
