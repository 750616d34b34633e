"""How long a simulated worker takes: a prefill step over a token budget, a decode step at a
batch size, and the fixed overheads, calibrated from this machine's measured figures.

Pure data and arithmetic; never simulates a request or a fleet.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServiceModel:
    """One worker shape's service times (seconds) and capacity."""

    name: str
    prefill_step_s: float
    """Fixed cost of one prefill forward."""
    prefill_token_s: float
    """Each prompt token computed in a prefill forward."""
    prefill_budget: int
    """Prompt tokens one prefill forward takes at most (chunked prefill)."""
    decode_step_s: float
    """Fixed cost of one decode step."""
    decode_seq_s: float
    """Each sequence in the decode batch adds this to the step."""
    max_num_seqs: int
    """Sequences a decode worker runs at once."""
    kv_tokens: int
    """Tokens of KV a decode worker holds."""
    handoff_s: float
    """From the end of prefill to the first token at the client (HTTP, router, KV pull)."""
    start_s: float
    """From the decision to a new worker serving (scheduling, image, weight load)."""
    calibration: str
    """Where the figures come from (docs/benchmarks.md)."""

    def prefill_s(self, tokens: int) -> float:
        """One prefill forward over `tokens` prompt tokens."""
        return self.prefill_step_s + self.prefill_token_s * tokens

    def decode_s(self, batch: int) -> float:
        """One decode step with `batch` sequences (one token each)."""
        return self.decode_step_s + self.decode_seq_s * batch

    def prefill_tokens_per_s(self) -> float:
        """What one prefill worker computes per second, saturated (full chunked forwards): the
        card's profiled `prefillTokensPerSecond`."""
        return self.prefill_budget / self.prefill_s(self.prefill_budget)

    def decode_tokens_per_s(self, itl_s: float) -> float:
        """What one decode worker generates per second at its largest batch within `itl_s`: the
        card's profiled `decodeTokensPerSecond`."""
        batch = self.batch_within(itl_s)
        return batch / self.decode_s(batch)

    def batch_within(self, itl_s: float) -> int:
        """The largest decode batch whose step stays within `itl_s` (at least 1)."""
        fits = int((itl_s - self.decode_step_s) / self.decode_seq_s)
        return max(1, min(self.max_num_seqs, fits))


# tiny (12.6M params, fp32, 2-core CPU):
# - prefill: Loom's TTFT at 16 concurrent prompts of 64-512 tokens (~4,600 tokens) is the prefill
#   of all of them, 0.67 s (docs/benchmarks.md, "Engine: Loom vs transformers"): 0.145 ms/token;
#   the forward's fixed cost is the decode fit's intercept (5 ms).
# - decode: guidellm against `loom up` of examples/tiny-pd.yaml (bench/results/serving.json),
#   ITL p50 6.0 ms at concurrency 1 and 18.9 ms at 16: 5.1 ms + 0.86 ms per sequence.
# - hand-off: that run's TTFT p50 at concurrency 1 (71.5 ms for 128 prompt tokens) less the
#   prefill forward (5 + 18.6 ms) and one decode step (6 ms): 42 ms.
# - start: 40 s, an assumption (see docs/benchmarks.md): the real-node run's worker pods took
#   ~40 s to compile the CPU kernel and load the checkpoint.
TINY = ServiceModel(
    name="tiny",
    prefill_step_s=0.005,
    prefill_token_s=0.000145,
    prefill_budget=4096,
    decode_step_s=0.0051,
    decode_seq_s=0.00086,
    max_num_seqs=32,
    kv_tokens=32 * 2048,
    handoff_s=0.042,
    start_s=40.0,
    calibration="tiny: bench/results/serving.json (ITL, TTFT at c=1) and the engine table's "
    "16-prompt prefill (docs/benchmarks.md)",
)

# 0.5B shape (Qwen2.5-0.5B's shape, random weights, fp32, 2-core CPU), docs/benchmarks.md's
# engine table: Loom single stream 8.2 tok/s (a 122 ms step at batch 1); 16 concurrent
# 33.1 tok/s over 16 x 32 tokens (15.5 s) less the prefill of 16 x ~96 tokens at transformers'
# single-prompt TTFT (0.463 s for ~96 tokens: 4.8 ms/token, 7.4 s) leaves 8.1 s for 32 steps,
# 253 ms at batch 16: 113 ms + 8.7 ms per sequence. Hand-off and start as for tiny.
HALF_B = ServiceModel(
    name="0.5b",
    prefill_step_s=0.113,
    prefill_token_s=0.0048,
    prefill_budget=4096,
    decode_step_s=0.113,
    decode_seq_s=0.0087,
    max_num_seqs=32,
    kv_tokens=32 * 2048,
    handoff_s=0.042,
    start_s=40.0,
    calibration="0.5b: the engine table's 0.5b rows (docs/benchmarks.md)",
)

MODELS = {m.name: m for m in (TINY, HALF_B)}
