"""Image and video bodies: sizes parse or say the syntax; ranges are 400s naming the field;
frames come from num_frames or seconds x fps + 1; prompts truncate to the encoder's length;
n images get consecutive seeds; another model's name is a 404; a field the contract refuses or
does not name is a 400 naming it."""

from __future__ import annotations

import pytest

from loom_runtime.errors import InvalidRequestError, ModelNotFoundError
from loom_runtime.serve.diffusion.protocol import (
    ImageGenerationRequest,
    PromptSettings,
    VideoGenerationRequest,
    diffusion_requests,
    parse_media,
    parse_size,
)


class Chars:
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]


@pytest.mark.parametrize("size", ["32", "x32", "32x", "0x32", "32x32x1", "-32x32", " 32x32"])
def test_bad_sizes_name_the_syntax(size: str) -> None:
    with pytest.raises(InvalidRequestError, match="WIDTHxHEIGHT") as err:
        parse_size(size)
    assert err.value.param == "size"


def test_sizes_are_width_by_height() -> None:
    assert parse_size("48x32") == (48, 32)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"prompt": "p", "num_inference_steps": -1}', "num_inference_steps"),
        (b'{"prompt": "p", "n": 11}', "n"),
        (b'{"prompt": ""}', "prompt"),
        (b'{"prompt": "p", "seed": -1}', "seed"),
        (b'{"prompt": "p", "response_format": "url"}', "response_format"),
    ],
)
def test_out_of_range_image_fields_are_400s_naming_the_field(body: bytes, param: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        parse_media(ImageGenerationRequest, body)
    assert err.value.param == param


@pytest.mark.parametrize(
    ("cls", "body", "param"),
    [
        (ImageGenerationRequest, b'{"prompt": "p", "quality": "hd"}', "quality"),
        (ImageGenerationRequest, b'{"prompt": "p", "frobnicate": 1}', "frobnicate"),
        (VideoGenerationRequest, b'{"prompt": "p", "input_reference": "x"}', "input_reference"),
        (VideoGenerationRequest, b'{"prompt": "p", "quality": "auto"}', "quality"),
    ],
)
def test_fields_not_honoured_are_400s_naming_them(
    cls: type[ImageGenerationRequest | VideoGenerationRequest], body: bytes, param: str
) -> None:
    with pytest.raises(InvalidRequestError) as err:
        parse_media(cls, body)
    assert err.value.param == param
    accepted = parse_media(
        ImageGenerationRequest, b'{"prompt": "p", "quality": "auto", "user": "u"}'
    )
    assert accepted.prompt == "p"


def test_video_frames_come_from_num_frames_or_seconds() -> None:
    assert parse_media(VideoGenerationRequest, b'{"prompt": "p", "num_frames": 9}').frames() == 9
    body = parse_media(VideoGenerationRequest, b'{"prompt": "p", "seconds": "2", "fps": 8}')
    assert body.frames() == 17


def test_n_images_get_consecutive_seeds_and_truncated_prompts() -> None:
    body = parse_media(ImageGenerationRequest, b'{"prompt": "abcdef", "n": 3, "size": "32x16"}')
    reqs = diffusion_requests(body, ["a", "b", "c"], 1, 5, Chars(), PromptSettings("m", 4))
    assert [r.seed for r in reqs] == [5, 6, 7]
    assert reqs[0].prompt_ids == (97, 98, 99, 100)
    assert (reqs[0].width, reqs[0].height) == (32, 16)


def test_another_models_name_is_not_found() -> None:
    body = parse_media(ImageGenerationRequest, b'{"prompt": "p", "model": "x"}')
    with pytest.raises(ModelNotFoundError, match="'x'"):
        diffusion_requests(body, ["a"], 1, 0, Chars(), PromptSettings("m", 4))
