"""The router's metrics: declared names and labels only, and an endpoint's series leave with it."""

from __future__ import annotations

import pytest

from loom_router.shell.metrics import RouterMetrics


def test_counters_render_and_forget_an_endpoint() -> None:
    m = RouterMetrics()
    m.inc("routed", "a", "prefix")
    m.inc("routed", "b", "load", value=2)
    m.inc("migrations", "resumed")
    m.add_gauge("index_entries", "x", ("index",), lambda: [(("precise",), 5.0)])
    text = m.render().decode()
    assert 'loom_router:routed_total{endpoint="a",reason="prefix"} 1.0' in text
    assert 'loom_router:migrations_total{outcome="resumed"} 1.0' in text
    assert 'loom_router:index_entries{index="precise"} 5.0' in text
    m.forget_endpoint("a")
    text = m.render().decode()
    assert 'endpoint="a"' not in text and 'endpoint="b"' in text
    assert m.value("migrations", "resumed") == 1 and m.total("routed") == 2


def test_wrong_label_count_is_a_bug_not_a_series() -> None:
    with pytest.raises(ValueError, match="takes labels"):
        RouterMetrics().inc("routed", "a")


def test_known_series_start_at_zero_and_an_endpoints_leave_with_it() -> None:
    m = RouterMetrics()
    m.know_endpoint("d0")
    m.inc("routed", "d0", "prefix")
    m.know_endpoint("d0")  # seen again in the next snapshot: counts are kept
    text = m.render().decode()
    assert 'loom_router:migrations_total{outcome="restarted"} 0.0' in text
    assert 'loom_router:pd_total{mode="remote-prefill"} 0.0' in text
    assert 'loom_router:pd_fallbacks_total{reason="version_mismatch"} 0.0' in text
    assert 'loom_router:routed_total{endpoint="d0",reason="spill"} 0.0' in text
    assert 'loom_router:routed_total{endpoint="d0",reason="prefix"} 1.0' in text
    assert 'loom_router:upstream_errors_total{endpoint="d0",kind="broken"} 0.0' in text
    assert 'loom_router:marked_down_total{cause="probe",endpoint="d0"} 0.0' in text
    m.forget_endpoint("d0")
    assert 'endpoint="d0"' not in m.render().decode()
    assert "process_start_time_seconds " in text  # a restart shows as a new start time
