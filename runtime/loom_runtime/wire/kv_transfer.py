"""KVTransferParams: the `kv_transfer_params` object of vLLM's NixlConnector, parsed and written.

Owns the field names, their types and the rules that tie them together; never moves a byte and
never imports anything heavier than the standard library (the router parses the same shape).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from loom_runtime.errors import InvalidRequestError

FIELD = "kv_transfer_params"

# What a pull needs from the prefill's answer (vLLM NixlConnector v2 shape).
_REMOTE_FIELDS = (
    "remote_engine_id",
    "remote_request_id",
    "remote_block_ids",
    "remote_host",
    "remote_port",
)


@dataclass(frozen=True)
class KVTransferParams:
    """One request's P/D instructions, in both directions.

    Router -> prefill: `do_remote_decode=True` (run the prompt, keep its KV for a remote decode).
    Prefill -> router -> decode: `do_remote_prefill=True` plus where the KV lies. The vLLM fields
    come first; the `remote_num_tokens`, `weights_version` and `lease_seconds` extensions let a
    decode check that the KV belongs to its prompt and its weights, and keep the lease alive.
    """

    do_remote_decode: bool = False
    do_remote_prefill: bool = False
    remote_engine_id: str | None = None
    remote_request_id: str | None = None
    remote_block_ids: tuple[int, ...] | None = None
    remote_host: str | None = None
    remote_port: int | None = None
    tp_size: int = 1
    remote_num_tokens: int | None = None  # prompt tokens whose KV the prefill holds
    weights_version: str | None = None  # the prefill's weights when it computed the KV
    lease_seconds: float | None = None  # how long the prefill keeps the blocks without a pin

    def __post_init__(self) -> None:
        if self.do_remote_decode and self.do_remote_prefill:
            raise InvalidRequestError(
                f"{FIELD}: do_remote_decode and do_remote_prefill are exclusive; a request is "
                "either prefilled for a remote decode or decoded from a remote prefill",
                param=FIELD,
            )
        if self.do_remote_prefill:
            missing = [name for name in _REMOTE_FIELDS if getattr(self, name) is None]
            if missing:
                raise InvalidRequestError(
                    f"{FIELD}: do_remote_prefill needs {', '.join(missing)}; pass the "
                    f"{FIELD} object of the prefill worker's response unchanged",
                    param=f"{FIELD}.{missing[0]}",
                )

    @property
    def is_transfer(self) -> bool:
        """True when the request takes part in P/D at all."""
        return self.do_remote_decode or self.do_remote_prefill

    @classmethod
    def for_prefill(cls) -> KVTransferParams:
        """What a router sends a prefill worker (vLLM's proxy sends the same)."""
        return cls(do_remote_decode=True)

    @classmethod
    def parse(cls, raw: object) -> KVTransferParams:
        """From a request body's object; InvalidRequestError naming the bad field.

        Unknown keys are ignored, as vLLM does, so newer senders stay compatible.
        """
        if not isinstance(raw, Mapping):
            raise InvalidRequestError(f"{FIELD} must be a JSON object", param=FIELD)
        block_ids = raw.get("remote_block_ids")
        if block_ids is not None:
            if not isinstance(block_ids, list | tuple) or not all(
                _is_int(b) and b >= 0 for b in block_ids
            ):
                raise InvalidRequestError(
                    f"{FIELD}.remote_block_ids must be a list of non-negative integers",
                    param=f"{FIELD}.remote_block_ids",
                )
            block_ids = tuple(int(b) for b in block_ids)
        lease = raw.get("lease_seconds")
        if lease is not None and (not isinstance(lease, int | float) or isinstance(lease, bool)):
            raise InvalidRequestError(
                f"{FIELD}.lease_seconds must be a number", f"{FIELD}.lease_seconds"
            )
        return cls(
            do_remote_decode=_flag(raw, "do_remote_decode"),
            do_remote_prefill=_flag(raw, "do_remote_prefill"),
            remote_engine_id=_opt_str(raw, "remote_engine_id"),
            remote_request_id=_opt_str(raw, "remote_request_id"),
            remote_block_ids=block_ids,
            remote_host=_opt_str(raw, "remote_host"),
            remote_port=_opt_int(raw, "remote_port", 1, 65535),
            tp_size=_opt_int(raw, "tp_size", 1, 1 << 16) or 1,
            remote_num_tokens=_opt_int(raw, "remote_num_tokens", 1, 1 << 40),
            weights_version=_opt_str(raw, "weights_version"),
            lease_seconds=None if lease is None else float(lease),
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON object, every vLLM key present (null where unset)."""
        out: dict[str, Any] = {
            "do_remote_decode": self.do_remote_decode,
            "do_remote_prefill": self.do_remote_prefill,
            "remote_engine_id": self.remote_engine_id,
            "remote_request_id": self.remote_request_id,
            "remote_block_ids": None
            if self.remote_block_ids is None
            else list(self.remote_block_ids),
            "remote_host": self.remote_host,
            "remote_port": self.remote_port,
            "tp_size": self.tp_size,
        }
        for name in ("remote_num_tokens", "weights_version", "lease_seconds"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _flag(raw: Mapping[str, Any], name: str) -> bool:
    value = raw.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidRequestError(f"{FIELD}.{name} must be true or false", f"{FIELD}.{name}")
    return value


def _opt_str(raw: Mapping[str, Any], name: str) -> str | None:
    value = raw.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"{FIELD}.{name} must be a non-empty string", f"{FIELD}.{name}")
    return value


def _opt_int(raw: Mapping[str, Any], name: str, low: int, high: int) -> int | None:
    value = raw.get(name)
    if value is None:
        return None
    if not _is_int(value) or not low <= value <= high:
        raise InvalidRequestError(
            f"{FIELD}.{name} must be an integer in {low}..{high}", f"{FIELD}.{name}"
        )
    return int(value)
