from __future__ import annotations

import http.server
import threading

from e2e.node_agent.probes import ProbeState, run_probe


def test_thresholds_and_timing() -> None:
    state = ProbeState(
        {"initialDelaySeconds": 5, "periodSeconds": 2, "failureThreshold": 2}, started_at=100.0
    )
    assert not state.due(104.0) and state.due(105.0)
    state.record(105.0, False)
    assert not state.failed and not state.due(106.0) and state.due(107.0)
    state.record(107.0, False)
    assert state.failed and not state.ok
    state.record(109.0, True)
    assert state.ok and not state.failed


def test_http_and_tcp_probes_against_a_real_server() -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/ready" else 503)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.9.9", 0), Handler)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        ports = [{"name": "http", "containerPort": port}]
        assert run_probe({"httpGet": {"path": "/ready", "port": "http"}}, "127.0.9.9", ports, 0)
        assert not run_probe({"httpGet": {"path": "/other", "port": port}}, "127.0.9.9", ports, 0)
        assert run_probe({"tcpSocket": {"port": port}}, "127.0.9.9", ports, 0)
        assert not run_probe({"httpGet": {"path": "/ready", "port": "nope"}}, "127.0.9.9", ports, 0)
    finally:
        server.shutdown()
        server.server_close()
    assert not run_probe({"tcpSocket": {"port": port}}, "127.0.9.9", [], 0)
