"""Reference for tests/lua/test_log_images.lua: TensorBoard's own reader on an
event file ckrun wrote with image summaries.

Runs `ckrun tests/lua/test_log_images.lua --reference DIR`, which writes two
PNGs with ck.write_png into tests/data/tb_images/ (a.png, b.png) and an event
file in DIR of records holding them (two images and a number in one record,
an image-only record, nested and listed images). Then reads that file with
tensorboard's EventAccumulator (size_guidance images=0: keep every image) and
with the plugin accumulator the TensorBoard UI uses (the Images tab's data),
and writes tests/data/tb_images/expected.txt: the image tags, steps, sizes and
the SHA-256 of each encoded_image_string, and the scalars beside them;
VERSIONS.txt names the packages. The ctest writes the same records from the
committed PNGs and compares ckrun's own reading of them with expected.txt.

usage (from the repository root, after building):
  /work/venv-ref/bin/python tests/ref/make_tb_images.py [--ckrun build/ckrun]
"""
import argparse
import glob
import hashlib
import os
import platform
import subprocess
import sys

from tensorboard.backend.event_processing import event_accumulator as ea
from tensorboard.backend.event_processing import plugin_event_accumulator as pea
import tensorboard
import google.protobuf

OUT = "tests/data/tb_images"


def sha(b):
    return hashlib.sha256(b).hexdigest()


def describe(path):
    lines = []
    acc = ea.EventAccumulator(path, size_guidance={ea.IMAGES: 0, ea.SCALARS: 0})
    acc.Reload()
    tags = acc.Tags()
    for tag in sorted(tags[ea.IMAGES]):
        for e in sorted(acc.Images(tag), key=lambda e: e.step):
            lines.append("image %s step=%d width=%d height=%d bytes=%d sha256=%s" % (
                tag, e.step, e.width, e.height, len(e.encoded_image_string), sha(e.encoded_image_string)))
    for tag in sorted(tags[ea.SCALARS]):
        for e in sorted(acc.Scalars(tag), key=lambda e: e.step):
            lines.append("scalar %s step=%d value=%.9g" % (tag, e.step, e.value))
    # what the Images tab reads: legacy image values migrated to the images
    # plugin's tensors [width, height, encoded image]
    plug = pea.EventAccumulator(path, size_guidance={pea.TENSORS: 0})
    plug.Reload()
    for tag in sorted(plug.PluginTagToContent("images")):
        for e in sorted(plug.Tensors(tag), key=lambda e: e.step):
            w, h, png = e.tensor_proto.string_val
            lines.append("plugin images %s step=%d width=%s height=%s sha256=%s" % (
                tag, e.step, w.decode(), h.decode(), sha(png)))
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckrun", default="build/ckrun")
    ap.add_argument("--dir", default="out/tb_images_ref")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    for old in glob.glob(os.path.join(a.dir, "events.out.tfevents.*")):
        os.remove(old)
    subprocess.run([a.ckrun, "tests/lua/test_log_images.lua", "--reference", a.dir], check=True)
    files = glob.glob(os.path.join(a.dir, "events.out.tfevents.*"))
    if len(files) != 1:
        sys.exit("expected one event file in %s, found %d" % (a.dir, len(files)))
    lines = describe(files[0])
    with open(os.path.join(OUT, "expected.txt"), "w") as f:
        f.write("# tensorboard's reading of a ckrun event file (tests/ref/make_tb_images.py)\n")
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(OUT, "VERSIONS.txt"), "w") as f:
        f.write("made by tests/ref/make_tb_images.py with\n")
        f.write("python %s\n" % platform.python_version())
        f.write("tensorboard %s\n" % tensorboard.__version__)
        f.write("protobuf %s\n" % google.protobuf.__version__)
        f.write("a.png, b.png: ck.write_png of %s\n" % subprocess.run(
            [a.ckrun, "--version"], capture_output=True, text=True).stdout.strip())
    print("\n".join(lines))


if __name__ == "__main__":
    main()
