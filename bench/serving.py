"""Serving benchmark with a real third-party client: guidellm, in its default streaming mode,
against `loom up CARD` (the tiny P/D fleet by default) at concurrency 1, 4 and 16 with
synthetic prompts; the tokenizer is the local checkpoint's directory.

guidellm runs from its own virtual environment (it pins its own torch and transformers), made
once in ~/.cache/loom/guidellm-venv (`--venv`). Prints TTFT, ITL, output tok/s, req/s and the
error count per concurrency; guidellm's report goes under `--out`, the summary to `--summary`.
Usage:

    .venv/bin/python bench/serving.py --max-requests 32   # ~5 min on 2 CPU cores
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from loom_operator.local.cards import parse_fleet_cards
from loom_operator.local.ports import free_ports
from loom_runtime.models.tiny import resolve_source

GUIDELLM = "guidellm==0.8.1"
DEFAULT_VENV = Path.home() / ".cache" / "loom" / "guidellm-venv"


def guidellm_bin(venv: Path) -> Path:
    """guidellm's executable, installing it into `venv` the first time (pip shows progress)."""
    exe = venv / "bin" / "guidellm"
    if exe.exists():
        return exe
    print(f"[serving] installing {GUIDELLM} into {venv} (once; it brings its own torch)")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", GUIDELLM], check=True)
    return exe


def _get(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def wait_ready(base: str, proc: subprocess.Popen[bytes], timeout: float = 600.0) -> str:
    """The served model's name once the fleet answers a completion."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"loom up exited with {proc.returncode}")
        try:
            model = _get(base + "/v1/models")["data"][0]["id"]
            body = json.dumps({"model": model, "prompt": "warm up", "max_tokens": 2}).encode()
            req = urllib.request.Request(base + "/v1/completions", data=body, method="POST")
            req.add_header("Content-Type", "application/json")
            with urllib.request.urlopen(req, timeout=30) as resp:
                if resp.status == 200:
                    return str(model)
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the fleet at {base} was not ready after {timeout:g}s")


def scenario(args: argparse.Namespace, base: str, model: str, processor: Path,
             report: Path) -> dict[str, Any]:  # fmt: skip
    """guidellm's scenario: its default (streaming) chat requests, synthetic prompts, the
    checkpoint's tokenizer, one benchmark per concurrency."""
    return {
        "metadata": {"name": "loom-serving"},
        "spec": {
            "backend": {"kind": "openai_http", "target": base, "model": model},
            "profile": {"kind": "concurrent", "streams": [args.concurrency[0]]},
            "data": [{"kind": "synthetic_text", "prompt_tokens": args.prompt_tokens,
                      "output_tokens": args.output_tokens}],
            "tokenizer": {"kind": "huggingface_auto", "model": str(processor)},
            "constraints": [{"kind": "max_requests", "count": args.max_requests}],
            "outputs": [{"kind": "json", "path": str(report)}],
        },
        "benchmarks": [{"profile.streams": c} for c in args.concurrency],
    }  # fmt: skip


def _stat(metrics: dict[str, Any], name: str, key: str = "median") -> float | None:
    value = metrics.get(name, {}).get("successful", {}).get(key)
    return float(value) if isinstance(value, int | float) else None


def _percentile(metrics: dict[str, Any], name: str, which: str) -> float | None:
    pcts = metrics.get(name, {}).get("successful", {}).get("percentiles", {})
    value = pcts.get(which) if isinstance(pcts, dict) else None
    return float(value) if isinstance(value, int | float) else None


def summarize(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per benchmark (concurrency) of guidellm's JSON report."""
    rows = []
    for bench in report.get("benchmarks", []):
        m = bench.get("metrics", {})
        totals = bench.get("scheduler_metrics", {}).get("requests_made", {}) or {}
        strategy = bench.get("config", {}).get("strategy", {})
        rows.append({
            "concurrency": strategy.get("streams"),
            "requests": totals.get("successful"),
            "errors": totals.get("errored"),
            "ttft_ms_p50": _stat(m, "time_to_first_token_ms"),
            "ttft_ms_p90": _percentile(m, "time_to_first_token_ms", "p90"),
            "itl_ms_p50": _stat(m, "inter_token_latency_ms"),
            "output_tok_s": _stat(m, "output_tokens_per_second", "mean"),
            "req_s": _stat(m, "requests_per_second", "mean"),
        })  # fmt: skip
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--card", type=Path, default=Path("examples/tiny-pd.yaml"))
    p.add_argument("--concurrency", type=lambda s: [int(c) for c in s.split(",")],
                   default=[1, 4, 16])  # fmt: skip
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--max-requests", type=int, default=64, help="per concurrency level")
    p.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    p.add_argument("--out", type=Path, default=Path(".cache/bench/serving"),
                   help="guidellm's report, its scenario and the fleet's log")  # fmt: skip
    p.add_argument("--summary", type=Path, default=Path("bench/results/serving.json"))
    args = p.parse_args()
    exe = guidellm_bin(args.venv)
    cards = parse_fleet_cards(args.card)
    processor = resolve_source(cards.model.spec.components[0].source.uri)
    args.out.mkdir(parents=True, exist_ok=True)
    report = (args.out / "guidellm.json").resolve()
    (port,) = free_ports(1)
    base = f"http://127.0.0.1:{port}"
    state = Path(tempfile.mkdtemp(prefix="loom-bench-serving-"))
    up = subprocess.Popen(
        [sys.executable, "-m", "loom_operator.cli", "up", str(args.card), "--port", str(port),
         "--state-dir", str(state)],
        stdout=(args.out / "loom-up.log").open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        model = wait_ready(base, up)
        plan = args.out / "scenario.json"
        plan.write_text(json.dumps(scenario(args, base, model, processor, report), indent=1))
        argv = [str(exe), "run", "--scenario", str(plan), "--disable-console-interactive"]
        print("[serving]", " ".join(argv))
        env = {**os.environ, "GUIDELLM__LOGGING__CONSOLE_LOG_LEVEL": "WARNING"}
        subprocess.run(argv, check=True, env=env)
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(timeout=120)
        except subprocess.TimeoutExpired:
            up.kill()
    rows = summarize(json.loads(report.read_text()))
    summary = {"command": " ".join(sys.argv), "prompt_tokens": args.prompt_tokens,
               "output_tokens": args.output_tokens, "max_requests": args.max_requests,
               "guidellm": GUIDELLM, "card": str(args.card), "results": rows}  # fmt: skip
    args.summary.write_text(json.dumps(summary, indent=1) + "\n")
    for row in rows:
        print(json.dumps(row))
    return 0 if all(not r["errors"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
