"""Building blocks every card shares: the strict camelCase model base, name types, metadata.

Owns the rules for names and label values; never knows about any one card's fields.
"""

from __future__ import annotations

import re
from typing import Annotated, Final, TypeAlias

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

API_GROUP: Final = "loom.dev"
API_VERSION: Final = "loom.dev/v1alpha1"

# What json_schema_extra takes: JSON values by key (pydantic does not export this alias).
JsonValue: TypeAlias = int | float | str | bool | list["JsonValue"] | dict[str, "JsonValue"] | None
JsonDict: TypeAlias = dict[str, JsonValue]

DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
LABEL_VALUE_PATTERN = r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
MAX_NAME = 63


class CardModel(BaseModel):
    """Base of every card model: camelCase in YAML, snake_case in Python, typos are errors.

    Strict like the Kubernetes API server: `"4096"` is not an integer and `2` is not a string,
    so a card that `loom validate` accepts is one that `kubectl apply` accepts.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        strict=True,
        frozen=True,
        use_attribute_docstrings=True,
    )


def _check_dns_label(value: str) -> str:
    if len(value) > MAX_NAME or not re.match(DNS_LABEL_PATTERN, value):
        raise PydanticCustomError(
            "dns_label",
            f"{value!r} is not a DNS-1123 label: use at most {MAX_NAME} lowercase letters, "
            "digits and '-', starting and ending with a letter or digit",
        )
    return value


def _check_label_value(value: str) -> str:
    if len(value) > MAX_NAME or not re.match(LABEL_VALUE_PATTERN, value):
        raise PydanticCustomError(
            "label_value",
            f"{value!r} is not a Kubernetes label value: use 1-{MAX_NAME} letters, digits, "
            "'-', '_' or '.', starting and ending with a letter or digit",
        )
    return value


DnsName = Annotated[
    str,
    AfterValidator(_check_dns_label),
    WithJsonSchema({"type": "string", "pattern": DNS_LABEL_PATTERN, "maxLength": MAX_NAME}),
]
"""A DNS-1123 label: names of cards, components and loops (they end up in pod names)."""

LabelValue = Annotated[
    str,
    AfterValidator(_check_label_value),
    WithJsonSchema({"type": "string", "pattern": LABEL_VALUE_PATTERN, "maxLength": MAX_NAME}),
]
"""A Kubernetes label value: weights versions (pods carry them as labels)."""


class ObjectMeta(BaseModel):
    """The parts of Kubernetes object metadata a card uses.

    Fields the API server adds (uid, resourceVersion, managedFields, ...) are ignored, so a card
    read back from the cluster parses like the one that was applied.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
        strict=True,
        frozen=True,
        use_attribute_docstrings=True,
    )

    name: DnsName
    """Name of the card; a DNS-1123 label."""
    namespace: DnsName | None = None
    """Namespace; cards that refer to each other live in the same one."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Labels, copied onto everything Loom creates for the card."""
    annotations: dict[str, str] = Field(default_factory=dict)
    """Annotations."""
    generation: int | None = None
    """Set by the API server; compared with status.observedGeneration."""


def cel_rules(*rules: tuple[str, str]) -> JsonDict:
    """`json_schema_extra` for a model: CEL rules `(rule, message)` the API server checks too.

    Each mirrors a Python check of the same model, so kubectl rejects what `loom validate` does.
    """
    return {"x-kubernetes-validations": [{"rule": r, "message": m} for r, m in rules]}


def list_set() -> JsonDict:
    """`json_schema_extra` for a list of names: the API server rejects duplicates."""
    return {"x-kubernetes-list-type": "set"}


def list_map(key: str) -> JsonDict:
    """`json_schema_extra` for a list of records keyed by `key` (one record per key)."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": [key]}
