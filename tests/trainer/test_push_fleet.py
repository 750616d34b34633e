"""A trainer pushes weights into a real `loom up` P/D fleet of the tiny model (a prefill and a
decode worker, fp64): the fleet then answers exactly like a fresh fleet started from a
checkpoint of the pushed weights, and alike whether the bytes moved over the group or NIXL; a
push that does not fit, a trainer or a worker killed mid-push, a second trainer and a worker
that is not ready change nothing; a Barrier push under streaming load fails no request and no
response mixes versions; a restarted controller keeps the pushed version, and a worker killed
after a push rebuilds it from its peer; after a push the behaviour records the fleet returns
(through its router, P/D) equal transformers' training forward of the pushed weights within 1e-9
(the C2 gate)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tests.runtime.training_forward import llama_logits, sampled_logprobs

from loom_operator.local.snapshot import FleetStatus
from loom_operator.local.state import load_controller, load_or_create_secrets
from loom_operator.testing.cards import card_text
from loom_operator.testing.fleet import FleetProcess, run_fleet, wait_for
from loom_operator.testing.load import StreamingLoad, check_streams, reference_streams
from loom_runtime.testing.processes import post, sse_events
from loom_trainer import PushFailed, PushRefused, WeightSync

MODEL = "tiny"
PROMPTS = ["Once upon a time", "The weights of a model", "A fleet of workers", "Hello"]
MAX_TOKENS = 8
BUCKET = 16 << 20  # the tiny model in fp64 is ~101 MB: seven buckets
ROLES = {"prefill": 1, "decode": 1}


def weights_of(checkpoint: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors as the fp64 fleet holds them (what a trainer would push)."""
    return {
        n: t.to(torch.float64) for n, t in load_file(str(checkpoint / "model.safetensors")).items()
    }


def save_checkpoint(tensors: dict[str, torch.Tensor], like: Path, out: Path) -> Path:
    """`tensors` as a checkpoint directory (config and tokenizer copied from `like`)."""
    shutil.copytree(like, out)
    save_file({n: t.contiguous() for n, t in tensors.items()}, str(out / "model.safetensors"))
    return out


def connect(fleet: FleetProcess) -> WeightSync:
    info = load_controller(fleet.state)
    assert info is not None and info.weights_url
    return WeightSync.connect(info.weights_url, load_or_create_secrets(fleet.state).admin_token)


def current_version(fleet: FleetProcess) -> str:
    (version,) = {w.version for w in fleet.wait_settled(120).workers}
    assert version is not None
    return version


def next_version(fleet: FleetProcess) -> str:
    return f"v{int(current_version(fleet).removeprefix('v')) + 1}"


def served_version(fleet: FleetProcess) -> str:
    """The x-loom-weights-version header of one completion through the router."""
    body = json.dumps({"model": MODEL, "prompt": "Hi", "max_tokens": 2, "temperature": 0})
    req = urllib.request.Request(
        fleet.endpoint + "/completions", data=body.encode(),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(req, timeout=60) as r:
        header = r.headers["x-loom-weights-version"]
        assert json.loads(r.read())["system_fingerprint"] == header
        return str(header)


def outputs(fleet: FleetProcess) -> list[tuple[str, ...]]:
    return reference_streams(fleet.endpoint, MODEL, PROMPTS, MAX_TOKENS)


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory,
    checkpoints: tuple[Path, Path],
    child_env: dict[str, str],
) -> Iterator[FleetProcess]:
    root = tmp_path_factory.mktemp("push")
    card = root / "card.yaml"
    card.write_text(card_text(f"file://{checkpoints[0]}", roles=ROLES, name="push", drain=10,
                              health_timeout=60.0))  # fmt: skip
    with run_fleet(card, root / "state", child_env) as f:
        yield f


def test_a_push_while_a_worker_is_not_ready_is_refused_naming_it(
    fleet: FleetProcess, checkpoints: tuple[Path, Path]
) -> None:
    version = current_version(fleet)
    decode = next(w for w in fleet.wait_settled(120).workers if w.role == "decode")
    os.kill(decode.pid, signal.SIGSTOP)
    try:
        fleet.wait(lambda s: any(w.name == decode.name and not w.ready for w in s.workers), 60,
                   "the stopped decode worker to show as not ready")  # fmt: skip
        with pytest.raises(PushRefused, match=f"not ready: {decode.name}"):
            connect(fleet).push(weights_of(checkpoints[0]), "v-unready", bucket_bytes=BUCKET)
    finally:
        os.kill(decode.pid, signal.SIGCONT)
    fleet.wait_settled(180)
    assert current_version(fleet) == version


