"""A minimal P/D proxy: the router's two-step flow (prefill, then decode) for one pair of workers
(a list of prompts or prompt log-probs are prefilled by the decode, as the router does).

Owns the two HTTP calls (the bodies are loom_runtime.wire.pd's, the router's too); never picks
workers, never retries and never parses a token. Run it with
`python -m loom_runtime.testing.pd_proxy --prefill URL --decode URL --port N`.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

import aiohttp
from aiohttp import web

from loom_runtime.wire.headers import PD_HEADER, REQUEST_ID_HEADER
from loom_runtime.wire.kv_transfer import FIELD
from loom_runtime.wire.pd import decode_body, prefill_body, prefilled_where_decoded

logger = logging.getLogger(__name__)

_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=600)
_HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "content-encoding"}


class PDProxy:
    """One prefill URL and one decode URL behind OpenAI's routes."""

    def __init__(self, prefill_url: str, decode_url: str) -> None:
        self.prefill_url = prefill_url.rstrip("/")
        self.decode_url = decode_url.rstrip("/")
        self._session: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/completions", self.handle)
        app.router.add_post("/v1/chat/completions", self.handle)
        app.router.add_get("/health", self.health)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _: web.Application) -> None:
        self._session = aiohttp.ClientSession(timeout=_TIMEOUT)

    async def _close(self, _: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    async def health(self, _: web.Request) -> web.Response:
        return web.json_response({"prefill": self.prefill_url, "decode": self.decode_url})

    async def handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        body = await request.json()
        headers = {k: v for k, v in request.headers.items() if k.lower() == REQUEST_ID_HEADER}
        local = request.path == "/v1/completions" and prefilled_where_decoded(body)
        prefilled = None if local else await self._prefill(request.path, body, headers)
        mode = "remote-prefill" if prefilled and prefilled.get(FIELD) else "local-prefill"
        url = self.decode_url + request.path
        async with self._session.post(
            url,
            json=decode_body(body, None if prefilled is None else prefilled.get(FIELD)),
            headers=headers,
        ) as up:
            out = web.StreamResponse(status=up.status)
            for key, value in up.headers.items():
                if key.lower() not in _HOP_HEADERS:
                    out.headers[key] = value
            out.headers[PD_HEADER] = mode
            await out.prepare(request)
            async for chunk in up.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out

    async def _prefill(
        self, path: str, body: dict[str, Any], headers: dict[str, str]
    ) -> dict[str, Any] | None:
        assert self._session is not None
        try:
            async with self._session.post(
                self.prefill_url + path, json=prefill_body(body), headers=headers
            ) as resp:
                answer = await resp.json(content_type=None)
                if resp.status == 200 and isinstance(answer, dict):
                    return answer
                logger.warning("prefill answered %s; the decode prefills locally", resp.status)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            logger.warning("prefill failed (%s); the decode prefills locally", exc)
        return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prefill", required=True, help="prefill worker base URL")
    parser.add_argument("--decode", required=True, help="decode worker base URL")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    web.run_app(
        PDProxy(args.prefill, args.decode).app(),
        host=args.host,
        port=args.port,
        access_log=None,
        print=None,
    )


if __name__ == "__main__":
    main()
