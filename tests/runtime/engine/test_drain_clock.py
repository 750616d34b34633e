"""The drain clock: counted once per drain, from admission closing to idle; abandoned on resume."""

from __future__ import annotations

from loom_runtime.engine.drain_clock import DrainClock


def test_a_drain_is_counted_once_from_the_first_close_to_idle() -> None:
    d = DrainClock()
    d.close(10.0, already_closed=False)
    d.settle(11.0, idle=False)
    d.close(11.5, already_closed=True)  # the controller re-asserts Freeze: same drain
    d.settle(12.5, idle=True)
    d.settle(20.0, idle=True)  # still closed and idle: nothing more to count
    assert (d.drains, d.seconds, d.last_seconds) == (1, 2.5, 2.5)


def test_resume_abandons_a_drain_and_the_next_close_starts_anew() -> None:
    d = DrainClock()
    d.close(0.0, already_closed=False)
    d.reopen()
    d.settle(5.0, idle=True)
    assert d.drains == 0
    d.close(6.0, already_closed=False)
    d.settle(6.0, idle=True)  # already idle when closed: a zero-length drain
    d.reopen()
    d.close(7.0, already_closed=False)
    d.settle(8.0, idle=True)
    assert (d.drains, d.seconds, d.last_seconds) == (2, 1.0, 1.0)


def test_settling_while_open_counts_nothing() -> None:
    d = DrainClock()
    d.settle(3.0, idle=True)
    assert (d.drains, d.seconds) == (0, 0.0)
