"""The router admin API's JSON: what the operator's client writes the router reads, what the
router lists the client reads back, and a bad PUT body names every bad field."""

from __future__ import annotations

import pytest

from loom_runtime.wire.errors import WireConfigError
from loom_runtime.wire.router_admin import (
    EndpointRecord,
    EndpointSpec,
    endpoints_from_json,
    endpoints_json,
)

SPEC = EndpointSpec("http://127.0.0.1:9000", "decode", "v1", "tcp://127.0.0.1:9002", None)


def test_a_spec_and_a_record_round_trip() -> None:
    assert EndpointSpec.from_json(SPEC.to_json(), "body") == SPEC
    record = EndpointRecord("d0", SPEC, draining=True, down=True, down_by_router=True, in_flight=2)
    assert endpoints_from_json(endpoints_json(3, [record])) == {"d0": record}
    assert record.routed is False  # draining
    assert EndpointRecord("d1", SPEC, down=True, down_by_router=True).routed is True


def test_a_bad_put_body_names_every_problem() -> None:
    doc = {"url": "ftp://x", "role": "router", "kv_events": 5, "extra": 1}
    with pytest.raises(WireConfigError) as err:
        EndpointSpec.from_json(doc, "body")
    text = str(err.value)
    for where in ("body.extra", "body.weights_version", "body.kv_events", "body.role", "body.url"):
        assert where in text
    with pytest.raises(WireConfigError, match="must be an object"):
        EndpointSpec.from_json([], "body")
