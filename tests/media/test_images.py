"""Image parts (spinf.media.images): data URLs, Pillow decoding under the pixel limit, the Gemma resize and patches.

Every hostile file is made here and must be refused (or read) within a fraction of a second, with the 400 code of
api spec §4.3 and the part's param path.
"""

from __future__ import annotations

import io
import re
import struct
import time
import zlib

import numpy as np
import pytest
from PIL import Image

from spinf.errors import ApiError
from spinf.media.images import decode_data_url, decode_image_part, gemma_image_patches, gemma_patches, gemma_resize
from spinf.media.tokens import DETAIL_TOKENS, gemma_image_size, gemma_image_tokens
from tests.media.fixtures import data_url, image_bytes, noise_image, png_header_only, png_rows

PATH = "inputs.0.messages.0.content.1"
LIMIT = 50_000_000


def refused(url: object, code: str, match: str, *, max_pixels: int = LIMIT) -> None:
    started = time.monotonic()
    with pytest.raises(ApiError) as caught:
        decode_data_url(url, PATH, max_pixels=max_pixels)
    assert time.monotonic() - started < 2
    error = caught.value
    assert (error.status, error.code, error.param) == (400, code, PATH)
    assert re.match(match, error.message), error.message


# Decoding


@pytest.mark.parametrize("subtype", ["png", "webp"])
def test_lossless_formats_decode_to_the_exact_pixels(subtype):
    pixels = noise_image(37, 53)
    save = {"lossless": True} if subtype == "webp" else {}
    decoded = decode_data_url(data_url(image_bytes(pixels, subtype, **save), subtype), PATH, max_pixels=LIMIT)
    assert decoded.dtype == np.uint8 and decoded.shape == (37, 53, 3)
    np.testing.assert_array_equal(decoded, pixels)


@pytest.mark.parametrize("subtype", ["jpeg", "jpg"])
def test_jpeg_decodes_close_to_the_pixels(subtype):
    pixels = np.full((40, 60, 3), (200, 30, 90), np.uint8)
    decoded = decode_data_url(data_url(image_bytes(pixels, subtype, quality=95), subtype), PATH, max_pixels=LIMIT)
    assert decoded.shape == (40, 60, 3)
    assert np.abs(decoded.astype(int) - pixels).max() <= 4


def test_a_gif_animation_reads_its_first_frame():
    first = Image.new("RGB", (20, 10), (255, 0, 0))
    second = Image.new("RGB", (20, 10), (0, 0, 255))
    data = image_bytes(first, "gif", save_all=True, append_images=[second], duration=100, loop=0)
    decoded = decode_data_url(data_url(data, "gif"), PATH, max_pixels=LIMIT)
    assert decoded.shape == (10, 20, 3)
    assert (decoded == (255, 0, 0)).all()


def test_an_animated_webp_reads_its_first_frame():
    first = Image.new("RGB", (16, 16), (0, 255, 0))
    second = Image.new("RGB", (16, 16), (0, 0, 0))
    data = image_bytes(first, "webp", save_all=True, append_images=[second], lossless=True)
    assert (decode_data_url(data_url(data, "webp"), PATH, max_pixels=LIMIT) == (0, 255, 0)).all()


def test_transparency_is_composited_onto_white():
    rgba = np.zeros((4, 4, 4), np.uint8)
    rgba[:2] = (10, 20, 30, 255)  # opaque top half, fully transparent bottom half
    rgba[2:] = (10, 20, 30, 0)
    decoded = decode_data_url(data_url(image_bytes(rgba)), PATH, max_pixels=LIMIT)
    assert (decoded[:2] == (10, 20, 30)).all() and (decoded[2:] == 255).all()


@pytest.mark.parametrize("mode", ["L", "P", "1", "LA", "CMYK"])
def test_other_modes_become_rgb(mode):
    image = Image.fromarray(noise_image(8, 8)).convert(mode)
    fmt = "jpeg" if mode == "CMYK" else "png"
    decoded = decode_data_url(data_url(image_bytes(image, fmt), fmt), PATH, max_pixels=LIMIT)
    assert decoded.shape == (8, 8, 3) and decoded.dtype == np.uint8


def test_16_bit_grayscale_is_scaled_to_8_bits():
    wide = (np.arange(64 * 64, dtype=np.uint32).reshape(64, 64) * 16).astype(np.uint16)
    decoded = decode_data_url(data_url(image_bytes(Image.fromarray(wide))), PATH, max_pixels=LIMIT)
    assert decoded.shape == (64, 64, 3)
    np.testing.assert_array_equal(decoded[:, :, 0], np.rint(wide / 257).astype(np.uint8))
    assert (decoded[:, :, 0] == decoded[:, :, 2]).all()


