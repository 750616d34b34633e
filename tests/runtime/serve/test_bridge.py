"""The engine-thread -> event-loop bridge: order, abort when the consumer leaves, stall timeout,
one wake-up of the event loop for all the outputs of a step.

The sink here is a test double that plays the engine thread's side of the contract (callbacks
from another thread); the real engine is exercised by the server tests.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from loom_runtime.engine.types import EngineRequest, RequestOutput, SamplingParams
from loom_runtime.serve.bridge import Mailbox, OutputStream, submitted
from loom_runtime.serve.errors import EngineStalledError


class ThreadedSinkDouble:
    """Emits `n` outputs for a request from its own thread; records aborts."""

    def __init__(self, n: int, finish: bool = True) -> None:
        self.n, self.finish = n, finish
        self.aborted: list[str] = []
        self.threads: list[threading.Thread] = []

    def add_request(self, req: EngineRequest, on_output: Callable[[RequestOutput], None]) -> None:
        def run() -> None:
            for i in range(self.n):
                last = self.finish and i == self.n - 1
                on_output(RequestOutput(req.request_id, (i,), str(i), finished=last,
                                        finish_reason="length" if last else None))  # fmt: skip

        t = threading.Thread(target=run)
        self.threads.append(t)
        t.start()

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


def _req(max_tokens: int = 8) -> EngineRequest:
    return EngineRequest("r1", (1, 2), SamplingParams(max_tokens=max_tokens))


async def _drain(stream: OutputStream) -> list[str]:
    texts = []
    while True:
        out = await stream.next(timeout=5)
        texts.append(out.new_text)
        if out.finished:
            return texts


def test_outputs_from_the_engine_thread_arrive_in_order_and_finishing_does_not_abort() -> None:
    sink = ThreadedSinkDouble(8)

    async def main() -> list[str]:
        async with submitted(sink, _req()) as stream:
            return await _drain(stream)

    assert asyncio.run(main()) == [str(i) for i in range(8)]
    assert sink.aborted == []


def test_leaving_early_aborts_the_request() -> None:
    sink = ThreadedSinkDouble(8)

    async def main() -> None:
        async with submitted(sink, _req()) as stream:
            await stream.next(timeout=5)
            raise ConnectionResetError("client left")

    with pytest.raises(ConnectionResetError):
        asyncio.run(main())
    assert sink.aborted == ["r1"]


def test_a_silent_engine_raises_stalled_and_aborts() -> None:
    sink = ThreadedSinkDouble(1, finish=False)

    async def main() -> None:
        async with submitted(sink, _req()) as stream:
            await stream.next(timeout=5)
            await stream.next(timeout=0.05)

    with pytest.raises(EngineStalledError, match="no output"):
        asyncio.run(main())
    assert sink.aborted == ["r1"]


def test_pushing_after_the_loop_closed_is_harmless() -> None:
    event_loop = asyncio.new_event_loop()
    stream = OutputStream(event_loop, "r1", bound=2)
    event_loop.close()
    stream.push(RequestOutput("r1", (1,), "x"))  # must not raise into the engine thread


def test_a_steps_outputs_for_many_requests_wake_the_loop_once() -> None:
    async def main() -> tuple[int, list[list[str]]]:
        mailbox = Mailbox(asyncio.get_running_loop())
        deliveries = [0]
        deliver = mailbox._deliver

        def counted() -> None:
            deliveries[0] += 1
            deliver()

        mailbox._deliver = counted  # type: ignore[method-assign]
        streams = [OutputStream(mailbox.event_loop, f"r{i}", 4, mailbox) for i in range(16)]

        def one_step(token: int) -> None:  # the engine thread: one output per request
            for i, stream in enumerate(streams):
                last = token == 1
                reason = "length" if last else None
                stream.push(RequestOutput(f"r{i}", (token,), str(token), last, reason))

        for token in (0, 1):
            t = threading.Thread(target=one_step, args=(token,))
            t.start()
            t.join()  # the loop is busy here: the whole step is posted before it runs
            await asyncio.sleep(0)
        texts = [[(await s.next(5)).new_text for _ in range(2)] for s in streams]
        return deliveries[0], texts

    deliveries, texts = asyncio.run(main())
    assert deliveries == 2  # one per step, not one per output
    assert texts == [["0", "1"]] * 16
