"""A minimal P/D proxy: the router's two-step flow (prefill, then decode) for one pair of workers.

Owns the request rewriting of the P/D contract (docs/pd.md), the same as vLLM's proxy does it;
never picks workers, never retries and never parses a token. Run it with
`python -m loom_runtime.testing.pd_proxy --prefill URL --decode URL --port N`.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp
from aiohttp import web

from loom_runtime.transfer.params import FIELD, KVTransferParams

logger = logging.getLogger(__name__)

PD_HEADER = "x-loom-pd"  # "remote-prefill", or "local-prefill" when the prefill step failed
REQUEST_ID_HEADER = "x-request-id"
_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=600)
_HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "content-encoding"}


def prefill_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """Step 1: the client's request, made a non-streamed one-token prefill for a remote decode."""
    out = dict(body)
    out[FIELD] = KVTransferParams.for_prefill().to_dict()
    out["stream"] = False
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out.pop("stream_options", None)
    return out


def decode_body(
    body: Mapping[str, Any], prefill_response: Mapping[str, Any] | None
) -> dict[str, Any]:
    """Step 2: the client's original request plus the prefill's kv_transfer_params (if any:
    without them the decode prefills locally)."""
    out = dict(body)
    params = None if prefill_response is None else prefill_response.get(FIELD)
    if params:
        out[FIELD] = params
    else:
        out.pop(FIELD, None)
    return out


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
        prefilled = await self._prefill(request.path, body, headers)
        mode = "remote-prefill" if prefilled and prefilled.get(FIELD) else "local-prefill"
        url = self.decode_url + request.path
        async with self._session.post(
            url, json=decode_body(body, prefilled), headers=headers
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
