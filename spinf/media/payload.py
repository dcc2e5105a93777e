"""The checks every media payload shares: its base64 text and its ``detail`` value (api spec §4.3).

Bad media data is ``400 invalid_media`` at the part's param path (``inputs.<i>.messages.<m>.content.<k>``, or
``….video.frames.<j>`` for one frame). Base64 is read strictly: the standard alphabet, padding required, no
whitespace; anything else is not the spec's ``base64`` and is refused rather than guessed at.
"""

from __future__ import annotations

import base64
import binascii

from spinf.errors import ApiError, bad_request
from spinf.media.tokens import DETAILS


def invalid_media(path: str, message: str) -> ApiError:
    return bad_request("invalid_media", path, message)


def decode_base64(text: object, path: str, what: str) -> bytes:
    """The bytes of a strict base64 string; ``invalid_media`` when it is not one or decodes to nothing."""
    if not isinstance(text, str):
        raise invalid_media(path, f"the {what} must be a base64 string")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as error:
        raise invalid_media(path, f"the {what} is not valid base64: {error}") from error
    if not data:
        raise invalid_media(path, f"the {what} is empty")
    return data


def check_detail(payload: dict, path: str, default: str) -> str:
    """The payload's ``detail`` (``low``, ``auto`` or ``high``), or ``default`` when it is absent."""
    detail = payload.get("detail", default)
    if detail not in DETAILS:
        raise invalid_media(path, f"detail must be one of {', '.join(DETAILS)}, not {detail!r}")
    return detail
