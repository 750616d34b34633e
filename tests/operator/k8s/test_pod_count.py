"""How many pods a role's StatefulSet keeps: the desired count plus the retiring workers above
it that are not stopped yet — so a scale-down removes only drained pods."""

from __future__ import annotations

import pytest

from loom_operator.api.roles import RoleName
from loom_operator.fleet.observed import WorkerState
from loom_operator.k8s.pod_count import role_pod_count, statefulset_replicas, worker_index


@pytest.mark.parametrize(
    ("desired", "present", "stopped", "expected"),
    [
        (2, [0, 1], [], 2),  # steady
        (3, [0, 1], [], 3),  # scale up: the new pod is made at once
        (1, [0, 1, 2], [], 3),  # scale down begun: both extras still serve or drain
        (1, [0, 1, 2], [2], 2),  # the highest is drained and stopped: its pod goes
        (1, [0, 1, 2], [1], 3),  # a lower one stopped first: kept until the highest stops too
        (1, [0, 1, 2], [1, 2], 1),  # both stopped
        (0, [0], [0], 0),  # scaled to zero once drained
        (0, [0], [], 1),  # scaled to zero, still draining
        (2, [0, 3], [], 4),  # a stray high ordinal is kept until the core stops it
        (2, [], [], 2),  # nothing observed yet
    ],
)
def test_statefulset_replicas(
    desired: int, present: list[int], stopped: list[int], expected: int
) -> None:
    assert statefulset_replicas(desired, present, stopped) == expected


def test_worker_index_reads_only_the_role_s_own_ordinals() -> None:
    assert worker_index("tiny-pd-decode-2", "tiny-pd", "decode") == 2
    assert worker_index("tiny-pd-prefill-2", "tiny-pd", "decode") is None
    assert worker_index("tiny-pd-decode-x", "tiny-pd", "decode") is None
    assert worker_index("tiny-pd-decode-extra-1", "tiny-pd", "decode") is None


def _worker(name: str, role: RoleName) -> WorkerState:
    return WorkerState(name=name, role=role, weights_version="v1")


def test_a_busy_retiring_decode_keeps_its_pod_until_the_core_stops_it() -> None:
    workers = [_worker(f"tiny-pd-decode-{i}", "decode") for i in range(3)]
    workers.append(_worker("tiny-pd-prefill-0", "prefill"))
    assert role_pod_count("tiny-pd", "decode", 1, workers, stopped=set()) == 3
    assert role_pod_count("tiny-pd", "decode", 1, workers, {"tiny-pd-decode-2"}) == 2
    both = {"tiny-pd-decode-1", "tiny-pd-decode-2"}
    assert role_pod_count("tiny-pd", "decode", 1, workers, both) == 1
    assert role_pod_count("tiny-pd", "prefill", 1, workers, both) == 1
