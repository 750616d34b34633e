"""The online step cost model: the predicted seconds of one batched forward of a kind ("denoise",
"vae_decode", "text_encode") and shape signature, fitted from the step times measured so far.

Owns an exponentially weighted least-squares fit (seconds = fixed + per_item x items) per key and
per kind, in a bounded LRU of keys; never times anything itself, never imports torch.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

Signature = tuple[int, ...]
# Below this weighted variance of the batch sizes (items squared) a fit has seen one size only:
# it cannot tell a fixed cost from a per-item one, and takes the prior's split of the two.
MIN_ITEMS_VARIANCE = 0.05


@dataclass(frozen=True)
class StepCost:
    """A linear cost: one forward of `items` rows takes fixed_s + per_item_s x items seconds."""

    fixed_s: float
    per_item_s: float

    def seconds(self, items: int) -> float:
        return self.fixed_s + self.per_item_s * items


# What a kind never measured is assumed to cost: optimistic, so the first requests run and are
# measured (10 ms a row, no fixed cost).
DEFAULT_PRIOR = StepCost(0.0, 0.01)


@dataclass(frozen=True)
class StepSample:
    """One measured forward: its kind, shape signature, batch rows and wall time."""

    kind: str
    signature: Signature
    items: int
    seconds: float

    def __post_init__(self) -> None:
        if self.items < 1:
            raise ValueError(f"a {self.kind} step sample needs >= 1 item, got {self.items}")
        if not (math.isfinite(self.seconds) and self.seconds >= 0):
            raise ValueError(f"a {self.kind} step took {self.seconds} s: not a duration")


@dataclass(frozen=True)
class StepLoad:
    """What one forward of a step is to run: `items` rows of one kind and signature."""

    kind: str
    signature: Signature
    items: int


@dataclass(frozen=True)
class KindCost:
    """A kind's fit over all its signatures (the prior of an unseen signature), for /metrics."""

    kind: str
    cost: StepCost
    samples: int  # measured forwards of this kind since start (not decayed)


class _Fit:
    """Exponentially weighted sums of 1, n, n², y and n·y over (items n, seconds y) samples."""

    __slots__ = ("s0", "sn", "snn", "sny", "sy")

    def __init__(self) -> None:
        self.s0 = self.sn = self.snn = self.sy = self.sny = 0.0

    def add(self, items: int, seconds: float, decay: float) -> None:
        keep = 1.0 - decay
        self.s0 = self.s0 * keep + 1.0
        self.sn = self.sn * keep + items
        self.snn = self.snn * keep + items * items
        self.sy = self.sy * keep + seconds
        self.sny = self.sny * keep + items * seconds

    def cost(self, prior: StepCost) -> StepCost:
        """The weighted least-squares line, with both coefficients kept >= 0."""
        n, y = self.sn / self.s0, self.sy / self.s0
        variance = self.snn / self.s0 - n * n
        if variance < MIN_ITEMS_VARIANCE:  # one batch size seen: scale the prior to it
            at = prior.seconds(round(n))
            fixed = y * prior.fixed_s / at if at > 0 else 0.0
            return StepCost(fixed, (y - fixed) / n)
        slope = (self.sny / self.s0 - n * y) / variance
        if slope < 0:
            return StepCost(y, 0.0)
        if y - slope * n < 0:
            return StepCost(0.0, self.sny / self.snn)
        return StepCost(y - slope * n, slope)


class StepCostModel:
    """Predicts a forward's seconds from its kind, signature and rows. A signature seen before
    uses its own fit; an unseen one its kind's fit over all signatures, or `prior` for a kind
    never measured. Keeps at most `max_keys` signature fits (least recently measured go first).
    Not thread-safe: its owner calls it under its own lock."""

    def __init__(
        self,
        prior: StepCost = DEFAULT_PRIOR,
        decay: float = 0.1,
        max_keys: int = 64,
        max_kinds: int = 16,
    ) -> None:
        if not 0 < decay <= 1:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        if max_keys < 1 or max_kinds < 1:
            raise ValueError("max_keys and max_kinds must be >= 1")
        if prior.fixed_s < 0 or prior.per_item_s < 0:
            raise ValueError(f"the prior cost must be >= 0, got {prior}")
        self.prior, self.decay = prior, decay
        self.max_keys, self.max_kinds = max_keys, max_kinds
        self._keys: OrderedDict[tuple[str, Signature], _Fit] = OrderedDict()
        self._kinds: OrderedDict[str, tuple[_Fit, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def observe(self, sample: StepSample) -> None:
        key = (sample.kind, sample.signature)
        fit = self._keys.pop(key, None) or _Fit()
        fit.add(sample.items, sample.seconds, self.decay)
        self._keys[key] = fit
        if len(self._keys) > self.max_keys:
            self._keys.popitem(last=False)
        kind_fit, count = self._kinds.pop(sample.kind, (_Fit(), 0))
        kind_fit.add(sample.items, sample.seconds, self.decay)
        self._kinds[sample.kind] = (kind_fit, count + 1)
        if len(self._kinds) > self.max_kinds:
            self._kinds.popitem(last=False)

    def cost(self, kind: str, signature: Signature) -> StepCost:
        fit = self._keys.get((kind, signature))
        if fit is None and kind in self._kinds:
            fit = self._kinds[kind][0]
        return self.prior if fit is None else fit.cost(self.prior)

    def predict(self, load: StepLoad) -> float:
        return self.cost(load.kind, load.signature).seconds(load.items)

    def predict_step(self, loads: Iterable[StepLoad]) -> float:
        """Seconds of one step running `loads`: the loads of one kind and signature share one
        forward (its fixed cost once), as the executors batch them."""
        rows: dict[tuple[str, Signature], int] = {}
        for load in loads:
            key = (load.kind, load.signature)
            rows[key] = rows.get(key, 0) + load.items
        return sum(self.cost(kind, sig).seconds(n) for (kind, sig), n in rows.items())

    def kinds(self) -> tuple[KindCost, ...]:
        """Each measured kind's fit, in name order."""
        return tuple(
            KindCost(kind, fit.cost(self.prior), count)
            for kind, (fit, count) in sorted(self._kinds.items())
        )
