"""Drift: a rendered object is applied again only when its render changed, or the watch cache's
copy is no longer what the operator's last write left (edited by hand, deleted); a status write
is no drift, nor a StatefulSet's start count, nor the scaler's own count."""

from __future__ import annotations

import threading
from typing import Any

from loom_operator.k8s.drift import Applied, key_of, marker, render_digest


def manifest(kind: str = "ConfigMap", data: str = "a") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": kind, "data": {"k": data},
            "metadata": {"name": "c-cards", "namespace": "ns"}}  # fmt: skip


def live(rv: str, generation: int | None = None, **labels: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"resourceVersion": rv, "labels": labels}
    if generation is not None:
        meta["generation"] = generation
    return {"metadata": meta}


def test_markers_use_the_generation_and_the_labels_where_the_server_keeps_a_generation() -> None:
    assert marker(live("12")) == "r12" != marker(live("13"))
    assert marker(live("12", 3)) == marker(live("13", 3))  # a status write
    assert marker(live("12", 3)) != marker(live("12", 4))  # a spec write
    assert marker(live("12", 3, app="x")) != marker(live("13", 3, app="y"))  # a label edit
    annotated = live("13", 3)
    annotated["metadata"]["annotations"] = {"deployment.kubernetes.io/revision": "2"}
    assert marker(annotated) == marker(live("12", 3))  # none rendered: a controller's


def test_an_object_never_applied_or_not_in_the_cache_is_applied() -> None:
    applied, m = Applied(), manifest()
    key = key_of(m, "uid-1")
    assert applied.needs_apply(key, m, "r5")
    applied.record(key, m, live("5"))
    assert applied.needs_apply(key, m, None)  # deleted by hand


def test_the_same_render_over_an_untouched_object_is_not_applied_again() -> None:
    applied, m = Applied(), manifest()
    key = key_of(m, "uid-1")
    applied.record(key, m, live("5"))
    assert not applied.needs_apply(key, m, "r5")
    assert applied.needs_apply(key, m, "r6")  # edited by hand
    assert applied.needs_apply(key, manifest(data="b"), "r5")  # the render changed


def test_a_statefulsets_start_count_and_the_scalers_writes_are_no_drift() -> None:
    applied = Applied()
    first = manifest("StatefulSet") | {"spec": {"replicas": 2, "serviceName": "x"}}
    later = manifest("StatefulSet") | {"spec": {"serviceName": "x"}}
    assert render_digest(first) == render_digest(later)
    key = key_of(first, "uid-1")
    applied.record(key, first, live("5", 1))
    applied.wrote("ns", "StatefulSet", "c-cards", live("9", 2))  # the scaler set its replicas
    assert not applied.needs_apply(key, later, marker(live("10", 2)))
    assert applied.needs_apply(key, later, marker(live("11", 3)))


def test_a_card_that_is_gone_takes_its_records_and_its_secret_along() -> None:
    applied, m = Applied(), manifest()
    key = key_of(m, "uid-1")
    applied.record(key, m, live("5"))
    applied.secret_made("ns", "uid-1", {"token": "t"})
    assert not applied.secret_needed("ns", "uid-1", "r7")
    assert applied.secret_needed("ns", "uid-2", "r7")
    applied.forget("ns", "uid-1")
    assert applied.needs_apply(key, m, "r5") and applied.secret_needed("ns", "uid-1", "r7")
    assert applied.secret_data("ns", "uid-1") is None


def test_a_secret_the_cache_lost_is_made_again_with_the_tokens_it_held() -> None:
    applied = Applied()
    applied.secret_made("ns", "uid-1", {"token": "t", "admin-token": "a"})
    assert applied.secret_needed("ns", "uid-1", None)  # deleted by hand
    assert applied.secret_data("ns", "uid-1") == {"token": "t", "admin-token": "a"}


def test_a_name_reused_by_a_new_card_is_that_cards_and_survives_the_old_ones_forget() -> None:
    applied, m = Applied(), manifest()
    old, new = key_of(m, "uid-1"), key_of(m, "uid-2")
    applied.record(old, m, live("5"))
    assert applied.needs_apply(new, m, "r5")  # another card's render: applied again
    applied.record(new, m, live("6"))
    applied.forget("ns", "uid-1")  # the old card's loop ends after the new one applied
    assert not applied.needs_apply(new, m, "r6")


def test_threads_recording_and_forgetting_at_once_lose_nothing() -> None:
    """kopf's handler threads and the card loops' share one record."""
    applied, failed = Applied(), list[BaseException]()

    def card(i: int) -> None:
        m = manifest() | {"metadata": {"name": f"c{i}", "namespace": "ns"}}
        try:
            for round_ in range(300):
                applied.record(key_of(m, f"uid-{i}"), m, live(str(round_)))
                applied.wrote("ns", "ConfigMap", f"c{i}", live(str(round_ + 1)))
                assert not applied.needs_apply(key_of(m, f"uid-{i}"), m, f"r{round_ + 1}")
            if i % 2:
                applied.forget("ns", f"uid-{i}")
        except BaseException as exc:
            failed.append(exc)

    threads = [threading.Thread(target=card, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failed, failed[:1]
    for i in range(8):
        m = manifest() | {"metadata": {"name": f"c{i}", "namespace": "ns"}}
        assert applied.needs_apply(key_of(m, f"uid-{i}"), m, "r300") == bool(i % 2)
