"""Reference images for tests/c/test_image.c and tests/lua/test_image.lua.

Writes small PNG, JPEG and WebP files of odd sizes (one per format and mode)
into tests/data/image/, each with NAME.rgb beside it: the pixels Pillow
decodes, as Image.open(NAME).convert("RGB") gives them (what kohya's
sd-scripts load), H*W*3 raw bytes. manifest.txt lists them:
"NAME WIDTH HEIGHT FORMAT TOLERANCE", TOLERANCE the largest difference per
8-bit sample a decoder may show (0: exact). Exceptions, said in manifest:
- 16-bit gray PNG: Pillow's convert("RGB") of mode I;16 clips values to 255,
  so its reference is the high byte of each sample (what ckrun decodes, and
  what Pillow itself keeps for 16-bit RGB);
- cmyk.jpg has no .rgb: it must be refused;
- ztxt_bomb.png (not in the manifest): text chunks that inflate to 64 MiB.
PNGs Pillow cannot write (16-bit RGB and RGBA, Adam7 interlaced) are
encoded here by hand (zlib, filter 0) and decoded by Pillow for the
reference. Run: /work/venv-ref/bin/python tests/ref/make_image_ref.py
"""
import io
import os
import struct
import sys
import zlib

import numpy as np
import PIL
import PIL.features
from PIL import Image, PngImagePlugin

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "image")
rng = np.random.default_rng(7)


def picture(h, w, c, depth=8):
    """a smooth gradient with noise: a photo-like image, not pure noise"""
    y, x = np.mgrid[0:h, 0:w]
    top = (1 << depth) - 1
    planes = []
    for k in range(c):
        base = (x * (k + 1) * 37 + y * (3 - k % 3) * 53) % (top + 1)
        noise = rng.integers(-top // 8, top // 8 + 1, size=(h, w))
        planes.append(np.clip(base + noise, 0, top))
    a = np.stack(planes, axis=-1)
    return a.astype(np.uint16 if depth == 16 else np.uint8)


def chunk(kind, data):
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)


ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]


def png_by_hand(a, color, depth, interlace):
    """an 8- or 16-bit PNG of samples a [H, W, C], every scanline filter 0"""
    h, w = a.shape[:2]
    be = a.astype(">u2") if depth == 16 else a.astype(np.uint8)

    def lines(img):
        return b"".join(b"\0" + row.tobytes() for row in img)

    if interlace:
        raw = b""
        for x0, y0, dx, dy in ADAM7:
            sub = be[y0::dy, x0::dx]
            if sub.shape[0] and sub.shape[1]:
                raw += lines(sub)
    else:
        raw = lines(be)
    ihdr = struct.pack(">IIBBBBB", w, h, depth, color, 0, 0, 1 if interlace else 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


manifest = []


def save_ref(name, data, ref, fmt, tol, note=""):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)
    if ref is not None:
        assert ref.dtype == np.uint8 and ref.ndim == 3 and ref.shape[2] == 3
        with open(os.path.join(OUT, name + ".rgb"), "wb") as f:
            f.write(ref.tobytes())
    h, w = (ref.shape[:2] if ref is not None else Image.open(io.BytesIO(data)).size[::-1])
    manifest.append(f"{name} {w} {h} {fmt} {tol}" + (f" # {note}" if note else ""))


