"""Images: a data URL decoded with Pillow into RGB pixels under the pixel limit, then Gemma's resize and patches.

Decoding (api spec §4.3): the URL must be ``data:image/<png|jpeg|jpg|webp|gif>;base64,<base64>``; the bytes are
opened with Pillow restricted to those four formats, whatever subtype the URL names (a mislabelled PNG still reads
as a PNG; a BMP never reaches a decoder). ``Image.open`` reads only the header, so the size is checked against
``max_image_pixels`` **before** any pixel is decoded: a decompression bomb (a huge declared size in a tiny file)
is ``image_too_large`` without allocating its pixels. Reading and decoding are two steps (`read_image_part`, then
`decode_image`), so that a call's images can be counted and refused from their headers alone
(`spinf.media.items.decode_media`). Pillow's own bomb guard (``DecompressionBombError`` above
twice ``Image.MAX_IMAGE_PIXELS``, about 179 million pixels; left at Pillow's default, which is process-wide) stays
in place as a second net, refused with the same code: a ``max_image_pixels`` set above it is capped there. Its
warning is silenced because our limit decides. An animation is read as its first frame. Transparency is composited onto
white (as transformers' Gemma 4 processor does), 16-bit grayscale scaled to 8 bits, other modes converted to RGB.
A truncated or corrupt file is ``invalid_media`` (truncated images are never loaded half-way).

Gemma (engine spec A.14.2): `gemma_resize` resizes with Pillow's bicubic filter to `tokens.gemma_image_size`;
`gemma_patches` cuts the result into ``[N, 48*48*3]`` float32 in [0, 1], HWC order inside a block, blocks in raster
order.
"""

from __future__ import annotations

import contextlib
import io
import re
import warnings
from collections.abc import Callable, Iterator

import attrs
import numpy as np
from PIL import Image, UnidentifiedImageError

from spinf.errors import ApiError, bad_request
from spinf.media.payload import check_detail, decode_base64, invalid_media
from spinf.media.tokens import BLOCK, gemma_image_size

_DATA_URL = re.compile(r"^data:image/(png|jpeg|jpg|webp|gif);base64,")
_FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
_WHITE = (255, 255, 255, 255)

# Our max_image_pixels check runs right after the header is read; Pillow's warning for sizes above its own
# default would only repeat (or contradict) it.
warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)


Resize = Callable[[np.ndarray, str], np.ndarray]


@attrs.frozen(eq=False)
class ImageHeader:
    """An image part (or a video frame) read as far as its header: the file's bytes, the size it was sent at and the
    detail it is read at. What a call's images cost (tokens, pixels) follows from these, before a pixel is decoded."""

    data: bytes
    height: int
    width: int
    detail: str
    path: str

    @property
    def num_pixels(self) -> int:
        return self.height * self.width


@attrs.frozen(eq=False)
class DecodedImage:
    """An image part (or a video frame) decoded: RGB pixels, the size it was sent at and the detail it is read at.

    ``pixels`` are the decoded pixels, or already the model's resized ones when decoding was given a ``resize``;
    the token counts follow from ``height``, ``width`` (the sent size) and ``detail`` either way.
    """

    pixels: np.ndarray  # [rows, cols, 3] uint8
    height: int
    width: int
    detail: str
    path: str


def read_image_part(payload: dict, path: str, *, max_pixels: int, detail: str | None = None) -> ImageHeader:
    """An ``image_url`` payload (``{url, detail = "auto"}``) read as far as its header, its size checked against
    ``max_pixels``; ``detail`` overrides the payload's own."""
    if detail is None:
        detail = check_detail(payload, path, "auto")
    data = data_url_bytes(payload.get("url"), path)
    with _opened(data, path, max_pixels=max_pixels) as image:
        width, height = image.size
    return ImageHeader(data=data, height=height, width=width, detail=detail, path=path)


def decode_image(header: ImageHeader, *, max_pixels: int, resize: Resize | None = None) -> DecodedImage:
    """The pixels of an image read by `read_image_part`, resized at once with ``resize`` (`gemma_resize` for Gemma),
    so that a request of many large images or frames holds only their model-sized pixels (at most 1,120 blocks
    each), never all the sent ones."""
    pixels = decode_image_bytes(header.data, header.path, max_pixels=max_pixels)
    height, width = pixels.shape[:2]
    if resize is not None:
        pixels = resize(pixels, header.detail)
    return DecodedImage(pixels=pixels, height=height, width=width, detail=header.detail, path=header.path)


def decode_image_part(
    payload: dict, path: str, *, max_pixels: int, detail: str | None = None, resize: Resize | None = None
) -> DecodedImage:
    """An ``image_url`` payload read (`read_image_part`) and decoded (`decode_image`)."""
    header = read_image_part(payload, path, max_pixels=max_pixels, detail=detail)
    return decode_image(header, max_pixels=max_pixels, resize=resize)


def decode_data_url(url: object, path: str, *, max_pixels: int) -> np.ndarray:
    """The RGB pixels ``[height, width, 3]`` uint8 of an image data URL; refusals at ``path``."""
    return decode_image_bytes(data_url_bytes(url, path), path, max_pixels=max_pixels)