def test_a_pushed_version_answers_like_a_fleet_started_from_its_checkpoint(
    fleet: FleetProcess,
    checkpoints: tuple[Path, Path],
    child_env: dict[str, str],
    tmp_path: Path,
) -> None:
    pushed = weights_of(checkpoints[1])
    before = outputs(fleet)
    version = next_version(fleet)
    result = connect(fleet).push(pushed, version, mode="barrier", bucket_bytes=BUCKET)
    assert result.version == version and result.buckets == 7
    assert result.largest_bucket <= BUCKET
    fleet.wait_settled(120, version)
    assert served_version(fleet) == version
    got = outputs(fleet)
    assert got != before  # the push changed the weights
    ckpt = save_checkpoint(pushed, checkpoints[0], tmp_path / "pushed")
    card = tmp_path / "fresh.yaml"
    card.write_text(card_text(f"file://{ckpt}", version=version, roles=ROLES, name="fresh"))
    with run_fleet(card, tmp_path / "fresh-state", child_env) as fresh:
        assert outputs(fresh) == got


def test_a_push_over_nixl_lands_as_the_same_push_over_the_group(
    fleet: FleetProcess, checkpoints: tuple[Path, Path]
) -> None:
    """transport nixl: both workers READ every bucket from the trainer's registered buffer; the
    fleet then answers exactly as after the same weights pushed over the group's broadcasts."""
    sync = connect(fleet)
    pushed, other = weights_of(checkpoints[1]), weights_of(checkpoints[0])
    over_nixl = sync.push(pushed, next_version(fleet), bucket_bytes=BUCKET, transport="nixl")
    assert over_nixl.transport == "nixl" and over_nixl.buckets == 7
    fleet.wait_settled(120, over_nixl.version)
    assert served_version(fleet) == over_nixl.version
    got = outputs(fleet)
    away = sync.push(other, next_version(fleet), bucket_bytes=BUCKET, transport="nixl")
    fleet.wait_settled(120, away.version)
    assert outputs(fleet) != got
    over_gloo = sync.push(pushed, next_version(fleet), bucket_bytes=BUCKET)
    assert over_gloo.transport == "gloo"
    fleet.wait_settled(120, over_gloo.version)
    assert outputs(fleet) == got


def test_a_push_that_does_not_fit_is_refused_whole_and_nothing_changes(
    fleet: FleetProcess, checkpoints: tuple[Path, Path]
) -> None:
    version, before = current_version(fleet), outputs(fleet)
    bad = weights_of(checkpoints[0])
    bad["model.layers.1.mlp.up_proj.weight"] = bad["model.layers.1.mlp.up_proj.weight"][:, :-1]
    with pytest.raises(PushRefused) as refused:
        connect(fleet).push(bad, next_version(fleet), bucket_bytes=BUCKET)
    name = "model.layers.1.mlp.up_proj.weight"
    wrong, right = tuple(bad[name].shape), (bad[name].shape[0], bad[name].shape[1] + 1)
    assert refused.value.problems == {
        "push-prefill-0": [f"shape: {name} {wrong} != {right}"],
        "push-decode-0": [f"shape: {name} {wrong} != {right}"],
    }
    assert current_version(fleet) == version and served_version(fleet) == version
    assert outputs(fleet) == before


TRAINER = """
import sys, time, torch
from safetensors.torch import load_file
from loom_trainer import WeightSync
url, token, ckpt, version = sys.argv[1:5]
tensors = {n: t.to(torch.float64) for n, t in load_file(ckpt).items()}
def stall(index, count):
    print(f"sent bucket {index} of {count}", flush=True)
    time.sleep(3600)
WeightSync.connect(url, token).push(tensors, version, bucket_bytes=8 << 20, timeout_s=15,
                                    on_bucket=stall)
"""


def kill_a_trainer_after_its_first_bucket(
    fleet: FleetProcess,
    checkpoint: Path,
    child_env: dict[str, str],
    tmp_path: Path,
    mode: str | None = None,
) -> None:
    """Start a trainer process pushing `checkpoint` (in `mode`, else the default) and kill -9 it
    once it has sent its first bucket."""
    script = tmp_path / "trainer.py"
    text = (
        TRAINER
        if mode is None
        else TRAINER.replace("on_bucket=stall)", f'on_bucket=stall, mode="{mode}")')
    )
    script.write_text(text)
    info = load_controller(fleet.state)
    assert info is not None
    argv = [sys.executable, str(script), info.weights_url,
            load_or_create_secrets(fleet.state).admin_token,
            str(checkpoint / "model.safetensors"), next_version(fleet)]  # fmt: skip
    trainer = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=child_env)
    try:
        assert trainer.stdout is not None
        line = trainer.stdout.readline()
        assert line.startswith("sent bucket 0 of "), line
        os.kill(trainer.pid, signal.SIGKILL)
    finally:
        trainer.kill()
        trainer.wait(timeout=30)


