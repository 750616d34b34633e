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
