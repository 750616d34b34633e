"""The agentic trace the routing and long-context benches share: seeded, shaped as asked, and
replayed in arrival order with each session's turns in sequence."""

from __future__ import annotations

from bench.agentic_trace import TraceShape, turn_order, workload

SHAPE = TraceShape(groups=3, users=2, turns=4, system_tokens=40, user_tokens=8, rate=2.0,
                   think_s=0.5, seed=7)  # fmt: skip


def test_the_trace_is_seeded_and_has_the_shape_asked_for() -> None:
    systems, sessions = workload(SHAPE)
    assert workload(SHAPE) == (systems, sessions)
    assert workload(TraceShape(**{**vars(SHAPE), "seed": 8})) != (systems, sessions)
    assert [len(s) for s in systems] == [40] * 3
    assert sorted((s.group, s.user) for s in sessions) == [
        (g, u) for g in range(3) for u in range(2)
    ]
    assert all(len(s.messages) == len(s.thinks) == 4 for s in sessions)
    assert all(len(m) == 8 and all(10 <= t < 4000 for t in m) for s in sessions for m in s.messages)
    starts = [s.start_s for s in sessions]
    assert starts == sorted(starts) and starts[0] > 0


def test_turns_replay_in_arrival_order_each_session_in_sequence() -> None:
    _, sessions = workload(SHAPE)
    order = turn_order(sessions)
    assert sorted(order) == [(i, t) for i in range(len(sessions)) for t in range(4)]
    for i in range(len(sessions)):
        assert [t for j, t in order if j == i] == [0, 1, 2, 3]
    arrivals = [sessions[i].start_s + sum(sessions[i].thinks[:t]) for i, t in order]
    assert arrivals == sorted(arrivals)
    # With these think times sessions overlap: the replay interleaves them.
    assert [i for i, _ in order] != sorted(i for i, _ in order)
