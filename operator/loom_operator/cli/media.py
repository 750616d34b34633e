"""`loom image PROMPT` and `loom video PROMPT`: generate through a running fleet's endpoint, with a
progress bar over a video job's denoise steps, and save the PNGs or the MP4.

Owns the two client commands (HTTP to the router, the progress display, Ctrl-C cancels the job);
never talks to workers directly (the router picks one and restarts the job if it is lost).
"""

from __future__ import annotations

import argparse
import base64
import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

DEFAULT_URL = "http://127.0.0.1:8000/v1"
POLL_S = 0.5
CALL_TIMEOUT_S = 60.0


class MediaError(RuntimeError):
    """The endpoint refused or failed the request; the message is the server's."""


def add_parser(sub: Any) -> None:
    for kind in ("image", "video"):
        what = "images" if kind == "image" else "a video (a job, with progress)"
        p = sub.add_parser(kind, help=f"generate {what} through a fleet's endpoint")
        p.add_argument("prompt")
        p.add_argument("--url", default=DEFAULT_URL, help=f"the endpoint (default {DEFAULT_URL})")
        p.add_argument("--model", help="the model name (default: the endpoint's)")
        p.add_argument("--size", default="64x64", help="WIDTHxHEIGHT (default 64x64)")
        p.add_argument("--steps", type=int, help="denoise steps (default: the model card's)")
        p.add_argument("--seed", type=int, help="same seed, same pixels (default: random)")
        p.add_argument("--api-key", help="the router's API key, if it asks for one")
        p.add_argument(
            "--stage", type=stage_option, action="append", default=[],
            metavar="STAGE.FIELD=VALUE",
            help="a field of an earlier stage of a workflow --model, e.g. think.size=32x32 "
            "(VALUE is read as JSON, else as a string); the other flags shape the last stage",
        )  # fmt: skip
        if kind == "image":
            p.add_argument("-n", type=int, default=1, help="images (default 1)")
            p.add_argument(
                "--out", type=Path, default=Path("image.png"),
                help="file to write (with n > 1: out-1.png, out-2.png, ...)",
            )  # fmt: skip
        else:
            p.add_argument("--frames", type=int, default=17, help="frames (default 17)")
            p.add_argument("--fps", type=int, default=16, help="default 16")
            p.add_argument("--out", type=Path, default=Path("video.mp4"), help="default video.mp4")
            p.add_argument("--timeout", type=float, default=3600.0, help="seconds (default 3600)")
        p.set_defaults(run=run_image if kind == "image" else run_video)


def stage_option(text: str) -> tuple[str, str, Any]:
    """`STAGE.FIELD=VALUE` -> (stage, field, value): VALUE as JSON when it parses, else as text."""
    key, eq, raw = text.partition("=")
    stage, dot, name = key.partition(".")
    if not (eq and dot and stage and name):
        raise argparse.ArgumentTypeError(f"{text!r}: STAGE.FIELD=VALUE, e.g. think.size=32x32")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return stage, name, value


def request_body(args: argparse.Namespace, video: bool) -> dict[str, Any]:
    """The API body for the parsed flags (pure)."""
    body: dict[str, Any] = {"prompt": args.prompt, "size": args.size}
    for key, value in (("model", args.model), ("num_inference_steps", args.steps),
                       ("seed", args.seed)):  # fmt: skip
        if value is not None:
            body[key] = value
    if video:
        body.update(num_frames=args.frames, fps=args.fps)
    else:
        body["n"] = args.n
    stages: dict[str, dict[str, Any]] = {}
    for stage, name, value in args.stage:
        stages.setdefault(stage, {})[name] = value
    if stages:
        body["stage_options"] = stages
    return body


def image_paths(out: Path, n: int) -> list[Path]:
    """Where each of n images goes: `out` itself for one, out-1.png, out-2.png... for more."""
    if n == 1:
        return [out]
    return [out.with_name(f"{out.stem}-{i + 1}{out.suffix}") for i in range(n)]


def _call(args: argparse.Namespace, method: str, path: str, body: Any = None) -> bytes:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(args.url.rstrip("/") + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if args.api_key:
        req.add_header("Authorization", f"Bearer {args.api_key}")
    try:
        with urllib.request.urlopen(req, timeout=CALL_TIMEOUT_S) as resp:
            return bytes(resp.read())
    except urllib.error.HTTPError as exc:
        raise MediaError(f"{method} {path}: {exc.code} {_message(exc.read())}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise MediaError(f"{args.url} does not answer ({exc}); is `loom up` running?") from None


def _message(raw: bytes) -> str:
    try:
        return str(json.loads(raw)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return raw[:300].decode(errors="replace")


def run_image(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    try:
        with console.status(f"generating {args.n} image(s)…"):
            doc = json.loads(_call(args, "POST", "/images/generations", request_body(args, False)))
    except MediaError as exc:
        console.print(f"[red]loom image: {exc}[/]")
        return 1
    for path, item in zip(image_paths(args.out, len(doc["data"])), doc["data"], strict=True):
        path.write_bytes(base64.b64decode(item["b64_json"]))
        console.print(f"wrote {path}")
    return 0


def run_video(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    job_id = None
    try:
        job = json.loads(_call(args, "POST", "/videos", request_body(args, True)))
        job_id = job["id"]
        job = _follow(args, job, console)
        if job["status"] != "completed":
            error = (job.get("error") or {}).get("message", "")
            console.print(f"[red]loom video: job {job_id} {job['status']}[/] {error}")
            return 1
        args.out.write_bytes(_call(args, "GET", f"/videos/{job_id}/content"))
    except KeyboardInterrupt:
        if job_id is not None:
            _call(args, "DELETE", f"/videos/{job_id}")
            console.print(f"cancelled {job_id}")
        return 130
    except MediaError as exc:
        console.print(f"[red]loom video: {exc}[/]")
        return 1
    console.print(f"wrote {args.out} (seed {job.get('seed')})")
    return 0


def _follow(args: argparse.Namespace, job: dict[str, Any], console: Console) -> dict[str, Any]:
    """Poll the job until it is finished (or `--timeout`), drawing its denoise steps."""
    deadline = time.monotonic() + args.timeout
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("steps"), TimeElapsedColumn())  # fmt: skip
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(job["id"], total=job.get("steps_total") or None)
        while job["status"] not in ("completed", "failed", "cancelled"):
            if time.monotonic() > deadline:
                _call(args, "DELETE", f"/videos/{job['id']}")
                raise MediaError(f"job {job['id']} not done within {args.timeout:g}s; cancelled")
            time.sleep(POLL_S)
            job = json.loads(_call(args, "GET", f"/videos/{job['id']}"))
            note = f" (restarted ×{job['restarts']})" if job.get("restarts") else ""
            progress.update(task, description=f"{job['id'][:14]}… {job['status']}{note}",
                            total=job.get("steps_total") or None,
                            completed=job.get("steps_done", 0))  # fmt: skip
    return job
