"""Every panel's PromQL through a real Prometheus (Debian's `prometheus`, `make prometheus`)
scraping a live `loom up` fleet — router, 1 prefill and 1 decode worker of the tiny model — under
streaming load: each query returns series, and every metric it names is one some scraped target
exports (Prometheus' own list of metric names)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loom_operator.dashboards.files import Target, dashboard_files, targets
from loom_operator.dashboards.panels import RANGE, RATE
from loom_operator.local.ports import free_ports
from loom_operator.testing.cards import card_text
from loom_operator.testing.fleet import FleetProcess, run_fleet, wait_for
from loom_operator.testing.load import StreamingLoad
from loom_runtime.models.tiny import init_tiny

PROMETHEUS = shutil.which("prometheus")
NEEDS_PROMETHEUS = pytest.mark.skipif(
    PROMETHEUS is None,
    reason="Debian's prometheus is not on PATH: `make prometheus` (apt-get install -y "
    "prometheus) installs it; `make test` does so first",
)

MODEL = "tiny"
PROMPTS = tuple(f"Dashboard prompt {i}: " + "a b c d e f g h " * (2 + i % 3) for i in range(6))
SCRAPE_S = 1
WINDOW = "30s"  # stands in for Grafana's $__rate_interval and $__range
QUERIES_TIMEOUT_S = 120.0  # for every query to return series, load running
READY_TIMEOUT_S = 30.0
# Panels whose every query must read above zero after the load (rates over the last window).
MOVED_BY_LOAD = {"Requests by route and status", "Tokens per second", "KV pulled per second",
                 "Prompt tokens pulled per second", "Picks per endpoint",
                 "Time to first token (workers)", "Inter-token latency"}  # fmt: skip
# PromQL words that look like metric names but are not.
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
            "unless", "bool", "offset", "inf", "nan"}  # fmt: skip


def grafana_to_prometheus(expr: str) -> str:
    """The query as Grafana sends it, with a fixed window for its interval variables."""
    out = expr.replace(RATE, WINDOW).replace(RANGE, WINDOW)
    assert "$" not in out, f"a Grafana variable the test does not resolve: {expr}"
    return out


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects: identifiers outside label matchers and groupings
    that are not functions or keywords."""
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    bare = re.sub(r"\{[^}]*\}", "", bare)
    bare = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", bare)
    bare = re.sub(r"\[[^\]]*\]", "", bare)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", bare):
        after = bare[m.end() :].lstrip()
        if not after.startswith("(") and m.group(0).lower() not in KEYWORDS:
            names.add(m.group(0))
    return names


def test_metric_names_are_found_in_loom_queries() -> None:
    expr = (
        'histogram_quantile(0.9, sum by (le) (rate(vllm:itl_bucket{code!~"2..",x="a}"}[1m]))) '
        "/ sum(rate(loom:x_total[$__rate_interval])) and on (instance, job) (a:b or c)"
    )
    assert metric_names(expr) == {"vllm:itl_bucket", "loom:x_total", "a:b", "c"}


