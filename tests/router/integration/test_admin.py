"""The admin API as `loom up`'s fleet drives it: bearer token, register, replace, drain, mark
down/up, remove; bad requests answered with the field at fault."""

from __future__ import annotations

from typing import Any

SPEC = {
    "url": "http://127.0.0.1:9",
    "role": "decode",
    "weights_version": "v1",
    "kv_events": None,
    "kv_replay": None,
}


def test_the_admin_api_manages_endpoints(launch_router: Any) -> None:
    with launch_router([]) as router:
        assert router.admin("GET", "/admin/endpoints", token="")[0] == 401
        assert router.admin("GET", "/admin/endpoints", token="wrong")[0] == 401
        status, doc = router.admin("PUT", "/admin/endpoints/d0", SPEC)
        assert status == 201 and doc["role"] == "decode" and not doc["draining"]
        assert router.admin("POST", "/admin/endpoints/d0/drain")[1]["draining"]
        status, doc = router.admin("PUT", "/admin/endpoints/d0", {**SPEC, "weights_version": "v2"})
        assert status == 200 and doc["weights_version"] == "v2" and doc["draining"]
        assert not router.admin("POST", "/admin/endpoints/d0/undrain")[1]["draining"]
        status, doc = router.admin("POST", "/admin/endpoints/d0/down")
        assert status == 200 and doc["down"] and not doc["down_by_router"]
        assert not router.admin("POST", "/admin/endpoints/d0/up")[1]["down"]
        status, doc = router.admin("POST", "/admin/endpoints/d0/migrate")
        assert status == 200 and doc["migrated"] == 0
        listed = router.endpoints()
        assert list(listed) == ["d0"] and listed["d0"]["url"] == SPEC["url"]
        assert router.admin("DELETE", "/admin/endpoints/d0")[0] == 200
        assert router.endpoints() == {}


def test_bad_admin_requests_say_what_is_wrong(launch_router: Any) -> None:
    with launch_router([]) as router:
        status, doc = router.admin("PUT", "/admin/endpoints/x", {**SPEC, "role": "boss"})
        assert status == 400 and "body.role" in doc["error"]["message"]
        status, doc = router.admin("PUT", "/admin/endpoints/x", {"url": "http://h"})
        assert status == 400 and "body.weights_version" in doc["error"]["message"]
        status, doc = router.admin("DELETE", "/admin/endpoints/ghost")
        assert status == 404 and "ghost" in doc["error"]["message"]
        assert router.admin("POST", "/admin/endpoints/ghost/drain")[0] == 404
        assert router.admin("POST", "/admin/endpoints/ghost/migrate")[0] == 404
        router.admin("PUT", "/admin/endpoints/x", SPEC)
        assert router.admin("POST", "/admin/endpoints/x/explode")[0] == 404
