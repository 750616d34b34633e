"""Where a component's weights come from: the `source.uri` schemes and their rules.

Owns parsing and checking a URI, resolving `file:` URIs to paths and `pvc:` URIs to where a pod
mounts their claim (PVC_ROOT); never downloads or opens.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePath, PurePosixPath
from typing import Annotated

from pydantic import AfterValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

from loom_runtime.card import families
from loom_runtime.card.base import DNS_LABEL_PATTERN, CardModel
from loom_runtime.card.errors import CardError, FieldError

SCHEMES = ("file", "hf", "pvc", "s3", "loom")

PVC_ROOT = PurePosixPath("/var/lib/loom/models")
"""Where a worker pod mounts the PersistentVolumeClaim of a `pvc://claim/path` source, read-only:
at PVC_ROOT/claim, so the checkpoint is PVC_ROOT/claim/path. The operator renders the mount
(k8s/render/model_volumes.py); the runtime reads the path (models/tiny.py `resolve_source`)."""

_HF_NAME = r"[A-Za-z0-9][-A-Za-z0-9_.]*"
_HF_REPO = re.compile(rf"^{_HF_NAME}/{_HF_NAME}(@[-A-Za-z0-9_./]+)?$")
_S3_BUCKET = re.compile(r"^[a-z0-9][-a-z0-9.]{1,61}[a-z0-9]$")
_URI_PATTERN = r"^(file:|hf://|pvc://|s3://|loom://)"

_FORMS = (
    "file:///abs/path, file:relative/path (relative to the card file), hf://org/name[@revision], "
    "pvc://claim[/path], s3://bucket[/key] or loom://tiny (loom://tiny-wan, "
    "loom://tiny-sparse-mla, loom://tiny-mot)"
)


def _file_problem(rest: str) -> str | None:
    if rest.startswith("//"):
        host, _, path = rest[2:].partition("/")
        if host not in ("", "localhost"):
            return f"file URIs name no host (got {host!r}); use file:///abs/path"
        return None if path else "file:/// needs a path after the slashes"
    return None if rest.strip("/") else "file: needs a path"


def _problem(scheme: str, rest: str) -> str | None:
    """What is wrong with `scheme:rest`, or None."""
    if scheme == "file":
        return _file_problem(rest)
    if not rest.startswith("//"):
        return f"{scheme} URIs start with {scheme}://"
    body = rest[2:]
    head = body.partition("/")[0]
    if scheme == "hf" and not _HF_REPO.match(body):
        return "hf URIs name a Hugging Face repository: hf://org/name[@revision]"
    if scheme == "pvc" and not re.match(DNS_LABEL_PATTERN, head):
        return f"pvc URIs start with a PersistentVolumeClaim name (got {head!r})"
    if scheme == "pvc" and ".." in body.split("/")[1:]:
        return "a pvc:// path stays inside its claim (no '..' segments)"
    if scheme == "s3" and not _S3_BUCKET.match(head):
        return f"s3 URIs start with a bucket name (got {head!r})"
    tinies = families.tiny_checkpoints()  # loom://tiny, loom://tiny-sparse-mla, loom://tiny-wan
    if scheme == "loom" and body not in tinies:
        return f"loom:// names a checkpoint Loom generates: one of {', '.join(tinies)}"
    return None


def _check_uri(value: str) -> str:
    scheme, colon, rest = value.partition(":")
    if not colon or scheme not in SCHEMES:
        raise PydanticCustomError("uri_scheme", f"unsupported source URI {value!r}: use {_FORMS}")
    problem = _problem(scheme, rest)
    if problem:
        raise PydanticCustomError("uri", f"{problem} (got {value!r})")
    return value


SourceUri = Annotated[
    str,
    AfterValidator(_check_uri),
    WithJsonSchema({"type": "string", "pattern": _URI_PATTERN, "maxLength": 2048}),
]


class Source(CardModel):
    """Where a component's checkpoint lives."""

    uri: SourceUri
    """file:///abs/path, file:relative/path (relative to the card file), hf://org/name[@rev],
    pvc://claim/path, s3://bucket/key, or loom://tiny (the tiny checkpoint Loom generates)."""

    @property
    def scheme(self) -> str:
        """`file`, `hf`, `pvc`, `s3` or `loom`."""
        return self.uri.partition(":")[0]

    @property
    def location(self) -> str:
        """The URI without its scheme: `org/name` for hf://org/name, `tiny` for loom://tiny."""
        rest = self.uri.partition(":")[2]
        return rest[2:] if rest.startswith("//") and self.scheme != "file" else rest

    @property
    def claim(self) -> str | None:
        """The PersistentVolumeClaim a `pvc:` URI names (`store` for pvc://store/v1), else None."""
        return self.location.partition("/")[0] if self.scheme == "pvc" else None

    def mounted_path(self, root: PurePath = PVC_ROOT) -> PurePath | None:
        """Where a pod that mounts the claim at `root`/claim finds a `pvc:` URI's checkpoint
        (PVC_ROOT/store/v1 for pvc://store/v1); None for other schemes."""
        if self.claim is None:
            return None
        claim, _, path = self.location.partition("/")
        return root / claim / path.lstrip("/")  # never absolute: it stays under the claim

    def local_path(self, card_path: str | Path | None = None) -> Path | None:
        """The directory a `file:` URI names, or None for other schemes.

        A relative `file:` URI is resolved against the directory of the card file at
        `card_path`; without `card_path` that is a CardError (there is nothing to resolve from).
        """
        if self.scheme != "file":
            return None
        rest = self.uri.partition(":")[2]
        if rest.startswith("//"):
            return Path("/" + rest[2:].partition("/")[2])
        if rest.startswith("/"):
            return Path(rest)
        if card_path is None:
            raise CardError(
                [FieldError("source.uri", f"{self.uri} is relative: pass the card file's path")]
            )
        return (Path(card_path).parent / rest).resolve()
