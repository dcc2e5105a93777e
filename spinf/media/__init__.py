"""Media decoding and token accounting (engine spec A.14, api spec §4.3): pure Python, numpy, Pillow and PyAV.

Owns everything between a media part's JSON payload and the arrays the engine's embedders read: data URLs and
base64 checked, images decoded with Pillow under the pixel limit (read from the header first), Gemma's 48-pixel
resize and patches, audio decoded with PyAV into 16 kHz mono float32 under the duration limit, video frames and
their timestamps, and the token counts of each. Every refusal is an `ApiError` with the spec's code and the part's
param path. No torch, no trio (import-linter): decoding runs in a worker thread, off the event loop and the GPU
thread, and the engine imports the results.

    tokens.py   the token counts of A.14 as pure functions (Gemma image sizes, audio segments, timestamps)
    payload.py  the checks shared by the parts: base64, the detail value
    images.py   data URL -> RGB uint8 pixels; the Gemma resize and its [N, 48*48*3] patches
    audio.py    input_audio -> 16 kHz mono float32 samples, bounded; the per-input 600 s cut; 640-sample frames
    video.py    a video part -> its frames at the video's detail, the "mm:ss " texts before them
"""
