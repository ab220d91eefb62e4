#!/usr/bin/python3
"""Image folders for ImageDatasetTest, and what Pillow + PyTorch make of them.

    /usr/bin/python3 tests/trainer/make_image_files.py OUTDIR

OUTDIR/train/{ant,bee,cat}/...  10x12 images: PNG as RGB, L, LA, RGBA, P (with a tRNS chunk), 1-bit,
                 16-bit RGB, interlaced RGB; JPEG as RGB, grayscale and progressive; a nested folder
                 (bee/more/) and a notes.txt that is not an image
OUTDIR/val/{ant,bee,cat}/       one PNG each
OUTDIR/sizes/{a,b}/             images of different sizes (data.resize)
OUTDIR/bad_*/                   a truncated PNG, a truncated JPEG, a BMP, an empty class
OUTDIR/ref.safetensors          in torchvision ImageFolder order (the listing is reimplemented here
                 as torchvision.datasets.folder.make_dataset does it): labels; rgb and gray
                 (Pillow's convert("RGB") / ("L"), uint8 (N, C, H, W)); norm (rgb / 255 - mean) / std;
                 padded (rgb padded by 2 zero pixels on every side, then normalised); center
                 (the eval centre crop 8x9, normalised); val_rgb; sizes_resized (8x8, bilinear with
                 antialias, rounded, as torchvision's Resize on uint8 tensors; divided by 255)
"""
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dataset_refs import write_safetensors  # noqa: E402

