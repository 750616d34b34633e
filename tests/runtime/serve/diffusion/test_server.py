"""A live `loom runtime` worker serving the tiny Wan checkpoint over real HTTP on 127.0.0.1: the
official openai client's images.generate returns decodable PNGs of the asked size; a video job is
created (202), polled, downloaded and opened again with PyAV as an MP4 of the asked frames and
size; cancelling a running job frees its memory; bad input is a 4xx with a message, holding
nothing; /metrics exports the diffusion gauges."""

from __future__ import annotations

import base64
import io
import json
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import av
import openai
import pytest
from PIL import Image

from loom_runtime.models.wan.tiny import init_tiny_wan
from loom_runtime.testing.processes import Proc, free_ports, get_json, poll, post, scrape, spawn

MODEL = "tiny-wan"
MEMORY_MIB = 512
CARD = """\
apiVersion: loom.dev/v1alpha1
kind: ModelCard
metadata:
  name: {name}
spec:
  family: dit
  components:
    - name: transformer
      kind: transformer
      source: {{uri: "file://{path}"}}
      weightsVersion: dit-v1
      precision: {{weights: fp32, kv: fp32}}
      requiredFor: [generate]
    - name: text-encoder
      kind: encoder
      source: {{uri: "file://{path}/text_encoder"}}
      weightsVersion: enc-v1
      precision: {{weights: fp32, kv: fp32}}
      requiredFor: [generate]
    - name: vae
      kind: vae
      source: {{uri: "file://{path}/vae"}}
      weightsVersion: vae-v1
      precision: {{weights: fp32, kv: fp32}}
      requiredFor: [generate]
  loops:
    - name: generate
      kind: diffusion
      components: [transformer, text-encoder, vae]
      steps: 3
  recipe: {{method: base, assumesLoop: generate, assumesPrecision: fp32}}
"""


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    tmp = tmp_path_factory.mktemp("diffusion-worker")
    ckpt = init_tiny_wan(tmp / "tiny-wan")
    card = tmp / "card.yaml"
    card.write_text(CARD.format(name=MODEL, path=ckpt))
    [port] = free_ports(1)
    cmd = [
        sys.executable, "-m", "loom_runtime", "runtime", "--card", str(card), "--port", str(port),
        "--text-len", "32", "--diffusion-memory-mib", str(MEMORY_MIB), "--max-video-jobs", "8",
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with spawn("diffusion-worker", cmd, tmp / "worker.log", url, "/ready") as proc:
        proc.model = MODEL
        yield proc


def job(worker: Proc, job_id: str) -> dict[str, Any]:
    status, body = get_json(f"{worker.base_url}/v1/videos/{job_id}")
    assert status == 200, body
    return body


def wait_status(worker: Proc, job_id: str, want: set[str], timeout: float = 120) -> dict[str, Any]:
    poll(lambda: job(worker, job_id)["status"] in want, timeout, f"job {job_id} in {want}")
    return job(worker, job_id)


def test_openai_client_images_generate_returns_pngs_of_the_asked_size(worker: Proc) -> None:
    client = openai.OpenAI(base_url=f"{worker.base_url}/v1", api_key="unused", max_retries=0)
    try:
        result = client.images.generate(
            model=MODEL, prompt="a red fox in the snow", n=2, size="48x32",  # type: ignore[arg-type]
            response_format="b64_json", extra_body={"seed": 7, "num_inference_steps": 2},
        )  # fmt: skip
        again = client.images.generate(
            model=MODEL, prompt="a red fox in the snow", n=1, size="48x32",  # type: ignore[arg-type]
            response_format="b64_json", extra_body={"seed": 7, "num_inference_steps": 2},
        )  # fmt: skip
    finally:
        client.close()
    assert result.data is not None and len(result.data) == 2 and again.data is not None
    pngs = [base64.b64decode(d.b64_json or "") for d in result.data]
    images = [Image.open(io.BytesIO(p)) for p in pngs]
    assert [(i.format, i.size, i.mode) for i in images] == [("PNG", (48, 32), "RGB")] * 2
    assert pngs[0] != pngs[1]  # seeds 7 and 8
    assert base64.b64decode(again.data[0].b64_json or "") == pngs[0]  # seeded: reproducible


def test_a_video_job_is_created_polled_downloaded_and_decodes_as_mp4(worker: Proc) -> None:
    status, body, _ = post(
        f"{worker.base_url}/v1/videos",
        {"model": MODEL, "prompt": "waves", "size": "32x32", "num_frames": 5, "fps": 8, "seed": 1},
    )
    assert status == 202, body
    assert body["object"] == "video" and body["status"] in ("queued", "in_progress", "completed")
    done = wait_status(worker, body["id"], {"completed", "failed"})
    assert done["status"] == "completed", done
    assert (done["progress"], done["steps_done"], done["steps_total"]) == (100, 3, 3)
    url = f"{worker.base_url}/v1/videos/{body['id']}/content"
    with urllib.request.urlopen(url, timeout=60) as resp:
        assert resp.headers["Content-Type"] == "video/mp4"
        mp4 = resp.read()
    with av.open(io.BytesIO(mp4)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        assert container.format.name.startswith("mov,mp4")
    assert len(frames) == 5 and frames[0].shape == (32, 32, 3)
    status, deleted, _ = _request(worker, "DELETE", f"/v1/videos/{body['id']}")
    assert status == 200 and deleted["deleted"] is True
    assert get_json(f"{worker.base_url}/v1/videos/{body['id']}")[0] == 404


def test_cancelling_a_running_video_job_frees_its_memory(worker: Proc) -> None:
    status, body, _ = post(
        f"{worker.base_url}/v1/videos",
        {"prompt": "a long one", "size": "128x128", "num_frames": 41,
         "num_inference_steps": 1000, "seed": 2},
    )  # fmt: skip
    assert status == 202, body
    poll(lambda: job(worker, body["id"])["steps_done"] >= 1, 120, "the job's first step")
    reserved = f'loom:diffusion_memory_reserved_bytes{{model_name="{MODEL}"}}'
    assert scrape(worker.base_url)[reserved] > 0
    status, cancelling, _ = _request(worker, "DELETE", f"/v1/videos/{body['id']}")
    assert status == 200 and cancelling["cancel_requested"] is True
    done = wait_status(worker, body["id"], {"cancelled", "completed", "failed"})
    assert done["status"] == "cancelled" and done["steps_done"] < 1000
    metrics = scrape(worker.base_url)
    assert metrics[reserved] == 0
    assert metrics[f'vllm:num_requests_running{{model_name="{MODEL}"}}'] == 0
    assert _request(worker, "GET", f"/v1/videos/{body['id']}/content")[0] == 409


def test_an_image_client_that_leaves_has_its_requests_aborted_and_freed(worker: Proc) -> None:
    label = f'{{model_name="{MODEL}"}}'
    aborted = scrape(worker.base_url).get(f"loom:diffusion_requests_aborted_total{label}", 0)
    body = json.dumps({"prompt": "slow", "size": "128x128", "num_inference_steps": 1000, "n": 2})
    port = int(worker.base_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(
            f"POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nContent-Type: "
            f"application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode()
        )
        running = f"vllm:num_requests_running{label}"
        poll(lambda: scrape(worker.base_url)[running] == 2, 60, "both images running")
    # The client is gone mid-generation.

    def freed() -> bool:
        m = scrape(worker.base_url)
        return (
            m[f"loom:diffusion_requests_aborted_total{label}"] == aborted + 2
            and m[f"loom:diffusion_memory_reserved_bytes{label}"] == 0
            and m[running] == 0
        )

    poll(freed, 60, "both images aborted and their memory freed")


@pytest.mark.parametrize(
    ("path", "body", "status", "says"),
    [
        ("/v1/videos", {"prompt": "p", "size": "30x32"}, 400, "multiples of 16"),
        ("/v1/videos", {"prompt": "p", "size": "32x32", "num_frames": 4}, 400, "num_frames"),
        ("/v1/videos", {"prompt": "p", "size": "512x512", "num_frames": 1025}, 400, "budget"),
        ("/v1/videos", {"prompt": "p", "num_inference_steps": -2}, 400, "num_inference_steps"),
        ("/v1/videos", {"prompt": "p", "model": "nope"}, 404, "not served"),
        ("/v1/videos", b"{not json", 400, "not valid JSON"),
        ("/v1/images/generations", {"prompt": "p", "size": "32"}, 400, "WIDTHxHEIGHT"),
        ("/v1/images/generations", {"prompt": "p", "size": "32x32", "n": 0}, 400, "n"),
        ("/v1/images/generations", {"prompt": "p", "response_format": "url"}, 400, "b64_json"),
        ("/v1/images/generations", {"prompt": "p", "model": "other"}, 404, "not served"),
    ],
)
def test_bad_input_is_a_4xx_with_a_message_and_holds_nothing(
    worker: Proc, path: str, body: Any, status: int, says: str
) -> None:
    got, reply, _ = post(worker.base_url + path, body)
    assert got == status, reply
    assert says in reply["error"]["message"] or says == reply["error"]["param"]
    metrics = scrape(worker.base_url)
    for name in ("loom:diffusion_memory_reserved_bytes", "vllm:num_requests_waiting",
                 "vllm:num_requests_running"):  # fmt: skip
        assert metrics[f'{name}{{model_name="{MODEL}"}}'] == 0


def test_unknown_video_and_content_before_completion(worker: Proc) -> None:
    assert get_json(f"{worker.base_url}/v1/videos/video_nope")[0] == 404
    assert _request(worker, "DELETE", "/v1/videos/video_nope")[0] == 404


def test_metrics_export_diffusion_gauges_and_component_versions(worker: Proc) -> None:
    m = scrape(worker.base_url)
    label = f'{{model_name="{MODEL}"}}'
    assert m[f"loom:diffusion_memory_budget_bytes{label}"] == MEMORY_MIB * 2**20
    assert m[f"loom:diffusion_denoise_steps_total{label}"] >= 0
    versions = {k for k in m if k.startswith("loom:component_weights_version_info")}
    assert any('version="enc-v1"' in k and 'component="text_encoder"' in k for k in versions)
    assert any('version="dit-v1"' in k and 'component="transformer"' in k for k in versions)
    status, models = get_json(f"{worker.base_url}/v1/models")
    assert status == 200 and [d["id"] for d in models["data"]] == [MODEL]


def _request(worker: Proc, method: str, path: str) -> tuple[int, Any, dict[str, str]]:
    req = urllib.request.Request(worker.base_url + path, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"null"), dict(resp.headers)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), dict(err.headers)


def test_metrics_export_the_step_cost_of_each_kind_after_a_request(worker: Proc) -> None:
    body = {"model": MODEL, "prompt": "a fitted step cost", "size": "32x32", "seed": 11,
            "num_inference_steps": 2}  # fmt: skip
    status, reply, _ = post(f"{worker.base_url}/v1/images/generations", body)
    assert status == 200, reply
    m = scrape(worker.base_url)
    for kind in ("text_encode", "denoise", "vae_decode"):
        labels = f'{{kind="{kind}",model_name="{MODEL}"}}'
        assert m[f"loom:step_cost_samples_total{labels}"] >= 1, kind
        per_row, fixed = (
            m[f"loom:step_cost{part}{labels}"] for part in ("_seconds", "_fixed_seconds")
        )
        assert per_row >= 0 and fixed >= 0 and 0 < per_row + fixed < 5, kind  # one row's cost
    assert m[f'loom:step_predicted_seconds{{model_name="{MODEL}"}}'] >= 0
