"""One denoise step of the MoT equals a plain float64 reference, and the latents attend to the
text KV the AR loop wrote: read in place, never recomputed, never written."""

from __future__ import annotations

import pytest
import torch
from tests.runtime.models.mot.ar_history import decode_greedily, latents

from loom_runtime.models.loader import load_model
from loom_runtime.models.mot.denoise_batch import DenoiseBatch, DenoiseRequest

TOL = 1e-6  # float64 both sides; RoPE's cos/sin are float32-made on ours (~1e-8 here)
PROMPTS = {"a": [5, 81, 300, 17, 2048, 9, 44, 610, 3, 77, 1200], "b": [12, 900, 33, 4001, 7, 64]}


def request(seqs, name: str, x: torch.Tensor, t: float) -> DenoiseRequest:
    return DenoiseRequest(x, t, seqs.lengths[name], list(seqs.tables[name]))


def test_one_denoise_step_equals_the_float64_reference(mot64, reference, paged) -> None:
    seqs, tokens = decode_greedily(mot64, paged, PROMPTS, steps=5)
    xa, xb, xu = latents(3, 4, 6, seed=1), latents(3, 2, 4, seed=2), latents(3, 4, 4, seed=3)
    batch = DenoiseBatch(
        (
            request(seqs, "a", xa, 0.7),
            request(seqs, "b", xb, 0.25),
            DenoiseRequest(xu, 1.0, 0, []),  # unconditional: no text KV
        )
    )
    velocities = mot64.denoise(batch, seqs.kv)
    expected = [
        reference.velocity(tokens["a"], xa, 0.7),
        reference.velocity(tokens["b"], xb, 0.25),
        reference.velocity([], xu, 1.0),
    ]
    for ours, theirs in zip(velocities, expected, strict=True):
        assert ours.shape == theirs.shape and ours.dtype == torch.float64
        assert (ours - theirs).abs().max().item() < TOL
        assert theirs.abs().max().item() > 0.1  # not trivially ~0
    # the text conditions the step: the same latents under b's text predict another velocity
    other = mot64.denoise(DenoiseBatch((request(seqs, "b", xa, 0.7),)), seqs.kv)[0]
    assert (other - velocities[0]).abs().max().item() > 1e-3


def test_the_stack_runs_only_latent_tokens_over_the_cached_text_kv(mot64, paged, monkeypatch):
    """No recompute: every shared block sees the 6 latent rows and nothing of the 16-token text,
    and the step's result follows the KV in the cache, not the request's tokens."""
    seqs, _ = decode_greedily(mot64, paged, PROMPTS, steps=5)
    rows: list[int] = []
    for layer in mot64.layers:
        original = layer.attention_inputs

        def spy(x, rope, original=original):
            rows.append(int(x.shape[0]))
            return original(x, rope)

        monkeypatch.setattr(layer, "attention_inputs", spy)
    x = latents(3, 4, 6, seed=4)
    before = mot64.denoise(DenoiseBatch((request(seqs, "a", x, 0.5),)), seqs.kv)[0]
    assert seqs.lengths["a"] == 16
    assert rows == [6] * len(mot64.layers)
    # change a's cached values of the last layer in place: the step changes with them
    blocks = torch.tensor(seqs.tables["a"])
    last = len(mot64.layers) - 1
    seqs.kv.data[blocks, last, 1] *= 2.0
    after = mot64.denoise(DenoiseBatch((request(seqs, "a", x, 0.5),)), seqs.kv)[0]
    assert (after - before).abs().max().item() > 1e-3


def test_denoise_never_writes_the_cache_and_decoding_goes_on_unchanged(mot64, paged) -> None:
    seqs, tokens = decode_greedily(mot64, paged, PROMPTS, steps=3, seed=7)
    untouched, _ = decode_greedily(mot64, paged, PROMPTS, steps=3, seed=7)
    pool = seqs.kv.data.clone()
    mot64.denoise(DenoiseBatch((request(seqs, "a", latents(3, 6, 6, seed=5), 0.9),)), seqs.kv)
    assert torch.equal(seqs.kv.data, pool)
    assert seqs.lengths == untouched.lengths
    step = [("a", [tokens["a"][-1]]), ("b", [tokens["b"][-1]])]
    after_denoise, plain = seqs.step(step), untouched.step(step)
    assert all(torch.equal(after_denoise[n], plain[n]) for n in ("a", "b"))


@pytest.mark.parametrize(
    ("shape", "t", "context", "message"),
    [
        ((4, 4, 4), 0.5, 0, r"request 0: latents \(4, 4, 4\) must be \[3, H, W\]"),
        ((3, 4, 5), 0.5, 0, r"multiples of 2"),
        ((3, 4, 4), 1.5, 0, r"timestep 1.5 not in \[0, 1\]"),
        ((3, 4, 4), 0.5, 9, r"context_len 9 does not fit its 2 blocks of 4"),
    ],
)
def test_bad_denoise_requests_are_refused_by_name(mot64, paged, shape, t, context, message):
    seqs = paged(mot64, block_size=4)
    bad = DenoiseRequest(torch.zeros(shape, dtype=torch.float64), t, context, [0, 1])
    with pytest.raises(ValueError, match=message):
        mot64.denoise(DenoiseBatch((bad,)), seqs.kv)


def test_a_float32_denoise_step_is_the_reference_to_float32_precision(
    mot_checkpoint, reference, paged
) -> None:
    model = load_model(mot_checkpoint[0], dtype=torch.float32).model
    seqs, tokens = decode_greedily(model, paged, {"a": PROMPTS["a"]}, steps=2)
    x = latents(3, 4, 4, seed=6).float()
    ours = model.denoise(DenoiseBatch((request(seqs, "a", x, 0.4),)), seqs.kv)[0]
    assert ours.dtype == torch.float32
    expected = reference.velocity(tokens["a"], x.double(), 0.4)
    assert (ours.double() - expected).abs().max().item() < 1e-4