class Prometheus:
    """`prometheus` on a free port of 127.0.0.1, its HTTP API, and stopping it."""

    def __init__(self, root: Path, scrape: dict[str, list[str]]) -> None:
        self.port = free_ports(1)[0]
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": hosts}]}
                for job, hosts in scrape.items()
            ],
        }
        self.config = root / "prometheus.yml"
        self.config.write_text(json.dumps(config))  # JSON is YAML
        self.log = root / "prometheus.log"
        assert PROMETHEUS is not None
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={self.config}", f"--storage.tsdb.path={root / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(self.url + path + query, timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited ({self.proc.returncode}):\n{self.output()}")
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetProcess]:
    root = tmp_path_factory.mktemp("dashboards-fleet")
    # One torch thread per child process and a private model cache.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env["LOOM_CACHE"] = str(root / "cache")
    source = init_tiny(root / "weights", seed=0)
    card = root / "card.yaml"
    card.write_text(
        card_text(
            f"file://{source}", roles={"prefill": 1, "decode": 1}, name="dash", model=MODEL,
            min_uncached=0, dtype="fp32",
        )
    )  # fmt: skip
    with run_fleet(card, root / "state", env) as f:
        yield f


@pytest.fixture(scope="module")
def prometheus(
    fleet: FleetProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Prometheus]:
    status = fleet.status()
    assert status is not None
    scrape = {
        "loom-router": [f"127.0.0.1:{fleet.port}"],
        "loom-workers": [w.address for w in status.workers],
    }
    prom = Prometheus(tmp_path_factory.mktemp("prometheus"), scrape)
    try:
        wait_for(prom.ready, READY_TIMEOUT_S, "prometheus to be ready")
        yield prom
    finally:
        prom.stop()


def bad_request(fleet: FleetProcess) -> int:
    """A completion without a prompt: the router answers 4xx (the errors panel's series)."""
    request = urllib.request.Request(
        fleet.endpoint + "/completions", json.dumps({"model": MODEL}).encode(),
        {"Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def every_target() -> list[Target]:
    return [t for text in dashboard_files().values() for t in targets(json.loads(text))]


def empty_queries(prom: Prometheus, queries: list[Target]) -> list[Target]:
    return [
        t for t in queries
        if not prom.get("/api/v1/query", query=grafana_to_prometheus(t.expr))["result"]
    ]  # fmt: skip


@NEEDS_PROMETHEUS
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_panel_query_returns_series_from_a_live_fleet(
    fleet: FleetProcess, prometheus: Prometheus
) -> None:
    queries = every_target()
    assert len(queries) >= 40
    with StreamingLoad(fleet.endpoint, MODEL, PROMPTS, max_tokens=12, clients=2) as load:
        load.wait_completed(4, 120)
        codes = {bad_request(fleet) for _ in range(3)}
        assert codes and all(400 <= c < 500 for c in codes), codes
        up = "up == 1"
        wait_for(
            lambda: len(prometheus.get("/api/v1/query", query=up)["result"]) == 3,
            60, "prometheus to scrape the router and both workers", interval=0.5,
        )  # fmt: skip
        left: list[Target] = list(queries)

        def all_answer() -> bool:
            left[:] = empty_queries(prometheus, left)
            return not left

        with contextlib.suppress(AssertionError):
            wait_for(all_answer, QUERIES_TIMEOUT_S, "every query to return series", interval=2)
        streams = load.stop()
    exported = set(prometheus.get("/api/v1/label/__name__/values"))
    unknown = sorted(
        f"  {t.dashboard} / {t.panel} [{t.ref_id}]: {name}"
        for t in queries
        for name in metric_names(t.expr)
        if name not in exported
    )
    empty = [f"  {t.dashboard} / {t.panel} [{t.ref_id}]: {t.expr}" for t in left]
    assert not unknown and not empty, (
        "metrics no scraped target exports:\n" + "\n".join(unknown)
        + "\nqueries with no series:\n" + "\n".join(empty)
    )  # fmt: skip
    assert all(s.ok for s in streams), [s.error for s in streams if not s.ok][:3]
    for t in queries:  # load ran: what it must have moved is above zero
        if t.panel in MOVED_BY_LOAD:
            values = [float(r["value"][1]) for r in prometheus.get(
                "/api/v1/query", query=grafana_to_prometheus(t.expr))["result"]]  # fmt: skip
            assert max(values) > 0, f"{t.dashboard} / {t.panel}: {t.expr} = {values}"

    named = {name for t in queries for name in metric_names(t.expr)}
    assert {"vllm:time_to_first_token_seconds_bucket", "loom:kv_pulled_bytes_total",
            "loom_router:routed_total", "loom:worker_phase"} <= named  # fmt: skip
