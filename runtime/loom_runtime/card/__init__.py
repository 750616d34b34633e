"""Cards: the ModelCard and its component, loop, recipe and parity specs.

Imports nothing heavy (no torch, no network): the operator and kubectl tooling load it.
"""

from loom_runtime.card.architecture import Architecture, Attention, Indexer, MtpLayers
from loom_runtime.card.base import API_GROUP, API_VERSION, CardModel, ObjectMeta
from loom_runtime.card.component import Component, Precision
from loom_runtime.card.conditions import Condition
from loom_runtime.card.errors import CardError, FieldError
from loom_runtime.card.load import load_model_card, parse_card, read_documents
from loom_runtime.card.loop import Loop, Parity, Recipe
from loom_runtime.card.model_card import ModelCard, ModelCardSpec, ModelCardStatus
from loom_runtime.card.program import Program
from loom_runtime.card.source import Source

__all__ = [
    "API_GROUP",
    "API_VERSION",
    "Architecture",
    "Attention",
    "CardError",
    "CardModel",
    "Component",
    "Condition",
    "FieldError",
    "Indexer",
    "Loop",
    "ModelCard",
    "ModelCardSpec",
    "ModelCardStatus",
    "MtpLayers",
    "ObjectMeta",
    "Parity",
    "Precision",
    "Program",
    "Recipe",
    "Source",
    "load_model_card",
    "parse_card",
    "read_documents",
]
