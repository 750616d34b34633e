"""The chat template: OpenAI's `developer` role renders as `system` where the checkpoint's
template has no such role, and as itself where it does."""

from __future__ import annotations

import pytest

from loom_runtime.errors import InvalidRequestError
from loom_runtime.wire.chat_template import ChatTemplate

# A template in the style of many checkpoints: it knows three roles and refuses the rest.
STRICT = (
    "{% for m in messages %}"
    "{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
    "<{{ m['role'] }}>{{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
)
KNOWS_DEVELOPER = STRICT.replace("['system', 'user', 'assistant']",
                                 "['system', 'developer', 'user', 'assistant']")  # fmt: skip


def test_developer_renders_as_system_where_the_template_has_no_such_role() -> None:
    template = ChatTemplate(STRICT, {})
    developer = [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"}]
    system = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert (
        template.render(developer)
        == template.render(system)
        == ("<system>be brief\n<user>hi\n<assistant>")
    )


def test_developer_is_kept_where_the_template_knows_it() -> None:
    out = ChatTemplate(KNOWS_DEVELOPER, {}).render([{"role": "developer", "content": "x"}])
    assert out == "<developer>x\n<assistant>"


def test_an_unknown_role_is_still_the_templates_to_refuse() -> None:
    with pytest.raises(InvalidRequestError, match="unknown role tool"):
        ChatTemplate(STRICT, {}).render([{"role": "tool", "content": "x"}])
