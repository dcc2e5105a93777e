"""Images and video frames as the Qwen3.5 vision tower reads them (engine spec A.14.3).

An image is resized (bicubic, on its uint8 pixels) to the size of `spinf.media.tokens.qwen_image_size` for its
detail, scaled to ``(x / 255 - 0.5) / 0.5`` and cut into 16x16 patches, each duplicated on the temporal axis of 2
(a still frame fills the tower's temporal patch). The patches are ordered as transformers' Qwen-VL image processor
orders them: by 2x2 merge window in raster order, the window's four patches in raster order, each patch's values
channel, then time, then row, then column. The tower merges each window into one token, so an image of
``grid_h x grid_w`` patches is ``grid_h / 2 x grid_w / 2`` tokens.
"""

from __future__ import annotations

import attrs
import numpy as np
from PIL import Image

from spinf.errors import bad_request
from spinf.media.images import DecodedImage
from spinf.media.tokens import QWEN_BLOCK, qwen_image_size

PATCH = 16
TEMPORAL = 2
MERGE = 2
CHANNELS = 3


@attrs.frozen(eq=False)
class QwenVisionItem:
    """One image or video frame for the Qwen vision tower: ``patches`` [grid_h · grid_w, 3 · 2 · 16 · 16] float32 and
    its ``grid`` (1, grid_h, grid_w) of 16-px patches; ``rows`` x ``cols`` tokens after the 2x2 merge."""

    patches: np.ndarray
    grid: tuple[int, int, int]
    kind: str  # "image" or "video" (a frame)
    embedder = "vision"
    milliseconds = 0.0  # of sound: none (usage counts every item's)

    @property
    def rows(self) -> int:
        return self.grid[1] // MERGE

    @property
    def cols(self) -> int:
        return self.grid[2] // MERGE

    @property
    def num_tokens(self) -> int:
        return self.rows * self.cols

    @property
    def rope_shift(self) -> int:
        """How far every later token's rotary position moves back (A.14.3): the image spans ``max(rows, cols)``
        positions, not its token count."""
        return self.num_tokens - max(self.rows, self.cols)


def qwen_resize(pixels: np.ndarray, detail: str, path: str = "") -> np.ndarray:
    """The pixels resized to their Qwen size at ``detail``; unchanged when already that size. An aspect ratio over
    200 is a 400 ``invalid_media`` at ``path``."""
    try:
        height, width = qwen_image_size(pixels.shape[0], pixels.shape[1], detail)
    except ValueError as exc:
        raise bad_request("invalid_media", path, str(exc)) from exc
    return resize(pixels, height, width)


def qwen_image_resized(image: DecodedImage) -> np.ndarray:
    """An image's pixels at its Qwen size, from the size it was sent at (resized pixels are not resized again)."""
    try:
        height, width = qwen_image_size(image.height, image.width, image.detail)
    except ValueError as exc:
        raise bad_request("invalid_media", image.path, str(exc)) from exc
    return resize(image.pixels, height, width)


# Pixel values as transformers' PIL processor computes them: a float64 rescale by 1/255 cast to float32, then
# (x - 0.5) / 0.5 in float32. A uint8 has 256 values, so a table of them gives the same bits.
_NORMALISED = ((np.arange(256, dtype=np.float64) * (1 / 255)).astype(np.float32) - np.float32(0.5)) / np.float32(0.5)


def resize(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """RGB uint8 pixels [rows, cols, 3] resized to ``height`` x ``width`` with Pillow's bicubic filter on the uint8
    image, as transformers' PIL image processor resizes a uint8 image; unchanged when already that size (Pillow
    returns a copy then)."""
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != CHANNELS:
        raise ValueError(f"an image is RGB uint8 [rows, cols, 3], not {pixels.dtype} {list(pixels.shape)}")
    if pixels.shape[:2] == (height, width):
        return pixels
    return np.asarray(Image.fromarray(pixels).resize((width, height), Image.Resampling.BICUBIC))


def patchify(pixels: np.ndarray) -> tuple[np.ndarray, tuple[int, int, int]]:
    """The patches of resized RGB uint8 pixels [rows, cols, 3] (sides multiples of 32) and their grid ``(1, rows
    / 16, cols / 16)``: float32 [patches, 3 * 2 * 16 * 16] normalised to [-1, 1], in the order and layout of
    transformers' Qwen2-VL image processor (merge windows in raster order, the 2 x 2 patches of a window in raster
    order inside it; a patch channel-major, its frame written twice on the temporal axis)."""
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != CHANNELS:
        raise ValueError(f"an image is RGB uint8 [rows, cols, 3], not {pixels.dtype} {list(pixels.shape)}")
    height, width = pixels.shape[:2]
    if height % QWEN_BLOCK or width % QWEN_BLOCK or not height or not width:
        raise ValueError(f"the resized image is {height}x{width}, not a positive multiple of {QWEN_BLOCK} a side")
    rows, cols = height // PATCH, width // PATCH
    values = _NORMALISED[pixels]  # [height, width, 3] float32
    # [window row, patch row in window, y, window col, patch col in window, x, channel]
    grid = values.reshape(rows // MERGE, MERGE, PATCH, cols // MERGE, MERGE, PATCH, CHANNELS)
    grid = grid.transpose(0, 3, 1, 4, 6, 2, 5)  # [window row, window col, patch row, patch col, channel, y, x]
    frames = np.broadcast_to(grid[:, :, :, :, :, None], (*grid.shape[:5], TEMPORAL, PATCH, PATCH))
    return np.ascontiguousarray(frames.reshape(rows * cols, CHANNELS * TEMPORAL * PATCH * PATCH)), (1, rows, cols)


def qwen_item(resized: np.ndarray, kind: str) -> QwenVisionItem:
    patches, grid = patchify(resized)
    return QwenVisionItem(patches, grid, kind)
