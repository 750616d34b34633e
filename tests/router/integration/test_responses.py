"""/v1/responses through the router, with the official openai client: a response is a worker's
answer relayed byte for byte (its named events too); a continued response goes to the worker
that stores it even when the policy would go round the fleet; a response the router does not
know, or whose worker left, is a 404 that says so."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any
from urllib.parse import urlparse

import openai
import pytest

MODEL = "tiny-router"


@pytest.fixture(scope="module")
def two(launch_worker: Any) -> Iterator[list[Any]]:
    with ExitStack() as stack:
        yield [stack.enter_context(launch_worker(f"r{i}")) for i in range(2)]


def client_of(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def test_continued_responses_go_to_the_worker_that_stores_them(
    two: list[Any], launch_router: Any
) -> None:
    with launch_router(two, flags=("--policy", "round-robin")) as router:
        client = client_of(router.url)
        first = client.responses.with_raw_response.create(
            model=MODEL, input="Hello.", max_output_tokens=4, temperature=0.0
        )
        owner = first.headers["x-loom-endpoint"]
        previous = first.parse()
        for turn in range(4):  # round-robin alone would alternate the workers
            raw = client.responses.with_raw_response.create(
                model=MODEL, input=f"Turn {turn}.", previous_response_id=previous.id,
                max_output_tokens=4, temperature=0.0,
            )  # fmt: skip
            assert raw.headers["x-loom-endpoint"] == owner
            previous = raw.parse()
        assert client.responses.retrieve(previous.id).id == previous.id
        with pytest.raises(openai.NotFoundError) as err:
            client.responses.create(model=MODEL, input="x", previous_response_id="resp-unknown")
        assert "not known to this router" in str(err.value)
        client.close()


def test_a_streamed_response_is_relayed_with_its_event_names(worker: Any, router: Any) -> None:
    body = {"model": MODEL, "input": "Count.", "max_output_tokens": 5, "temperature": 0,
            "stream": True}  # fmt: skip
    url = urlparse(router.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    conn.request("POST", "/v1/responses", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    raw = resp.read().decode()
    conn.close()
    assert resp.status == 200 and resp.getheader("x-loom-endpoint") == "w0"
    events = [e for e in raw.split("\n\n") if e.strip()]
    names = [e.split("\n")[0].removeprefix("event: ") for e in events]
    datas = [json.loads(e.split("\n")[1].removeprefix("data: ")) for e in events]
    assert names == [d["type"] for d in datas]
    assert names[0] == "response.created" and names[-1] == "response.incomplete"
    text = "".join(d["delta"] for d in datas if d["type"] == "response.output_text.delta")
    whole = client_of(worker.url).responses.create(
        model=MODEL, input="Count.", max_output_tokens=5, temperature=0.0
    )
    assert text == whole.output_text


def test_a_continued_response_whose_worker_left_is_a_404_that_says_so(
    launch_worker: Any, launch_router: Any
) -> None:
    with launch_worker("gone") as w, launch_router([w]) as router:
        client = client_of(router.url)
        first = client.responses.create(model=MODEL, input="Hi.", max_output_tokens=2)
        router.admin("DELETE", "/admin/endpoints/gone")
        with pytest.raises(openai.NotFoundError) as err:
            client.responses.create(model=MODEL, input="x", previous_response_id=first.id)
        assert "no longer serves" in str(err.value)
        client.close()
