// ImageDecode: PNG (libpng) and JPEG (libjpeg-turbo), the Debian libraries, into uint8 (C, H, W)
// with C = 3 (RGB) or 1 (grayscale), converted as Pillow's Image.convert("RGB") / ("L") does (what
// torchvision's ImageFolder loader calls): alpha dropped (not composited), palettes expanded,
// grayscale repeated into R, G and B, RGB to gray as L = (19595 R + 38470 G + 7471 B + 2^15) >> 16;
// 16-bit PNG samples keep their high byte. The format is told by the file's first bytes.
// Truncated or corrupt files, CMYK JPEGs and images wider or taller than 16384 pixels are a
// BadInput naming the file.
// Thread-safety: free function, no shared state.
#pragma once

#include <torch/script.h>

#include <cstdint>
#include <string>

namespace cairn {

torch::Tensor decodeImageFile(const std::string& path, int64_t channels);

}  // namespace cairn
