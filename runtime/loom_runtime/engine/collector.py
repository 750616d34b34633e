"""OutputCollector: an on_output callback that gathers one request's streamed outputs.

Owns one request's received increments and turns them into a CompletedRequest; never steps an
engine itself except through the `drive` callable it is given.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from loom_runtime.engine.ar_state import CompletedRequest
from loom_runtime.engine.types import EngineRequest, RequestOutput
from loom_runtime.wire.openai.logprobs import TokenLogprob


class OutputCollector:
    """An on_output callback that gathers one request's outputs and signals the final one."""

    def __init__(self, req: EngineRequest) -> None:
        self.req = req
        self.outputs: list[RequestOutput] = []
        self.done = threading.Event()

    def __call__(self, out: RequestOutput) -> None:
        self.outputs.append(out)
        if out.finished:
            self.done.set()

    def wait(self, deadline: float, drive: Callable[[], bool] | None = None) -> bool:
        """Until the final output arrived (True) or `deadline` (monotonic) passed (False).

        `drive` runs one engine step on this thread (when no step thread runs); it returns
        False when nothing could run, and then the request cannot finish: False.
        """
        while not self.done.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if drive is None:
                self.done.wait(min(remaining, 1.0))
            elif not drive() and not self.done.is_set():
                return False
        return True

    def result(self) -> CompletedRequest:
        final = self.outputs[-1]
        assert final.finished and final.finish_reason is not None and final.metrics is not None
        logprobs: list[TokenLogprob] = []
        for o in self.outputs:
            logprobs.extend(o.logprobs)
        return CompletedRequest(
            request_id=self.req.request_id,
            prompt_token_ids=self.req.prompt_token_ids,
            output_token_ids=tuple(t for o in self.outputs for t in o.new_token_ids),
            text="".join(o.new_text for o in self.outputs),
            finish_reason=final.finish_reason,
            num_cached_tokens=final.num_cached_tokens,
            logprobs=tuple(logprobs),
            weights_version=final.weights_version,
            metrics=final.metrics,
            prompt_logprobs=next(
                (o.prompt_logprobs for o in self.outputs if o.prompt_logprobs), ()
            ),
            behaviour_logprobs=tuple(b for o in self.outputs for b in o.behaviour_logprobs),
            seed=final.seed,
        )
