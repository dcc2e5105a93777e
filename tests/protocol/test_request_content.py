"""Building an input's content segments from its messages (api spec §4.3), and the messages form (§4.1)."""

from __future__ import annotations

import pytest

from spinf.protocol.request import parse_score_request
from spinf.protocol.types import MediaPart

ALL_MEDIA = frozenset({"image", "audio", "video"})
IMG1 = {"url": "data:image/png;base64,AA=="}
IMG2 = {"url": "data:image/jpeg;base64,BB==", "detail": "low"}
AUDIO = {"data": "AA==", "format": "wav"}
VIDEO = {"frames": [{"t": 0, "image_url": IMG1}], "detail": "low"}


def text(s: str) -> dict:
    return {"type": "text", "text": s}


def image(payload: dict) -> dict:
    return {"type": "image_url", "image_url": payload}


def segments(*messages: dict) -> tuple:
    req = parse_score_request({"inputs": [{"id": "i", "messages": list(messages)}]}, model_media=ALL_MEDIA)
    return req.inputs[0].segments


def at(m: int, k: int) -> str:
    return f"inputs.0.messages.{m}.content.{k}"


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([], ()),
        ([{"content": "hello"}], ("hello",)),
        ([{"content": ""}], ()),
        ([{"role": "system", "content": "a"}, {"role": "user", "content": "b"}], ("a\n\nb",)),
        ([{"content": [text("a"), text("b"), text(""), text("c")]}], ("abc",)),
        ([{"content": "a"}, {"content": [text("b"), text("c")]}, {"content": "d"}], ("a\n\nbc\n\nd",)),
        # every message is joined, an empty one too: the blank lines are content
        ([{"content": "a"}, {"content": []}, {"content": "b"}], ("a\n\n\n\nb",)),
        ([{"content": ""}, {"content": "b"}], ("\n\nb",)),
    ],
)
def test_text_is_joined_and_merged(messages, expected):
    assert segments(*messages) == expected


def test_images_move_to_the_front_in_order_and_the_text_around_them_merges():
    got = segments(
        {"content": [text("look: "), image(IMG1), text("and")]},
        {"content": [image(IMG2), text("done")]},
    )
    assert got == (
        MediaPart(kind="image", path=at(0, 1), payload=IMG1),
        MediaPart(kind="image", path=at(1, 0), payload=IMG2),
        "look: and\n\ndone",
    )


def test_an_image_alone_leaves_no_empty_text():
    assert segments({"content": [image(IMG1)]}) == (MediaPart(kind="image", path=at(0, 0), payload=IMG1),)


def test_audio_and_video_stay_in_place():
    got = segments(
        {"content": [text("hear "), {"type": "input_audio", "input_audio": AUDIO}, text(" then")]},
        {"content": [image(IMG1), {"type": "video", "video": VIDEO}]},
    )
    assert got == (
        MediaPart(kind="image", path=at(1, 0), payload=IMG1),
        "hear ",
        MediaPart(kind="audio", path=at(0, 1), payload=AUDIO),
        " then\n\n",
        MediaPart(kind="video", path=at(1, 1), payload=VIDEO),
    )


def test_the_messages_form_is_one_input_named_0():
    req = parse_score_request(
        {"messages": [{"role": "user", "content": [text("hi "), image(IMG1)]}], "inputs": None},
        model_media=ALL_MEDIA,
    )
    assert req.messages_form
    [inp] = req.inputs
    assert (inp.id, inp.path, inp.query_ids, inp.queries, inp.parameters) == ("0", "inputs.0", None, (), None)
    assert inp.segments == (MediaPart(kind="image", path=at(0, 1), payload=IMG1), "hi ")


def test_the_messages_form_reports_content_errors_under_inputs_0(refused):
    data = {"messages": [{"content": "a"}, {"content": [text("b"), {"type": "file"}]}]}
    refused(lambda: parse_score_request(data), "unsupported_content", "inputs.0.messages.1.content.1")
