"""Tool-call parser names (the card's words, loom_runtime.card.chat_parsers, which this layer
may not import) to the formats that read them.

Owns that table; never reads output itself.
"""

from __future__ import annotations

from collections.abc import Mapping

from loom_runtime.wire.openai.chat.formats import ToolFormat
from loom_runtime.wire.openai.chat.glm_xml import GlmXml
from loom_runtime.wire.openai.chat.hermes import Hermes
from loom_runtime.wire.openai.chat.llama3_json import Llama3Json

TOOL_FORMATS: Mapping[str, ToolFormat] = {
    "llama3_json": Llama3Json(),
    "glm45": GlmXml(),
    "glm47": GlmXml(),
    "hermes": Hermes(),
}