def test_a_trainer_killed_mid_push_leaves_the_last_version_and_the_next_push_lands(
    fleet: FleetProcess, checkpoints: tuple[Path, Path], child_env: dict[str, str], tmp_path: Path
) -> None:
    version, before = current_version(fleet), outputs(fleet)
    sync = connect(fleet)
    kill_a_trainer_after_its_first_bucket(fleet, checkpoints[1], child_env, tmp_path)

    def failed() -> bool:
        doc = sync.latest()
        return doc is not None and doc["state"] == "failed"

    wait_for(failed, 120, "the killed trainer's push to fail")
    assert current_version(fleet) == version and served_version(fleet) == version
    assert outputs(fleet) == before
    after = next_version(fleet)
    sync.push(weights_of(checkpoints[0]), after, mode="rolling", bucket_bytes=BUCKET)
    fleet.wait_settled(120, after)
    assert served_version(fleet) == after


def test_a_second_trainer_is_refused_while_a_push_is_open(
    fleet: FleetProcess, checkpoints: tuple[Path, Path]
) -> None:
    version = current_version(fleet)
    sync = connect(fleet)
    first = sync._request(  # a trainer that opened a push and has not connected yet
        "POST", "/v1/weights/updates",
        {"version": next_version(fleet), "mode": "barrier", "timeout_seconds": 5},
    )  # fmt: skip
    with pytest.raises(PushRefused, match=f"push {first['update_id']} .* one trainer pushes"):
        connect(fleet).push(weights_of(checkpoints[0]), "v-second", bucket_bytes=BUCKET)
    wait_for(lambda: sync.update(str(first["update_id"]))["state"] == "failed", 120,
             "the unattended push to time out")  # fmt: skip
    assert current_version(fleet) == version and served_version(fleet) == version


def test_a_barrier_push_under_streaming_load_fails_nothing_and_mixes_no_versions(
    fleet: FleetProcess, checkpoints: tuple[Path, Path]
) -> None:
    version, before = current_version(fleet), outputs(fleet)
    after = next_version(fleet)
    pushed = weights_of(checkpoints[1])
    with StreamingLoad(fleet.endpoint, MODEL, PROMPTS, MAX_TOKENS, clients=3) as load:
        load.wait_completed(3, 120)
        connect(fleet).push(pushed, after, mode="barrier", bucket_bytes=BUCKET)
        load.wait_completed(6, 120)
        streams = load.stop()
    fleet.wait_settled(120, after)
    expected = {version: before, after: outputs(fleet)}
    assert check_streams(streams, expected) == []
    assert {v for s in streams for v in s.versions} == {version, after}


def test_a_restarted_controller_keeps_serving_the_pushed_version(fleet: FleetProcess) -> None:
    version, before = current_version(fleet), outputs(fleet)
    assert version != "v1"  # a pushed version (the card says v1)
    fleet.kill_controller()
    fleet.start()
    fleet.wait_settled(120, version)
    assert served_version(fleet) == version and outputs(fleet) == before


def test_a_worker_killed_after_a_push_rebuilds_the_pushed_version_from_its_peer(
    fleet: FleetProcess,
) -> None:
    version, before = current_version(fleet), outputs(fleet)
    assert version != "v1"  # a pushed version (the card says v1): no checkpoint holds it
    workers = fleet.wait_settled(120).workers
    decode = next(w for w in workers if w.role == "decode")
    prefill = next(w for w in workers if w.role == "prefill")
    os.kill(decode.pid, signal.SIGKILL)

    def restarted(s: FleetStatus) -> bool:
        return any(w.name == decode.name and w.pid != decode.pid and w.ready for w in s.workers)

    fleet.wait(restarted, 180, "the decode worker's restart")
    fleet.wait_settled(120, version)
    assert served_version(fleet) == version and outputs(fleet) == before
    rebuilt = fleet.state.log(decode.name).read_text()
    assert "rebuilt a pushed version from a peer" in rebuilt
    assert "weights sent to a peer" in fleet.state.log(prefill.name).read_text()


def test_a_worker_killed_mid_push_fails_the_push_and_the_fleet_keeps_its_version(
    checkpoints: tuple[Path, Path], child_env: dict[str, str], tmp_path: Path
) -> None:
    card = tmp_path / "card.yaml"
    card.write_text(card_text(f"file://{checkpoints[0]}", roles=ROLES, name="killed"))
    with run_fleet(card, tmp_path / "state", child_env) as fleet:
        before = outputs(fleet)
        decode = next(w for w in fleet.wait_settled(120).workers if w.role == "decode")

        def kill_decode(index: int, count: int) -> None:
            if index == 0:
                os.kill(decode.pid, signal.SIGKILL)

        sync = connect(fleet)
        with pytest.raises(PushFailed):
            sync.push(weights_of(checkpoints[1]), "v2", bucket_bytes=BUCKET, timeout_s=15,
                      on_bucket=kill_decode)  # fmt: skip
        wait_for(lambda: (sync.latest() or {}).get("state") == "failed", 120,
                 "the push to fail")  # fmt: skip

        def restarted(s: FleetStatus) -> bool:
            return any(w.name == decode.name and w.pid != decode.pid and w.ready for w in s.workers)

        fleet.wait(restarted, 120, "the decode worker's restart")
        fleet.wait_settled(120, "v1")
        assert served_version(fleet) == "v1" and outputs(fleet) == before
        sync.push(weights_of(checkpoints[1]), "v2", bucket_bytes=BUCKET)
        fleet.wait_settled(120, "v2")
        assert served_version(fleet) == "v2" and outputs(fleet) != before


