"""Steady streaming load from the `openai` client: N clients, each in its own thread, sending
greedy streamed completions in a loop and recording every chunk, its weights version and timing.

Owns generating load and recording what came back (client retries off: a failure is a failure);
never judges the results (`check_streams` compares them with references for the caller).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from openai import OpenAI

REQUEST_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Stream:
    """One streamed completion as the client saw it."""

    prompt: int
    """Index into the prompts."""
    chunks: tuple[str, ...]
    """Text of each streamed chunk with text (one token each), in order."""
    versions: frozenset[str]
    """Every system_fingerprint (weights version) its chunks carried."""
    started: float
    first_token: float | None
    finished: float
    error: str = ""
    token_times: tuple[float, ...] = ()
    """When each chunk arrived (time.monotonic)."""

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def latency(self) -> float:
        return self.finished - self.started


def stream_once(client: OpenAI, model: str, prompt: str, index: int, max_tokens: int) -> Stream:
    """One greedy streamed completion; errors are recorded, never raised."""
    started = time.monotonic()
    chunks: list[str] = []
    times: list[float] = []
    versions: set[str] = set()
    error = ""
    try:
        stream = client.completions.create(
            model=model, prompt=prompt, max_tokens=max_tokens, temperature=0.0, stream=True
        )
        for event in stream:
            if event.system_fingerprint:
                versions.add(event.system_fingerprint)
            for choice in event.choices:
                if choice.text:
                    times.append(time.monotonic())
                    chunks.append(choice.text)
    except Exception as exc:  # the point is to count failures, whatever they are
        error = f"{type(exc).__name__}: {exc}"
    first = times[0] if times else None
    return Stream(
        index, tuple(chunks), frozenset(versions), started, first, time.monotonic(), error,
        tuple(times),
    )  # fmt: skip


class StreamingLoad:
    """`clients` threads streaming completions of `prompts` (round robin) until `stop()`."""

    def __init__(
        self,
        base_url: str,
        model: str,
        prompts: Sequence[str],
        max_tokens: int,
        clients: int = 4,
    ) -> None:
        self._base_url = base_url
        self._model = model
        self._prompts = list(prompts)
        self._max_tokens = max_tokens
        self._clients = clients
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._next = 0
        self._threads: list[threading.Thread] = []
        self.streams: list[Stream] = []

    def __enter__(self) -> StreamingLoad:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        for i in range(self._clients):
            t = threading.Thread(target=self._client, name=f"load-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = REQUEST_TIMEOUT_S) -> list[Stream]:
        """Let each client finish its request in flight, then return every stream."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout)
        with self._lock:
            return list(self.streams)

    def completed(self) -> int:
        with self._lock:
            return len(self.streams)

    def wait_completed(self, n: int, timeout: float) -> None:
        """Block until `n` more streams than now have finished (bounded)."""
        target = self.completed() + n
        deadline = time.monotonic() + timeout
        while self.completed() < target:
            if time.monotonic() > deadline:
                raise TimeoutError(f"load: fewer than {n} streams finished in {timeout:g}s")
            time.sleep(0.05)

    def _take(self) -> int:
        with self._lock:
            i = self._next % len(self._prompts)
            self._next += 1
            return i

    def _client(self) -> None:
        client = OpenAI(
            base_url=self._base_url,
            api_key="unused",
            max_retries=0,
            timeout=REQUEST_TIMEOUT_S,
        )
        try:
            while not self._stop.is_set():
                i = self._take()
                s = stream_once(client, self._model, self._prompts[i], i, self._max_tokens)
                with self._lock:
                    self.streams.append(s)
        finally:
            client.close()


def reference_streams(
    base_url: str, model: str, prompts: Sequence[str], max_tokens: int
) -> list[tuple[str, ...]]:
    """Each prompt streamed once, alone (the greedy reference chunks)."""
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT_S)
    try:
        out = []
        for i, p in enumerate(prompts):
            s = stream_once(client, model, p, i, max_tokens)
            if not s.ok:
                raise RuntimeError(f"reference stream {i} failed: {s.error}")
            out.append(s.chunks)
        return out
    finally:
        client.close()


def check_streams(
    streams: Sequence[Stream], expected: Mapping[str, Sequence[tuple[str, ...]]]
) -> list[str]:
    """Every problem with `streams`: a failure, a stream carrying two versions (or none), a
    version without references, or chunks that differ from that version's reference."""
    problems = []
    for n, s in enumerate(streams):
        where = f"stream {n} (prompt {s.prompt})"
        if not s.ok:
            problems.append(f"{where} failed: {s.error}")
            continue
        if len(s.versions) != 1:
            problems.append(f"{where} carried versions {sorted(s.versions)}")
            continue
        (version,) = s.versions
        refs = expected.get(version)
        if refs is None:
            problems.append(f"{where}: served by unexpected version {version}")
        elif s.chunks != refs[s.prompt]:
            problems.append(
                f"{where} on {version}: {''.join(s.chunks)!r} != {''.join(refs[s.prompt])!r}"
            )
    return problems
