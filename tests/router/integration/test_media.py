"""The router in front of real diffusion workers (tiny Wan checkpoint): the official `openai`
client's images.generate through it, video jobs created / polled / downloaded / cancelled under
the router's own ids, routing by predicted cost × load, worker errors passed through, and a job
whose worker is killed mid-way restarted from its seed on the other worker with the same frames."""

from __future__ import annotations

import base64
import io
import json
import sys
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import av
import numpy as np
import openai
import pytest
from PIL import Image
from tests.router.integration.conftest import TOKEN, Router, _call, _request

from loom_operator.testing.router import router_command
from loom_runtime.models.wan.tiny import init_tiny_wan
from loom_runtime.testing.processes import WAN_CARD, Proc, free_ports, get_json, poll, post, spawn

MODEL = "tiny-wan-router"
STEPS = 2

Launch = Callable[[int], AbstractContextManager[tuple[Router, list[Proc]]]]


@pytest.fixture(scope="module")
def launch(tmp_path_factory: pytest.TempPathFactory) -> Launch:
    """launch(n) -> a router with n diffusion workers (w0, w1, ...) behind it."""
    tmp = tmp_path_factory.mktemp("media")
    root = init_tiny_wan(tmp / "wan")
    card = tmp / "card.yaml"
    card.write_text(WAN_CARD.format(name=MODEL, path=root, steps=STEPS))
    count = [0]

    @contextmanager
    def start(n: int) -> Iterator[tuple[Router, list[Proc]]]:
        count[0] += 1
        with _workers(tmp, card, [f"w{i}" for i in range(n)], count[0]) as workers:
            specs = [{"id": f"w{i}", "url": w.base_url, "role": "aggregated",
                      "weights_version": "v1"} for i, w in enumerate(workers)]  # fmt: skip
            config = {
                "model_name": MODEL, "tokenizer_path": None, "block_size": 16, "hash_seed": "0",
                "hash_algo": "sha256_cbor", "router": {}, "failover": {"healthTimeoutSeconds": 2},
                "endpoints": specs, "diffusion": {"default_steps": STEPS},
            }  # fmt: skip
            path = tmp / f"router{count[0]}.json"
            path.write_text(json.dumps(config))
            port, admin = free_ports(2)
            cmd = router_command(path, port, admin, TOKEN, "--scrape-interval", "0.05")
            log = tmp / f"router{count[0]}.log"
            with spawn("router", cmd, log, f"http://127.0.0.1:{port}", "/ready") as proc:
                yield Router(proc, f"http://127.0.0.1:{admin}", log), workers

    return start


@contextmanager
def _workers(tmp: Path, card: Path, names: list[str], run: int) -> Iterator[list[Proc]]:
    if not names:
        yield []
        return
    [port] = free_ports(1)
    cmd = [
        sys.executable, "-m", "loom_runtime", "runtime", "--card", str(card), "--port", str(port),
        "--text-len", "16", "--max-video-jobs", "16",
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    log = tmp / f"{names[0]}-{run}.log"
    with (
        spawn(names[0], cmd, log, url, "/ready") as first,
        _workers(tmp, card, names[1:], run) as rest,
    ):
        yield [first, *rest]


@pytest.fixture(scope="module")
def pair(launch: Launch) -> Iterator[tuple[Router, list[Proc]]]:
    with launch(2) as started:
        yield started


def video(router: Router, **body: Any) -> dict[str, Any]:
    status, doc, _ = router.post("/v1/videos", {"prompt": "a fox", "size": "32x32", **body})
    assert status == 202, doc
    return dict(doc)


def status_of(router: Router, job_id: str) -> dict[str, Any]:
    status, doc, _ = router.get(f"/v1/videos/{job_id}")
    assert status == 200, doc
    return dict(doc)


def wait_job(router: Router, job_id: str, want: str, timeout: float = 120) -> dict[str, Any]:
    poll(lambda: status_of(router, job_id)["status"] in (want, "failed"), timeout, f"{job_id}")
    doc = status_of(router, job_id)
    assert doc["status"] == want, doc
    return doc


def content(base_url: str, job_id: str) -> np.ndarray:
    """The job's MP4, decoded to [F, H, W, 3] frames."""
    with urllib.request.urlopen(f"{base_url}/v1/videos/{job_id}/content", timeout=60) as resp:
        data, headers = resp.read(), resp.headers
    assert headers["Content-Type"] == "video/mp4" and job_id in headers["Content-Disposition"]
    with av.open(io.BytesIO(data)) as mp4:
        return np.stack([f.to_ndarray(format="rgb24") for f in mp4.decode(video=0)])


def running(worker: Proc) -> float:
    return worker.metrics().get(f'vllm:num_requests_running{{model_name="{MODEL}"}}', 0.0)


def _image(client: openai.OpenAI, n: int) -> Any:
    return client.images.generate(
        model=MODEL, prompt="a lighthouse", n=n, size="32x32",  # type: ignore[arg-type]
        response_format="b64_json", extra_body={"seed": 11},
    )  # fmt: skip


def test_openai_images_generate_through_the_router(pair: tuple[Router, list[Proc]]) -> None:
    router, _ = pair
    client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="unused", max_retries=0)
    try:
        made = [_image(client, n) for n in (2, 1)]
    finally:
        client.close()
    pngs = [[base64.b64decode(d.b64_json or "") for d in r.data or []] for r in made]
    assert [len(p) for p in pngs] == [2, 1]
    assert all(Image.open(io.BytesIO(p)).size == (32, 32) for p in pngs[0])
    assert pngs[1][0] == pngs[0][0]  # seed 11 on whichever worker: the same image
    assert router.metric("loom_router:requests_total", route="images", code="200") == 2