def test_behaviour_records_after_a_push_equal_a_training_forward_of_the_pushed_weights(
    fleet: FleetProcess, checkpoints: tuple[Path, Path]
) -> None:
    gen = torch.Generator().manual_seed(3)
    pushed = {
        n: t + 0.01 * torch.randn(t.shape, generator=gen, dtype=t.dtype)
        for n, t in weights_of(checkpoints[0]).items()
    }
    version = next_version(fleet)
    connect(fleet).push(pushed, version, mode="barrier", bucket_bytes=BUCKET)
    fleet.wait_settled(120, version)
    ask = {"model": MODEL, "max_tokens": MAX_TOKENS, "ignore_eos": True, "seed": 21,
           "return_behaviour": True}  # fmt: skip

    def paired() -> bool:
        """The router pairs the decode with a prefill on the pushed version (its view of the
        workers' versions can trail the controller's settled status by a moment; until then a
        decode prefills locally)."""
        probe = {**ask, "prompt": PROMPTS[2], "max_tokens": 1, "temperature": 0.0}
        status, _, headers = post(fleet.endpoint + "/completions", probe)
        return status == 200 and headers.get("x-loom-pd") == "remote-prefill"

    wait_for(paired, 30, "the router to pair a prefill on the pushed version")
    for temperature in (1.0, 0.7):
        status, answer, headers = post(
            fleet.endpoint + "/completions",
            {**ask, "prompt": PROMPTS[0], "temperature": temperature},
        )
        assert status == 200, answer
        assert (
            headers["x-loom-pd"] == "remote-prefill"
        )  # prefilled on one worker, decoded on another
        choice = answer["choices"][0]
        prompt, out = choice["prompt_token_ids"], choice["token_ids"]
        assert choice["weight_versions"] == [{"version": version, "start": 0, "end": MAX_TOKENS}]
        want = sampled_logprobs(
            llama_logits(checkpoints[0], prompt + out, pushed), len(prompt), out, temperature
        )
        got = choice["behaviour"]["logprobs"]
        assert len(got) == MAX_TOKENS
        assert max(abs(a - b) for a, b in zip(got, want, strict=True)) <= 1e-9
    chat = {**ask, "temperature": 0.7, "messages": [{"role": "user", "content": PROMPTS[1]}]}
    events = sse_events(fleet.endpoint + "/chat/completions", chat)
    prompt = next(e["prompt_token_ids"] for e in events if "prompt_token_ids" in e)
    choices = [c for e in events for c in e["choices"]]
    out = [t for c in choices for t in c.get("token_ids") or []]
    got = [lp for c in choices for lp in (c.get("behaviour") or {}).get("logprobs", [])]
    want = sampled_logprobs(
        llama_logits(checkpoints[0], prompt + out, pushed), len(prompt), out, 0.7
    )
    assert len(got) == MAX_TOKENS
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) <= 1e-9


def test_a_push_reaches_every_worker_the_planner_keeps_beyond_the_cards_replicas(
    checkpoints: tuple[Path, Path], child_env: dict[str, str], tmp_path: Path
) -> None:
    """The card asks 1 decode, its autoscaling section at least 2: the push goes to the 2 the
    fleet runs (not the card's 1), and is done once both serve it."""
    card = tmp_path / "card.yaml"
    card.write_text(card_text(
        f"file://{checkpoints[0]}", name="scaled", roles=ROLES, dtype="fp64",
        autoscaling="    decode: {min: 2, max: 2}\n",
    ))  # fmt: skip
    with run_fleet(card, tmp_path / "state", child_env) as fleet:
        fleet.wait(lambda s: sum(w.role == "decode" and w.ready and w.routed
                                 for w in s.workers) == 2, 180, "2 decode workers")  # fmt: skip
        result = connect(fleet).push(weights_of(checkpoints[1]), "v2", bucket_bytes=BUCKET)
        assert sorted(result.workers) == ["scaled-decode-0", "scaled-decode-1", "scaled-prefill-0"]
        settled = fleet.wait_settled(120, "v2")
        assert sorted(w.name for w in settled.workers if w.version == "v2") == sorted(
            result.workers
        )
