"""Reference data for tests/lua/test_imagedata.lua, from kohya-ss/sd-scripts itself.

Runs library/train_util.py's BucketManager and trim_and_resize_if_required
(and model_util's make_bucket_resolutions) from a checkout of sd-scripts:
their own source, taken out of the modules (kohya_bucket_code), and writes
tests/data/imagedata/:
  buckets.json  for several settings: the bucket list (make_buckets), and for a
                range of image sizes the bucket select_bucket picks, the resized
                size, the crop a center trim makes, and the time ids (original
                size, crop top-left, target size; also for a flipped image), as
                BaseDataset.__getitem__ computes them
  sha*.bin and sha256.json  a few files and their hashlib SHA-256
  VERSIONS.txt  the sd-scripts commit and package versions

Run: /work/venv-ref/bin/python tests/ref/make_bucket_ref.py /path/to/sd-scripts [sd-scripts commit]
"""
import hashlib
import json
import os
import random
import sys
import types
from unittest import mock

import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "imagedata")
def kohya_bucket_code(sd):
    """BucketManager and trim_and_resize_if_required from library/train_util.py, and the
    make_bucket_resolutions they call from library/model_util.py: their own source, taken
    out of the modules with ast and run with what they use (numpy, math, random), so that
    the rest of sd-scripts' imports (torch, accelerate, transformers, diffusers of the
    versions it pins) need not be installed"""
    import ast
    import math
    import typing

    def defs(path, names):
        with open(path) as f:
            tree = ast.parse(f.read())
        found = [n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name in names]
        assert sorted(n.name for n in found) == sorted(names), (path, names)
        return ast.Module(body=found, type_ignores=[])

    env = {"np": np, "math": math, "random": random, "logger": mock.MagicMock()}
    env.update({k: getattr(typing, k) for k in ("Tuple", "Optional", "List", "Dict", "Union", "Any")})
    model_util = types.SimpleNamespace()
    mu = dict(env)
    exec(compile(defs(os.path.join(sd, "library", "model_util.py"), ["make_bucket_resolutions"]), "model_util.py", "exec"), mu)
    model_util.make_bucket_resolutions = mu["make_bucket_resolutions"]
    env["model_util"] = model_util
    env["resize_image"] = None  # never reached: the images given are already at their resized size
    exec(compile(defs(os.path.join(sd, "library", "train_util.py"), ["BucketManager", "trim_and_resize_if_required"]),
                 "train_util.py", "exec"), env)
    return env["BucketManager"], env["trim_and_resize_if_required"]


