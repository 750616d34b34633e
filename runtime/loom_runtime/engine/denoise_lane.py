"""DenoiseLane: the denoise loops that run in the engine's steps beside its AR loops: a
think-then-draw request whose text loop ended moves here with that loop's KV blocks (the table
is moved, no block is copied or recomputed) and stays until its last Euler step; and the pure
choice of which denoise steps share a scheduler step's token budget.

Owns the drawing requests, their latents and the blocks they hold until they finish or abort;
never schedules AR work or samples tokens, and writes KV blocks only to recompute a drawing's
text KV under new weights (a keep swap with kv "recompute").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from loom_runtime.engine.ar_state import ARDecodeState
from loom_runtime.engine.denoise_loop import (
    DENOISE_STEP,
    DenoiseStart,
    DenoiseState,
    MotDenoiseExecutor,
    MotDenoiseLoop,
)
from loom_runtime.engine.draw import draw_noise
from loom_runtime.engine.keep_swap import KVPolicy
from loom_runtime.engine.runner import TokenRunner, TokenWork
from loom_runtime.engine.types import RequestOutput
from loom_runtime.kv.allocator import KVAllocator
from loom_runtime.kv.block_table import BlockTable
from loom_runtime.loop.contract import Done, WorkPlan
from loom_runtime.loop.execute import execute_plans

logger = logging.getLogger(__name__)

Emit = Callable[[RequestOutput], None]


def pick_denoise(costs: Sequence[int], budget: int) -> int:
    """How many of the drawing requests' next steps (oldest first, each `costs[i]` latent
    tokens) run in this scheduler step: the oldest always (admission checked that one step of
    any image fits the whole step budget, so none starves), then each next while the total
    stays within `budget`. The AR loops get what is left of the step's budget."""
    total = 0
    for i, cost in enumerate(costs):
        if i and total + cost > budget:
            return i
        total += cost
    return len(costs)


@dataclass(eq=False)
class Drawing:
    """One request in its denoise loop: its state, the text KV blocks it holds (moved from its
    AR loop) and the tokens whose KV they hold, and its text loop's final output, held back
    until the image is done. `stale`: its text KV is of weights swapped out under it (kv
    "recompute"), to be recomputed before its next step."""

    state: DenoiseState
    table: BlockTable
    context: tuple[int, ...]
    clock: Callable[[], float]
    text_final: RequestOutput | None = None
    stale: bool = False

    @property
    def request_id(self) -> str:
        return self.state.request_id


Chosen = list[tuple[Drawing, WorkPlan[torch.Tensor]]]


