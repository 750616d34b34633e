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


THINKS = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>"
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}"
    "{% endif %}"
)


def test_chat_template_kwargs_reach_the_template_and_cannot_set_its_own_variables() -> None:
    template = ChatTemplate(THINKS, {"bos_token": "<s>"})
    hi = [{"role": "user", "content": "hi"}]
    assert template.render(hi) == "<user>hi<assistant>"
    assert template.render(hi, extra={"enable_thinking": False}) == (
        "<user>hi<assistant><think></think>"
    )
    for clash in ("messages", "tools", "add_generation_prompt", "bos_token"):
        with pytest.raises(InvalidRequestError) as err:
            template.render(hi, extra={clash: 1})
        assert err.value.param == "chat_template_kwargs" and clash in str(err.value)