def test_a_video_job_is_created_polled_and_downloaded_under_the_routers_id(
    pair: tuple[Router, list[Proc]],
) -> None:
    router, _ = pair
    job = video(router, num_frames=5, seed=3)
    assert job["id"].startswith("video_") and job["restarts"] == 0 and job["seed"] == 3
    done = wait_job(router, job["id"], "completed")
    assert (done["id"], done["steps_done"], done["steps_total"]) == (job["id"], STEPS, STEPS)
    frames = content(router.url, job["id"])
    assert frames.shape == (5, 32, 32, 3)


def test_jobs_go_where_the_least_predicted_work_is(pair: tuple[Router, list[Proc]]) -> None:
    router, workers = pair
    big = video(router, num_frames=9, num_inference_steps=400)
    poll(lambda: running(workers[0]) == 1, 60, "the big job running on w0 (lowest id, idle)")
    small = video(router, num_frames=1)  # w0 holds the big job's predicted work: w1 takes it
    wait_job(router, small["id"], "completed")
    assert running(workers[0]) == 1  # still busy with the big one
    assert router.metric("loom_router:routed_total", endpoint="w1", reason="cost") >= 1
    status, doc, _ = _call(_request(f"{router.url}/v1/videos/{big['id']}", "DELETE", None, {}), 30)
    assert status == 200 and doc["cancel_requested"] is True, doc
    wait_job(router, big["id"], "cancelled")
    poll(lambda: running(workers[0]) == 0, 30, "the cancelled job's memory freed")


def test_bad_requests_get_the_workers_4xx_and_unknown_jobs_404(
    pair: tuple[Router, list[Proc]],
) -> None:
    router, _ = pair
    status, doc, _ = router.post("/v1/videos", {"prompt": "x", "size": "33x32"})
    assert status == 400 and "size" in json.dumps(doc), doc
    status, doc, _ = router.post("/v1/images/generations", {"prompt": "x", "seed": -4})
    assert status == 400 and doc["error"]["param"] == "seed", doc
    status, doc, _ = router.get("/v1/videos/video_nope")
    assert status == 404 and doc["error"]["code"] == "job_not_found", doc
    status, doc, _ = router.post("/v1/completions", {"prompt": "x"})
    assert status == 404, doc  # a diffusion fleet's router serves no text routes


def test_a_job_whose_worker_dies_restarts_from_its_seed_with_the_same_frames(
    launch: Launch,
) -> None:
    body = {"num_frames": 5, "num_inference_steps": 300, "seed": 21}
    with launch(2) as (router, workers):
        job = video(router, **body)
        poll(lambda: status_of(router, job["id"])["steps_done"] >= 1, 60, "the job under way")
        [victim] = [w for w in workers if running(w) == 1]
        [survivor] = [w for w in workers if w is not victim]
        victim.proc.kill()
        victim.proc.wait(10)
        done = wait_job(router, job["id"], "completed", timeout=300)
        assert done["restarts"] == 1 and done["seed"] == 21
        assert router.metric("loom_router:migrations_total", outcome="restarted") >= 1
        restarted = content(router.url, job["id"])
        # the same request, never interrupted, straight on the surviving worker
        status, direct, _ = post(f"{survivor.base_url}/v1/videos",
                              {"prompt": "a fox", "size": "32x32", **body})  # fmt: skip
        assert status == 202, direct
        poll(lambda: get_json(f"{survivor.base_url}/v1/videos/{direct['id']}")[1]["status"]
             == "completed", 300, "the uninterrupted job")  # fmt: skip
        assert np.array_equal(restarted, content(survivor.base_url, direct["id"]))
