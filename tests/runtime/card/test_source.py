"""source.uri: accepted schemes, rejected forms, and resolving file: URIs to paths and pvc:
URIs to where a pod mounts their claim."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest
from pydantic import ValidationError

from loom_runtime.card import CardError, Source
from loom_runtime.card.source import PVC_ROOT


@pytest.mark.parametrize(
    ("uri", "scheme", "location"),
    [
        ("file:///models/tiny", "file", "///models/tiny"),
        ("file:weights/tiny", "file", "weights/tiny"),
        ("hf://Qwen/Qwen3-0.6B", "hf", "Qwen/Qwen3-0.6B"),
        ("hf://zai-org/GLM-5@main", "hf", "zai-org/GLM-5@main"),
        ("pvc://model-store/glm/5", "pvc", "model-store/glm/5"),
        ("pvc://model-store", "pvc", "model-store"),
        ("s3://my-bucket/glm-5/", "s3", "my-bucket/glm-5/"),
        ("loom://tiny", "loom", "tiny"),
    ],
)
def test_supported_uris_parse(uri: str, scheme: str, location: str) -> None:
    source = Source(uri=uri)
    assert (source.scheme, source.location) == (scheme, location)


@pytest.mark.parametrize(
    ("uri", "complaint"),
    [
        ("ftp://host/model", "unsupported source URI"),
        ("/models/tiny", "unsupported source URI"),
        ("file://otherhost/models", "name no host"),
        ("file:", "needs a path"),
        ("hf://just-a-name", "hf://org/name"),
        ("hf:org/name", "start with hf://"),
        ("pvc://Bad_Claim/x", "PersistentVolumeClaim"),
        ("pvc://store/../other/v1", "stays inside its claim"),
        ("s3://B/key", "bucket"),
        ("loom://huge", "one of tiny"),
    ],
)
def test_bad_uris_are_rejected_with_the_reason(uri: str, complaint: str) -> None:
    with pytest.raises(ValidationError) as info:
        Source(uri=uri)
    assert complaint in str(info.value)


def test_relative_file_uri_resolves_against_the_card_files_directory(tmp_path: Path) -> None:
    card = tmp_path / "cards" / "model.yaml"
    assert Source(uri="file:weights/tiny").local_path(card) == tmp_path / "cards/weights/tiny"
    assert Source(uri="file:../shared/tiny").local_path(card) == tmp_path / "shared/tiny"


def test_absolute_file_uris_ignore_the_card_path(tmp_path: Path) -> None:
    assert Source(uri="file:///models/tiny").local_path(tmp_path / "c.yaml") == Path("/models/tiny")
    assert Source(uri="file://localhost/models/x").local_path() == Path("/models/x")
    assert Source(uri="file:/models/y").local_path() == Path("/models/y")


def test_relative_file_uri_without_a_card_path_is_a_card_error() -> None:
    with pytest.raises(CardError) as info:
        Source(uri="file:weights").local_path()
    assert info.value.errors[0].path == "source.uri"


def test_non_file_uris_have_no_local_path() -> None:
    assert Source(uri="hf://org/name").local_path("/cards/x.yaml") is None
    assert Source(uri="loom://tiny").local_path() is None


@pytest.mark.parametrize(
    ("uri", "claim", "mounted"),
    [
        ("pvc://store/tiny/v1", "store", "/var/lib/loom/models/store/tiny/v1"),
        ("pvc://store/v2/", "store", "/var/lib/loom/models/store/v2"),
        ("pvc://store//v2", "store", "/var/lib/loom/models/store/v2"),  # never absolute
        ("pvc://store", "store", "/var/lib/loom/models/store"),  # the whole claim
    ],
)
def test_pvc_uris_name_their_claim_and_a_path_under_its_mount(
    uri: str, claim: str, mounted: str
) -> None:
    source = Source(uri=uri)
    assert source.claim == claim
    assert source.mounted_path() == PurePosixPath(mounted)
    assert source.mounted_path(Path("/mnt")) == "/mnt" / PurePosixPath(mounted).relative_to(
        PVC_ROOT
    )


def test_only_pvc_uris_have_a_claim() -> None:
    for uri in ("file:///models/x", "hf://org/name", "s3://bucket/x", "loom://tiny"):
        assert Source(uri=uri).claim is None
        assert Source(uri=uri).mounted_path() is None