def test_the_url_subtype_need_not_match_the_format():
    pixels = noise_image(5, 5)
    decoded = decode_data_url(data_url(image_bytes(pixels), "jpeg"), PATH, max_pixels=LIMIT)
    np.testing.assert_array_equal(decoded, pixels)


def test_an_image_part_reads_its_detail_default_auto():
    url = data_url(image_bytes(noise_image(3, 4)))
    assert decode_image_part({"url": url}, PATH, max_pixels=LIMIT).detail == "auto"
    image = decode_image_part({"url": url, "detail": "high"}, PATH, max_pixels=LIMIT)
    assert (image.detail, image.height, image.width, image.path) == ("high", 3, 4, PATH)
    with pytest.raises(ApiError) as caught:
        decode_image_part({"url": url, "detail": "ultra"}, PATH, max_pixels=LIMIT)
    assert (caught.value.code, caught.value.param) == ("invalid_media", PATH)
    assert caught.value.message == "detail must be one of low, auto, high, not 'ultra'"


# Refusals: the URL and the base64


@pytest.mark.parametrize(
    "url",
    [
        None,
        42,
        "https://example.com/cat.png",
        "data:image/bmp;base64,AAAA",
        "data:image/svg+xml;base64,AAAA",
        "data:image/png,rawbytes",
        "DATA:image/png;base64,AAAA",
        " data:image/png;base64,AAAA",
    ],
)
def test_urls_that_are_not_image_data_urls_are_invalid_media(url):
    message = r"^the image url must be (a string|a data URL, data:image/<png\|jpeg\|jpg\|webp\|gif>;base64,<data>)$"
    refused(url, "invalid_media", message)


@pytest.mark.parametrize("payload", ["", "AAA", "AA AA", "AAAA\n", "*&^%", "QUJD=QUJD"])
def test_bad_base64_is_invalid_media(payload):
    message = r"^the image data (is not valid base64: .*|is empty)$"
    refused(f"data:image/png;base64,{payload}", "invalid_media", message)


# Refusals: hostile and broken files


@pytest.mark.parametrize("max_pixels", [LIMIT, 10**12])
def test_a_decompression_bomb_is_refused_from_its_header(max_pixels):
    # 100,000 x 100,000 declared in a file of a few dozen bytes: Pillow's own guard fires inside Image.open, and
    # still does when max_image_pixels is set above it.
    bomb = data_url(png_header_only(100_000, 100_000, zlib.compress(b"\0" * 100)))
    refused(bomb, "image_too_large", r"^the image is too large to decode: .*", max_pixels=max_pixels)


def test_a_declared_size_over_max_image_pixels_is_refused_before_decoding():
    bomb = png_header_only(10_000, 6_000, zlib.compress(b"\0" * 100))  # 60 million pixels, no data
    refused(
        data_url(bomb),
        "image_too_large",
        r"^the image is 10000x6000 = 60,000,000 pixels; the limit \(max_image_pixels\) is 50,000,000$",
    )


def test_max_image_pixels_is_inclusive():
    data = data_url(png_rows(10, 10))
    assert decode_data_url(data, PATH, max_pixels=100).shape == (10, 10, 3)
    refused(data, "image_too_large", r"^the image is 10x10 = 100 pixels; .* is 99$", max_pixels=99)


def test_a_gif_frame_larger_than_its_screen_counts_its_own_size():
    # A 1 x 1 logical screen whose first frame is 9,000 x 9,000 (81 million pixels): Pillow widens the size.
    screen = b"GIF89a" + struct.pack("<HHBBB", 1, 1, 0x80, 0, 0) + b"\0\0\0\xff\xff\xff"
    frame = b"," + struct.pack("<HHHHB", 0, 0, 9_000, 9_000, 0) + b"\x02\x02\x44\x01\x00;"
    refused(data_url(screen + frame, "gif"), "image_too_large", r"^the image is 9000x9000 = 81,000,000 pixels")


@pytest.mark.parametrize(("width", "height"), [(1_000_000, 1), (1, 1_000_000)])
def test_a_one_pixel_by_a_million_image_reads_within_bounds(width, height):
    # A million pixels is under the limit: it decodes (3 MB) and resizes to one row of 31 blocks at auto.
    started = time.monotonic()
    image = decode_image_part({"url": data_url(png_rows(width, height))}, PATH, max_pixels=LIMIT)
    patches = gemma_image_patches(image)
    assert time.monotonic() - started < 2
    assert patches.shape == (31, 48 * 48 * 3)
    refused(data_url(png_rows(width, height)), "image_too_large", r"^the image is .*", max_pixels=999_999)