MEAN, STD = [0.5, 0.4, 0.3], [0.25, 0.2, 0.3]
EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def make_dataset(root):
    """torchvision.datasets.folder.find_classes + make_dataset (torchvision is not in Debian 12)."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    samples = []
    for index, c in enumerate(classes):
        for dirpath, _, fnames in sorted(os.walk(os.path.join(root, c), followlinks=True)):
            for fname in sorted(fnames):
                if fname.lower().endswith(EXTENSIONS):
                    samples.append((os.path.join(dirpath, fname), index))
    return samples


def pixels(path, mode):
    with open(path, "rb") as f:
        a = np.asarray(Image.open(f).convert(mode))
    return torch.from_numpy(a.reshape(a.shape[0], a.shape[1], -1).copy()).permute(2, 0, 1)


def normalise(x):
    return (x.float() / 255 - torch.tensor(MEAN).view(-1, 1, 1)) / torch.tensor(STD).view(-1, 1, 1)


def image(rng, mode, size=(12, 10)):
    w, h = size
    if mode in ("RGB", "RGBA"):
        return Image.fromarray(rng.integers(0, 256, (h, w, len(mode)), dtype=np.uint8), mode)
    if mode in ("L", "LA"):
        return Image.fromarray(rng.integers(0, 256, (h, w, len(mode)), dtype=np.uint8).squeeze(), mode)
    if mode == "P":
        im = Image.fromarray(rng.integers(0, 16, (h, w), dtype=np.uint8), "P")
        im.putpalette(list(rng.integers(0, 256, 48, dtype=np.uint8)))
        return im
    if mode == "1":
        return Image.fromarray(rng.integers(0, 2, (h, w), dtype=np.uint8) * 255, "L").convert("1")
    raise ValueError(mode)


def smooth(rng, size=(12, 10)):
    """Smooth content, so JPEG keeps it recognisable (random noise is fine too, only slower)."""
    w, h = size
    y, x = np.mgrid[0:h, 0:w]
    a = np.stack([(x * 20 + rng.integers(0, 40)) % 256, (y * 25) % 256, (x * y * 3) % 256], -1)
    return Image.fromarray(a.astype(np.uint8), "RGB")


def main():
    out = sys.argv[1]
    rng = np.random.default_rng(5)
    t = f"{out}/train"
    for d in ["ant", "bee/more", "cat"]:
        os.makedirs(f"{t}/{d}", exist_ok=True)
    image(rng, "RGB").save(f"{t}/ant/b_rgb.png")
    image(rng, "L").save(f"{t}/ant/a_gray.png")
    image(rng, "LA").save(f"{t}/ant/c_gray_alpha.png")
    image(rng, "RGBA").save(f"{t}/ant/d_rgba.PNG")
    image(rng, "P").save(f"{t}/bee/palette.png", transparency=3)
    image(rng, "1").save(f"{t}/bee/one_bit.png")
    smooth(rng).save(f"{t}/bee/more/photo.jpg", quality=90)
    smooth(rng).convert("L").save(f"{t}/bee/more/gray.jpeg", quality=85)
    smooth(rng).save(f"{t}/cat/progressive.jpg", quality=80, progressive=True)
    image(rng, "RGB").save(f"{t}/cat/interlaced.png", interlace=1)
    rgb16 = rng.integers(0, 65536, (10, 12, 3), dtype=np.uint16)
    write_png16(f"{t}/cat/deep.png", rgb16)
    with open(f"{t}/cat/notes.txt", "w") as f:
        f.write("not an image\n")

    v = f"{out}/val"
    for c in ["ant", "bee", "cat"]:
        os.makedirs(f"{v}/{c}", exist_ok=True)
        image(rng, "RGB").save(f"{v}/{c}/one.png")

    for c, sizes in [("a", [(12, 10), (7, 9)]), ("b", [(20, 16)])]:
        os.makedirs(f"{out}/sizes/{c}", exist_ok=True)
        for k, size in enumerate(sizes):
            image(rng, "RGB", size).save(f"{out}/sizes/{c}/{k}.png")

    os.makedirs(f"{out}/bad_png/x", exist_ok=True)
    image(rng, "RGB").save(f"{out}/bad_png/x/cut.png")
    data = open(f"{out}/bad_png/x/cut.png", "rb").read()
    open(f"{out}/bad_png/x/cut.png", "wb").write(data[: len(data) // 2])
    os.makedirs(f"{out}/bad_jpeg/x", exist_ok=True)
    image(rng, "RGB", (64, 64)).save(f"{out}/bad_jpeg/x/cut.jpg", quality=95)  # cut in the scan
    data = open(f"{out}/bad_jpeg/x/cut.jpg", "rb").read()
    open(f"{out}/bad_jpeg/x/cut.jpg", "wb").write(data[: len(data) * 2 // 3])
    os.makedirs(f"{out}/bad_bmp/x", exist_ok=True)
    image(rng, "RGB").save(f"{out}/bad_bmp/x/old.bmp")
    os.makedirs(f"{out}/bad_empty/x", exist_ok=True)
    os.makedirs(f"{out}/bad_empty/y", exist_ok=True)
    image(rng, "RGB").save(f"{out}/bad_empty/x/fine.png")

    samples = make_dataset(t)
    rgb = torch.stack([pixels(p, "RGB") for p, _ in samples])
    gray = torch.stack([pixels(p, "L") for p, _ in samples])
    padded = normalise(F.pad(rgb, (2, 2, 2, 2)))  # zero pixels, then normalised, like torchvision
    top, left = int(round((10 - 8) / 2.0)), int(round((12 - 9) / 2.0))
    center = normalise(rgb[:, :, top:top + 8, left:left + 9])
    val = torch.stack([pixels(p, "RGB") for p, _ in make_dataset(v)])
    sized = make_dataset(f"{out}/sizes")
    resized = torch.stack([
        F.interpolate(pixels(p, "RGB").float()[None], size=(8, 8), mode="bilinear",
                      align_corners=False, antialias=True)[0].round().clamp(0, 255) / 255
        for p, _ in sized])
    write_safetensors(f"{out}/ref.safetensors", {
        "labels": np.array([c for _, c in samples], dtype=np.int64),
        "rgb": rgb.numpy(), "gray": gray.numpy(), "norm": normalise(rgb).numpy(),
        "padded": padded.numpy(), "center": center.numpy(), "val_rgb": val.numpy(),
        "sizes_resized": resized.numpy(),
        "sizes_labels": np.array([c for _, c in sized], dtype=np.int64)})
    print(f"make_image_files: wrote {out} ({len(samples)} training images)")


def write_png16(path, rgb16):
    """A 16-bit RGB PNG through Pillow's raw encoder is not available; write it by hand."""
    import struct
    import zlib
    h, w, _ = rgb16.shape
    raw = b"".join(b"\x00" + rgb16[y].astype(">u2").tobytes() for y in range(h))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0)) +
                chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


if __name__ == "__main__":
    main()