def data_url_bytes(url: object, path: str) -> bytes:
    """The file bytes of an image data URL; ``invalid_media`` at ``path`` when it is not one."""
    if not isinstance(url, str):
        raise invalid_media(path, "the image url must be a string")
    match = _DATA_URL.match(url)
    if match is None:
        raise invalid_media(path, "the image url must be a data URL, data:image/<png|jpeg|jpg|webp|gif>;base64,<data>")
    return decode_base64(url[match.end() :], path, "image data")


def decode_image_bytes(data: bytes, path: str, *, max_pixels: int) -> np.ndarray:
    """Pillow-decoded RGB pixels of a png, jpeg, webp or gif file, the size checked before the pixels."""
    with _opened(data, path, max_pixels=max_pixels) as image:
        try:
            image.load()  # the first frame only: an animation is never seeked
            if image.mode.startswith("I;16") or image.mode == "I":
                return _gray16(image)
            return np.asarray(_rgb(image), dtype=np.uint8)
        except (OSError, ValueError, SyntaxError, EOFError) as error:
            raise invalid_media(path, f"the image data cannot be decoded: {error}") from error


@contextlib.contextmanager
def _opened(data: bytes, path: str, *, max_pixels: int) -> Iterator[Image.Image]:
    """The Pillow image of ``data`` with only its header read, refused unless its size is within ``max_pixels``."""
    try:
        image = Image.open(io.BytesIO(data), formats=_FORMATS)
    except Image.DecompressionBombError as error:
        raise bad_request("image_too_large", path, f"the image is too large to decode: {error}") from error
    except UnidentifiedImageError as error:
        raise invalid_media(path, "the image data is not a png, jpeg, webp or gif image") from error
    except (OSError, ValueError, SyntaxError, EOFError) as error:
        # Pillow reports truncated, corrupt and unsupported variants with these (SyntaxError from some plugins).
        raise invalid_media(path, f"the image data cannot be decoded: {error}") from error
    with image:
        width, height = image.size
        if width * height > max_pixels:
            raise _too_large(path, width, height, max_pixels)
        yield image


def _too_large(path: str, width: int, height: int, max_pixels: int) -> ApiError:
    return bad_request(
        "image_too_large",
        path,
        f"the image is {width}x{height} = {width * height:,} pixels; the limit (max_image_pixels) is {max_pixels:,}",
    )


def _gray16(image: Image.Image) -> np.ndarray:
    """A 16-bit grayscale PNG scaled to 8 bits (65,535 -> 255) and repeated to RGB; Pillow's own conversion
    clips every value above 255 to white."""
    wide = np.asarray(image).astype(np.float64)
    gray = np.clip(np.rint(wide / 257), 0, 255).astype(np.uint8)
    return np.repeat(gray[:, :, None], 3, axis=2)


def _rgb(image: Image.Image) -> Image.Image:
    """RGB, with any transparency composited onto white."""
    if image.mode == "RGB":
        return image
    if "A" in image.getbands() or "transparency" in image.info:
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, _WHITE), rgba).convert("RGB")
    return image.convert("RGB")


def gemma_resize(pixels: np.ndarray, detail: str) -> np.ndarray:
    """The pixels resized (bicubic) to the Gemma size of A.14.2; unchanged when already that size."""
    return _bicubic(pixels, *gemma_image_size(pixels.shape[0], pixels.shape[1], detail))


def _bicubic(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    if pixels.shape[:2] == (height, width):
        return pixels
    return np.asarray(Image.fromarray(pixels).resize((width, height), Image.Resampling.BICUBIC))


def gemma_blocks(resized: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 48x48 blocks of resized pixels as ``[N, 48*48*3]`` uint8 (raster order, HWC inside a block) and each
    block's ``(column, row)`` ``[N, 2]`` int64: what the vision embedder reads, before the scaling to [0, 1]."""
    height, width = resized.shape[:2]
    if height % BLOCK or width % BLOCK:
        raise ValueError(f"the resized image is {height}x{width}, not a multiple of {BLOCK} a side")
    rows, cols = height // BLOCK, width // BLOCK
    blocks = resized.reshape(rows, BLOCK, cols, BLOCK, 3).transpose(0, 2, 1, 3, 4)  # [rows, cols, 48, 48, 3]
    grid = np.stack(np.meshgrid(np.arange(cols), np.arange(rows), indexing="xy"), axis=-1).reshape(-1, 2)
    return np.ascontiguousarray(blocks.reshape(rows * cols, BLOCK * BLOCK * 3)), grid.astype(np.int64)


def gemma_patches(resized: np.ndarray) -> np.ndarray:
    """``[N, 48*48*3]`` float32 in [0, 1] of resized pixels: blocks in raster order, HWC inside a block."""
    return gemma_blocks(resized)[0].astype(np.float32) / np.float32(255)


def gemma_image_resized(image: DecodedImage) -> np.ndarray:
    """An image's pixels at its Gemma size for its detail.

    The target size comes from the size the image was sent at: the Gemma size of an already resized image is
    not always itself (its blocks fit the budget with room to spare), so resized pixels are never resized again.
    """
    return _bicubic(image.pixels, *gemma_image_size(image.height, image.width, image.detail))


def gemma_image_patches(image: DecodedImage) -> np.ndarray:
    """An image's Gemma patches ``[N, 48*48*3]`` at its detail; N is its token count."""
    return gemma_patches(gemma_image_resized(image))