def pillow_rgb(data):
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def by_pillow(name, img, fmt, tol, note="", **kw):
    b = io.BytesIO()
    img.save(b, format={"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}[fmt], **kw)
    data = b.getvalue()
    save_ref(name, data, pillow_rgb(data), fmt, tol, note)


def main():
    os.makedirs(OUT, exist_ok=True)
    for f in os.listdir(OUT):
        os.remove(os.path.join(OUT, f))

    # PNG through Pillow: each mode it writes
    by_pillow("rgb8.png", Image.fromarray(picture(11, 17, 3), "RGB"), "png", 0)
    by_pillow("rgba8.png", Image.fromarray(picture(9, 13, 4), "RGBA"), "png", 0, "alpha dropped")
    by_pillow("gray8.png", Image.fromarray(picture(11, 17, 1)[:, :, 0], "L"), "png", 0)
    by_pillow("gray_alpha.png", Image.fromarray(picture(7, 11, 2), "LA"), "png", 0, "alpha dropped")
    by_pillow("gray1.png", Image.fromarray(picture(5, 19, 1)[:, :, 0] > 100).convert("1"), "png", 0, "1-bit")
    pal = Image.fromarray(picture(9, 15, 3), "RGB").quantize(colors=200)
    by_pillow("palette8.png", pal, "png", 0)
    pal16 = Image.fromarray(picture(9, 15, 3), "RGB").quantize(colors=16)
    by_pillow("palette4_trns.png", pal16, "png", 0, "4-bit palette with tRNS, ignored", bits=4,
              transparency=3)
    info = PngImagePlugin.PngInfo()
    info.add_text("parameters", "a photo of a cat, Steps: 20")
    info.add_text("Comment", "caf\u00e9 \u2603", zip=False)  # not Latin-1: Pillow writes iTXt
    info.add_text("Software", "Pillow", zip=True)  # zTXt
    by_pillow("text.png", Image.fromarray(picture(5, 7, 3), "RGB"), "png", 0, "text chunks", pnginfo=info)

    # PNG by hand: 16-bit and interlaced
    a16 = picture(11, 17, 3, 16)
    d = png_by_hand(a16, 2, 16, False)
    save_ref("rgb16.png", d, pillow_rgb(d), "png", 0, "16-bit RGB: the high byte")
    a16a = picture(7, 9, 4, 16)
    d = png_by_hand(a16a, 6, 16, True)
    save_ref("rgba16_interlaced.png", d, pillow_rgb(d), "png", 0, "16-bit RGBA, Adam7")
    g16 = picture(11, 17, 1, 16)
    d = png_by_hand(g16, 0, 16, False)
    hi = (g16[:, :, 0] >> 8).astype(np.uint8)
    save_ref("gray16.png", d, np.stack([hi, hi, hi], axis=-1), "png", 0,
             "16-bit gray: the high byte (Pillow's convert clips I;16 at 255)")
    d = png_by_hand(picture(13, 19, 3), 2, 8, True)
    save_ref("rgb8_interlaced.png", d, pillow_rgb(d), "png", 0, "Adam7")
    d = png_by_hand(picture(3, 5, 1), 0, 8, True)
    save_ref("gray8_interlaced_tiny.png", d, pillow_rgb(d), "png", 0, "Adam7, passes left empty")

    # 16 zTXt chunks that inflate to 4 MiB each, for the decoder's memory
    # charge (tests/c/test_image.c); not in the manifest
    d = png_by_hand(picture(5, 7, 3), 2, 8, False)
    bomb = b"".join(chunk(b"zTXt", b"k%d\0\0" % i + zlib.compress(b"a" * (4 << 20), 9)) for i in range(16))
    with open(os.path.join(OUT, "ztxt_bomb.png"), "wb") as f:
        f.write(d[:33] + bomb + d[33:])

    # JPEG: Pillow's libjpeg-turbo decodes; ours may differ in the last bit
    rgb = Image.fromarray(picture(11, 17, 3), "RGB")
    by_pillow("rgb420.jpg", rgb, "jpeg", 2, "4:2:0", quality=90)
    by_pillow("rgb444.jpg", rgb, "jpeg", 2, "4:4:4", quality=95, subsampling=0)
    by_pillow("rgb422_23x13.jpg", Image.fromarray(picture(13, 23, 3), "RGB"), "jpeg", 2, "4:2:2", quality=85,
              subsampling=1)
    by_pillow("progressive.jpg", rgb, "jpeg", 2, "progressive", quality=90, progressive=True)
    by_pillow("gray.jpg", Image.fromarray(picture(11, 17, 1)[:, :, 0], "L"), "jpeg", 2, quality=90)
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 on display; ignored, as kohya ignores it
    by_pillow("exif_rotated.jpg", Image.fromarray(picture(9, 13, 3), "RGB"), "jpeg", 2, "EXIF orientation 6, ignored",
              quality=90, exif=exif.tobytes())
    b = io.BytesIO()
    Image.fromarray(picture(11, 17, 4), "CMYK").save(b, format="JPEG", quality=90)
    save_ref("cmyk.jpg", b.getvalue(), None, "jpeg", -1, "CMYK: refused")

    # WebP
    by_pillow("lossless.webp", rgb, "webp", 0, "lossless", lossless=True)
    by_pillow("lossless_alpha.webp", Image.fromarray(picture(9, 13, 4), "RGBA"), "webp", 0,
              "lossless with alpha, alpha dropped", lossless=True, exact=True)
    by_pillow("lossy.webp", rgb, "webp", 2, "lossy", quality=80)
    by_pillow("lossy_alpha.webp", Image.fromarray(picture(9, 13, 4), "RGBA"), "webp", 2,
              "lossy with alpha, alpha dropped", quality=80)

    with open(os.path.join(OUT, "manifest.txt"), "w") as f:
        f.write("# NAME WIDTH HEIGHT FORMAT TOLERANCE (-1: must be refused)\n")
        f.write("\n".join(manifest) + "\n")
    with open(os.path.join(OUT, "VERSIONS.txt"), "w") as f:
        f.write(f"python {sys.version.split()[0]}\nPillow {PIL.__version__}\nnumpy {np.__version__}\n")
        for k in ("libjpeg_turbo", "webp", "zlib"):
            f.write(f"{k} {PIL.features.version(k)}\n")
        f.write("made by tests/ref/make_image_ref.py\n")


if __name__ == "__main__":
    main()