def image_sizes(r, lo, hi):
    """a spread of image sizes: squares, bucket-like, common photo sizes, extremes, random"""
    sizes = [(lo, lo), (hi, hi), (1024, 1024), (1000, 1500), (1500, 1000), (832, 1216), (1216, 832),
             (640, 480), (480, 640), (1920, 1080), (1080, 1920), (3000, 2000), (2000, 3000), (4032, 3024),
             (lo, 4 * lo), (4 * lo, lo), (lo + 1, lo + 1), (777, 333), (333, 777), (2048, 512), (512, 2048),
             (896, 1152), (1152, 896), (1023, 1025), (257, 1999), (5000, 700),
             (lo // 2, lo // 2), (lo - 1, 3 * lo), (3 * lo, lo - 1), (lo // 2, 2 * hi),
             # smaller than every bucket (kohya scales them up): a folder of 96x80 images, slivers, a pixel
             (96, 80), (80, 96), (lo // 4, lo // 3), (7, lo), (lo, 7), (1, 1), (63, 65), (130, 2)]
    for _ in range(30):
        sizes.append((r.randint(lo, 3 * hi), r.randint(lo, 3 * hi)))
    return sizes


def main():
    sd = sys.argv[1]
    commit = sys.argv[2] if len(sys.argv) > 2 else "unknown"
    BucketManager, trim_and_resize_if_required = kohya_bucket_code(sd)

    def one(bm, w, h):
        try:
            reso, resized, _ = bm.select_bucket(w, h)
        except ZeroDivisionError:
            return {"w": w, "h": h, "kohya_error": "ZeroDivisionError"}
        if reso[0] <= 0 or reso[1] <= 0:
            return {"w": w, "h": h, "kohya_error": "empty bucket"}
        # kohya's trim of an image already at the resized size (so no resize
        # runs): a ramp of column and row numbers shows where the crop lies
        ramp = np.zeros((resized[1], resized[0], 2), np.int32)
        ramp[:, :, 0] = np.arange(resized[0])[None, :]
        ramp[:, :, 1] = np.arange(resized[1])[:, None]
        trimmed, _, _ = trim_and_resize_if_required(False, ramp, reso, resized)
        assert trimmed.shape[0] == reso[1] and trimmed.shape[1] == reso[0]
        left, top = int(trimmed[0, 0, 0]), int(trimmed[0, 0, 1])
        # the time ids' crop is computed from the original size
        original_size = (w, h)
        crop_ltrb = BucketManager.get_crop_ltrb(reso, original_size)
        target = (reso[0], reso[1])
        ids = [int(original_size[1]), int(original_size[0]), int(crop_ltrb[1]), int(crop_ltrb[0]),
               int(target[1]), int(target[0])]
        # BaseDataset.__getitem__: a flipped image's crop left is target width - crop right
        fl = (target[0] - crop_ltrb[2], crop_ltrb[1])
        ids_flip = [int(original_size[1]), int(original_size[0]), int(fl[1]), int(fl[0]),
                    int(target[1]), int(target[0])]
        return {"w": w, "h": h, "bucket": list(reso), "resized": list(resized),
                "crop_top": top, "crop_left": left, "time_ids": ids, "time_ids_flip": ids_flip}

    settings = [
        {"resolution": [1024, 1024], "min": 256, "max": 2048, "steps": 64},
        {"resolution": [512, 512], "min": 256, "max": 1024, "steps": 64},
        {"resolution": [768, 1024], "min": 320, "max": 1536, "steps": 32},
        {"resolution": [1024, 768], "min": 512, "max": 1024, "steps": 128},
        {"resolution": [640, 640], "min": 192, "max": 1280, "steps": 64},
    ]
    r = random.Random(20261201)
    cases = []
    for s in settings:
        res = tuple(s["resolution"])
        sizes = image_sizes(r, s["min"], s["max"])
        for no_upscale in (False, True):
            bm = BucketManager(no_upscale, res, s["min"], s["max"], s["steps"])
            if not no_upscale:
                bm.make_buckets()
            c = dict(s, enable=True, no_upscale=no_upscale)
            c["buckets"] = [list(x) for x in bm.predefined_resos] if not no_upscale else None
            c["images"] = [one(bm, w, h) for w, h in sizes]
            cases.append(c)
        # without bucketing: one bucket of the resolution (BaseDataset.make_buckets),
        # images smaller than it scaled up
        bm = BucketManager(False, res, None, None, None)
        bm.set_predefined_resos([res])
        c = dict(s, enable=False, no_upscale=False, buckets=[list(res)])
        c["images"] = [one(bm, w, h) for w, h in sizes]
        cases.append(c)

    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "buckets.json"), "w") as f:
        json.dump(cases, f, separators=(",", ":"))

    # files for ck.file_sha256: empty, around the padding boundaries, past one 64 KiB read
    rb = random.Random(7)
    hashes = {}
    for n in (0, 1, 55, 56, 63, 64, 65, 1000, 65536 + 77):
        name = "sha%d.bin" % n
        data = bytes(rb.randrange(256) for _ in range(n))
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
        hashes[name] = hashlib.sha256(data).hexdigest()
    with open(os.path.join(OUT, "sha256.json"), "w") as f:
        json.dump(hashes, f, indent=1, sort_keys=True)

    with open(os.path.join(OUT, "VERSIONS.txt"), "w") as f:
        f.write("made by tests/ref/make_bucket_ref.py\n")
        f.write("kohya-ss/sd-scripts %s (library/train_util.py BucketManager, trim_and_resize_if_required)\n" % commit)
        f.write("python %s\nnumpy %s\n" % (sys.version.split()[0], np.__version__))
        try:
            import PIL
            f.write("pillow %s\n" % PIL.__version__)
        except ImportError:
            pass
        f.write("hashlib (python's own) for sha256.json\n")


if __name__ == "__main__":
    main()