@pytest.mark.parametrize("subtype", ["png", "jpeg", "webp", "gif"])
@pytest.mark.parametrize("keep", [0.1, 0.5, 0.9])
def test_a_truncated_file_is_invalid_media(subtype, keep):
    data = image_bytes(noise_image(64, 64), subtype)
    refused(data_url(data[: int(len(data) * keep)], subtype), "invalid_media", r"^the image data (is not|cannot be)")


def test_a_png_header_without_pixel_data_is_invalid_media():
    refused(data_url(png_header_only(64, 64)), "invalid_media", r"^the image data cannot be decoded: .*truncated")


@pytest.mark.parametrize(
    "data",
    [b"GIF89a", b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff\xe0", b"RIFF\0\0\0\0WEBP", b"not an image at all", bytes(1000)],
)
def test_garbage_is_invalid_media(data):
    refused(data_url(data), "invalid_media", r"^the image data (is not|cannot be)")


def test_formats_outside_the_four_never_reach_a_decoder():
    for fmt in ("BMP", "TIFF", "ICO"):
        image = Image.fromarray(noise_image(16, 16))
        out = io.BytesIO()
        image.save(out, format=fmt)
        refused(data_url(out.getvalue()), "invalid_media", r"^the image data is not a png, jpeg, webp or gif image$")


def test_a_zlib_bomb_in_a_text_chunk_is_invalid_media():
    # A zTXt chunk that inflates to 20 MB in a file of a few kB: Pillow stops at its text chunk limit (1 MB).
    body = b"k\0\0" + zlib.compress(b"a" * 20_000_000, 9)
    ztxt = struct.pack(">I", len(body)) + b"zTXt" + body + struct.pack(">I", zlib.crc32(b"zTXt" + body))
    data = png_rows(4, 4)
    data = data[:33] + ztxt + data[33:]  # right after the IHDR chunk
    refused(data_url(data), "invalid_media", r"^the image data cannot be decoded: Decompressed data too large")


# The Gemma resize and patches


@pytest.mark.parametrize("detail", ["low", "auto", "high"])
@pytest.mark.parametrize(("height", "width"), [(1, 1), (37, 999), (100, 200), (480, 336), (55, 154), (721, 1283)])
def test_resize_and_patches_have_the_formula_sizes(height, width, detail):
    resized = gemma_resize(noise_image(height, width), detail)
    assert resized.shape == (*gemma_image_size(height, width, detail), 3) and resized.dtype == np.uint8
    patches = gemma_patches(resized)
    assert patches.shape == (gemma_image_tokens(height, width, detail), 48 * 48 * 3)
    assert patches.dtype == np.float32 and 0 <= patches.min() and patches.max() <= 1


def test_patches_are_hwc_blocks_in_raster_order():
    rows, cols = 2, 3
    pixels = np.zeros((rows * 48, cols * 48, 3), np.uint8)
    for r in range(rows):
        for c in range(cols):
            pixels[r * 48 : (r + 1) * 48, c * 48 : (c + 1) * 48] = (r * 3 + c) * 10
    pixels[0, 1] = (1, 2, 3)  # row 0, column 1 of block 0
    pixels[1, 0] = (4, 5, 6)  # row 1, column 0 of block 0
    patches = gemma_patches(pixels) * 255
    np.testing.assert_allclose(patches[:, 3 * 48 * 3 :].mean(axis=1), [0, 10, 20, 30, 40, 50], atol=1e-4)
    np.testing.assert_allclose(patches[0, 3:6], [1, 2, 3], atol=1e-4)  # HWC: pixel (0, 1) follows pixel (0, 0)
    np.testing.assert_allclose(patches[0, 48 * 3 : 48 * 3 + 3], [4, 5, 6], atol=1e-4)  # the next row after 48


def test_an_image_already_at_its_size_is_not_resampled():
    pixels = noise_image(480, 336)
    assert gemma_resize(pixels, "low") is pixels


@pytest.mark.parametrize(("height", "width", "detail"), [(55, 154, "low"), (100, 200, "auto"), (3, 2_000, "high")])
def test_resizing_while_decoding_gives_the_same_patches(height, width, detail):
    # 55 x 154 at low resizes to 192 x 672, whose own Gemma size is 192 x 720: resized pixels are never resized
    # again, the target always comes from the size the image was sent at.
    payload = {"url": data_url(image_bytes(noise_image(height, width))), "detail": detail}
    sent = decode_image_part(payload, PATH, max_pixels=LIMIT)
    resized = decode_image_part(payload, PATH, max_pixels=LIMIT, resize=gemma_resize)
    assert resized.pixels.shape == (*gemma_image_size(height, width, detail), 3)
    assert (resized.height, resized.width) == (sent.height, sent.width) == (height, width)
    np.testing.assert_array_equal(gemma_image_patches(resized), gemma_image_patches(sent))
    assert gemma_image_patches(resized).shape[0] == gemma_image_tokens(height, width, detail)


def test_patches_need_whole_blocks():
    with pytest.raises(ValueError, match=r"^the resized image is 48x50, not a multiple of 48 a side$"):
        gemma_patches(np.zeros((48, 50, 3), np.uint8))


# Against transformers' Gemma 4 image processor (the PIL one): the same sizes, pixels and patches.

COMPARED = [(100, 200), (480, 336), (1440, 1008), (37, 999), (1, 1), (55, 154), (110, 77), (721, 1283), (999, 37)]


@pytest.fixture(scope="module")
def transformers_gemma4():
    module = pytest.importorskip("transformers.models.gemma4.image_processing_pil_gemma4")
    return module


@pytest.mark.parametrize("detail", ["low", "auto", "high"])
@pytest.mark.parametrize(("height", "width"), COMPARED)
def test_sizes_equal_transformers(transformers_gemma4, height, width, detail):
    soft = DETAIL_TOKENS[detail]
    # Its defaults: 16-pixel patches pooled 3 x 3, so max_patches = 9 * soft and the side multiple is 48.
    expected = transformers_gemma4.get_aspect_ratio_preserving_size(height, width, 16, 9 * soft, 3)
    assert gemma_image_size(height, width, detail) == expected


@pytest.mark.parametrize("detail", ["low", "auto", "high"])
@pytest.mark.parametrize(("height", "width"), COMPARED)
def test_patches_equal_transformers(transformers_gemma4, height, width, detail):
    pixels = noise_image(height, width, seed=height * width)
    soft = DETAIL_TOKENS[detail]
    # patch_size 48 with no pooling cuts its patches as our blocks: the same sizes, [N, 48*48*3] HWC raster.
    processor = transformers_gemma4.Gemma4ImageProcessorPil(patch_size=48, pooling_kernel_size=1, max_soft_tokens=soft)
    out = processor(images=[Image.fromarray(pixels)], return_tensors=None, input_data_format="channels_last")
    count = out["num_soft_tokens_per_image"][0]
    ours = gemma_image_patches(decode_image_part({"url": data_url(image_bytes(pixels))}, PATH, max_pixels=LIMIT))
    ours = ours if detail == "auto" else gemma_patches(gemma_resize(pixels, detail))
    assert ours.shape == (count, 48 * 48 * 3)
    np.testing.assert_allclose(ours, np.asarray(out["pixel_values"][0][:count]), rtol=0, atol=1e-6)


def test_sizes_equal_transformers_over_a_sweep(transformers_gemma4):
    # 3,000 fixed random sizes from 1 to 20,000 pixels a side, at each detail: the same size as transformers',
    # except where a side floors to 0; there one row of 48 both, the spec capping the other side at floor(soft / 9)
    # blocks where transformers caps it at soft blocks.
    sides = np.exp(np.random.default_rng(16).uniform(0, np.log(20_000), (3_000, 2))).astype(int)
    same = fallbacks = 0
    for height, width in sides.tolist():
        for detail, soft in DETAIL_TOKENS.items():
            theirs = transformers_gemma4.get_aspect_ratio_preserving_size(height, width, 16, 9 * soft, 3)
            ours = gemma_image_size(height, width, detail)
            if ours == theirs:
                same += 1
                continue
            fallbacks += 1
            assert min(ours) == min(theirs) == 48, (height, width, detail)
            assert max(ours) == min(max(theirs), soft // 9 * 48), (height, width, detail)
    assert same > 7_000 and fallbacks > 1_000


@pytest.mark.parametrize("detail", ["low", "auto", "high"])
def test_extreme_aspect_ratios_differ_from_transformers_as_the_spec_says(transformers_gemma4, detail):
    """The spec caps the one-row fallback at floor(soft / 9) blocks; transformers (5.x) at soft blocks."""
    soft = DETAIL_TOKENS[detail]
    assert gemma_image_size(1, 100_000, detail) == (48, soft // 9 * 48)
    assert transformers_gemma4.get_aspect_ratio_preserving_size(1, 100_000, 16, 9 * soft, 3) == (48, soft * 48)
