"""Figures written small: :func:`small_png` re-encodes a PNG as a palette image of at most
:data:`MAX_BYTES` (the most a figure under ``docs/`` may weigh)."""
from __future__ import annotations

import io

from coevo_jax.files import atomic_write_bytes

MAX_BYTES = 150_000
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def small_png(path: str, max_bytes: int = MAX_BYTES) -> str:
    """Re-encode the PNG at ``path`` with a palette (256, 64, 32, 16 colours, then 0.9x fewer pixels a try) until it
    weighs at most ``max_bytes``; a file that is not a PNG is left as it is. Returns ``path``."""
    from PIL import Image  # Pillow, matplotlib's dependency (report extra): imported on use

    with open(path, "rb") as f:
        raw = f.read()
    if not raw.startswith(PNG_SIGNATURE):
        return path
    with Image.open(io.BytesIO(raw)) as im:  # transparent pixels onto white, as the page shows them
        rgb = Image.alpha_composite(Image.new("RGBA", im.size, "white"), im.convert("RGBA")).convert("RGB")
    octree = Image.Quantize.FASTOCTREE
    tries = [(256, Image.Quantize.MEDIANCUT), (64, octree), (32, octree), (16, octree)]
    while True:
        for colors, method in tries:
            buf = io.BytesIO()
            rgb.quantize(colors, method, dither=Image.Dither.NONE).save(buf, "PNG", optimize=True)
            if buf.tell() <= max_bytes:
                break
        if buf.tell() <= max_bytes or min(rgb.size) < 100:
            break
        rgb = rgb.resize((round(rgb.width * 0.9), round(rgb.height * 0.9)), Image.Resampling.BOX)
        tries = tries[-1:]
    if buf.tell() < len(raw):
        atomic_write_bytes(path, buf.getvalue())
    return path