class DenoiseLane:
    """The drawing requests of an engine over a MoT model, oldest first."""

    def __init__(
        self,
        loop: MotDenoiseLoop,
        executor: MotDenoiseExecutor,
        kv: KVAllocator,
        channels: int,
        emit: Emit,
        runner: TokenRunner,
    ) -> None:
        self.loop, self.executor, self.kv, self.runner = loop, executor, kv, runner
        self.channels = channels
        self.dtype, self.device = executor.model.dtype, executor.model.device
        self.emit = emit
        self.drawing: dict[str, Drawing] = {}

    def __len__(self) -> int:
        return len(self.drawing)

    @property
    def num_blocks(self) -> int:
        """KV blocks the drawing requests hold."""
        return sum(d.table.num_blocks for d in self.drawing.values())

    # --- the hand-over from the AR loop --------------------------------------------------------

    def take(self, text: ARDecodeState) -> bool:
        """Start the denoise loop of a think-then-draw request whose AR loop just ended (not
        aborted): move its block table here (the AR loop then frees an empty one). False for
        any other request. Its context is every token whose KV the AR loop computed: the
        prompt and the output but the last sampled token, which no forward ever ran."""
        spec = text.request.draw
        if spec is None or text.finish_reason in (None, "abort"):
            return False
        noise = draw_noise(spec, self.channels, self.dtype, self.device)
        table = BlockTable(block_ids=list(text.table.block_ids))
        text.table.block_ids = []
        start = DenoiseStart(
            text.request_id, noise, spec.num_steps, text.num_computed, tuple(table.block_ids)
        )
        state = self.loop.init(start, text.ctx)
        context = tuple(text.tokens[: text.num_computed])
        self.drawing[text.request_id] = Drawing(state, table, context, text.ctx.clock)
        return True

    def hold(self, out: RequestOutput) -> RequestOutput:
        """The text loop's final output of a drawing request, as an increment (not finished):
        the finish is sent with the image. Any other output passes unchanged."""
        drawing = self.drawing.get(out.request_id)
        if drawing is None or not out.finished:
            return out
        drawing.text_final = out
        return replace(out, finished=False, finish_reason=None, metrics=None)

    # --- a keep swap -------------------------------------------------------------------------

    def new_weights(self, version: str, kv: KVPolicy) -> None:
        """New weights are in under the drawing requests (a keep swap, at a step boundary): each
        one's next steps run on them. kv "keep": it goes on attending to its text KV of the old
        weights; "recompute": that KV is dropped now and recomputed under the new weights into
        fresh blocks before its next step (see _recompute)."""
        for drawing in self.drawing.values():
            self.loop.rebase(drawing.state, version)
            if kv == "recompute":
                self.kv.free(drawing.table)  # old KV: never cached again, its blocks go back
                drawing.stale = True
        self._recompute()

    def _recompute(self) -> None:
        """Recompute the stale drawings' text KV (oldest first, one forward) into fresh blocks,
        each as far as the free blocks go; one that finds none yet waits, running no step,
        and is tried again before the next step's schedule (ahead of the AR loops' growth)."""
        works: list[TokenWork] = []
        for drawing in self.drawing.values():
            if not drawing.stale or not self.kv.grow(drawing.table, len(drawing.context)):
                continue
            drawing.stale = False
            self.loop.rebase(
                drawing.state, drawing.state.weights_version, tuple(drawing.table.block_ids)
            )
            if drawing.context:
                works.append(
                    TokenWork(drawing.request_id, drawing.context, 0, drawing.table, False)
                )
        if not works:
            return
        try:
            self.runner.execute(works)
        except Exception:
            logger.exception("recomputing drawings' text KV failed; aborting them")
            self.abort({w.request_id for w in works})

    # --- the step ------------------------------------------------------------------------------

    def schedule(self, budget: int) -> Chosen:
        """This step's denoise plans (see pick_denoise); `budget`: the step's token budget less
        what the running AR loops need at least (one token each). A stale drawing whose text
        KV cannot be recomputed yet runs no step."""
        if any(d.stale for d in self.drawing.values()):
            self._recompute()
        pending: Chosen = []
        for drawing in [d for d in self.drawing.values() if not d.stale]:
            plan = self.loop.next(drawing.state)
            if isinstance(plan, Done):
                self._finish(drawing, self.loop.finalize(drawing.state))
            else:
                pending.append((drawing, plan))
        n = pick_denoise([p.resources.compute_tokens for _, p in pending], budget)
        return pending[:n]

    def run(self, chosen: Chosen) -> None:
        """Execute the chosen plans (one batched denoise), advance each loop, finish the done
        ones; a failing batch aborts its requests."""
        try:
            velocities = execute_plans([p for _, p in chosen], {DENOISE_STEP: self.executor})
        except Exception:
            logger.exception("denoise step failed; aborting its requests")
            self.abort({d.request_id for d, _ in chosen})
            return
        for (drawing, _), velocity in zip(chosen, velocities, strict=True):
            self.loop.advance(drawing.state, velocity)
            if isinstance(self.loop.next(drawing.state), Done):
                self._finish(drawing, self.loop.finalize(drawing.state))

    def abort(self, request_ids: set[str]) -> None:
        """Finish these drawing requests now with finish_reason "abort", freeing their blocks
        and dropping their latents."""
        for rid in [r for r in self.drawing if r in request_ids]:
            self._finish(self.drawing[rid], None)

    def _finish(self, drawing: Drawing, latents: torch.Tensor | None) -> None:
        """Free its blocks and send its final output: the image, or none when aborted; its
        metrics are the text loop's, finished now (end to end includes the drawing)."""
        del self.drawing[drawing.request_id]
        self.kv.free(drawing.table)
        drawing.state.latents = torch.empty(0)  # the latents go with the request
        final = drawing.text_final or RequestOutput(drawing.request_id, (), "", finished=True)
        metrics = final.metrics
        if metrics is not None:
            metrics = replace(metrics, finished_time=drawing.clock())
        self.emit(
            replace(
                final,
                new_token_ids=(),
                new_text="",
                finished=True,
                finish_reason=final.finish_reason if latents is not None else "abort",
                weights_version=drawing.state.weights_version,
                logprobs=(),
                prompt_logprobs=(),
                latents=latents,
                metrics=metrics,
            )
        )
        logger.debug("drawn", extra={"request_id": drawing.request_id, "ok": latents is not None})
