#include "trainer/data/ImageTransforms.h"

#include <ATen/ops/_upsample_bilinear2d_aa.h>

#include <cmath>
#include <random>

#include "core/Error.h"

namespace cairn {

ImageTransforms::ImageTransforms(const DataOptions& o, int64_t channels, uint64_t seed)
    : resize_(o.resize),
      crop_(o.random_crop),
      random_flip_(o.random_flip),
      seed_(seed),
      scale_(o.normalize.scale) {
  auto perChannel = [&](const std::vector<double>& v, const char* what) {
    if (v.size() != 1 && int64_t(v.size()) != channels)
      CAIRN_THROW(BadInput, "job.json: data.normalize.", what, " has ", v.size(),
                  " values for images with ", channels, " channel(s)");
    std::vector<float> f(v.begin(), v.end());
    return torch::tensor(f).view({-1, 1, 1});
  };
  mean_ = perChannel(o.normalize.mean, "mean");
  std_ = perChannel(o.normalize.std, "std");
}

AugmentDraw ImageTransforms::decide(int64_t id, uint64_t draw, int64_t height,
                                    int64_t width) const {
  // The first number decides the flip (as before crops existed, so flips did not change).
  std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ull + uint64_t(id) * 31 + draw);
  AugmentDraw d;
  const uint64_t first = rng();
  d.flip = random_flip_ && (first & 1);
  if (!crop_.size.empty()) {
    const int64_t ph = height + 2 * crop_.padding, pw = width + 2 * crop_.padding;
    const int64_t rows = ph - crop_.size[0] + 1, cols = pw - crop_.size[1] + 1;
    d.top = rows > 0 ? int64_t(rng() % uint64_t(rows)) : 0;
    d.left = cols > 0 ? int64_t(rng() % uint64_t(cols)) : 0;
  }
  return d;
}

torch::Tensor ImageTransforms::apply(const torch::Tensor& image, int64_t id, uint64_t draw,
                                     bool training, const std::string& source) const {
  torch::Tensor x = image.to(torch::kFloat);
  if (!resize_.empty() && (x.size(1) != resize_[0] || x.size(2) != resize_[1]))
    x = at::_upsample_bilinear2d_aa(x.unsqueeze(0), {resize_[0], resize_[1]},
                                    /*align_corners=*/false)
            .squeeze(0)
            .round()
            .clamp(0, 255);
  const int64_t h = x.size(1), w = x.size(2);
  if (!crop_.size.empty()) {
    const int64_t ch = crop_.size[0], cw = crop_.size[1];
    if (training) {
      const int64_t p = crop_.padding;
      if (h + 2 * p < ch || w + 2 * p < cw)
        CAIRN_THROW(BadInput, source, ": a ", h, "x", w, " image padded by ", p,
                    " is smaller than data.random_crop.size ", ch, "x", cw);
      const AugmentDraw d = decide(id, draw, h, w);
      if (p > 0) {
        torch::Tensor padded = torch::zeros({x.size(0), h + 2 * p, w + 2 * p}, torch::kFloat);
        padded.narrow(1, p, h).narrow(2, p, w).copy_(x);
        x = padded;
      }
      x = x.narrow(1, d.top, ch).narrow(2, d.left, cw);
      if (d.flip) x = x.flip({2});
    } else {
      if (h < ch || w < cw)
        CAIRN_THROW(BadInput, source, ": a ", h, "x", w,
                    " image is smaller than data.random_crop.size ", ch, "x", cw);
      // torchvision's CenterCrop: int(round((h - ch) / 2.0)), Python rounding half to even.
      const int64_t top = int64_t(std::nearbyint(double(h - ch) / 2.0));
      const int64_t left = int64_t(std::nearbyint(double(w - cw) / 2.0));
      x = x.narrow(1, top, ch).narrow(2, left, cw);
    }
  } else if (training && random_flip_ && decide(id, draw, h, w).flip) {
    x = x.flip({2});
  }
  return normalize(x, source);
}

torch::Tensor ImageTransforms::applyBatch(const torch::Tensor& images,
                                          const std::vector<int64_t>& ids, uint64_t draw,
                                          bool training, const std::string& source) const {
  if (!resize_.empty()) {
    std::vector<torch::Tensor> rows;
    rows.reserve(ids.size());
    for (size_t i = 0; i < ids.size(); ++i)
      rows.push_back(apply(images[int64_t(i)], ids[i], draw, training,
                           source + ": image " + std::to_string(ids[i])));
    return torch::stack(rows);
  }
  torch::Tensor x = images;
  const int64_t n = x.size(0), h = x.size(2), w = x.size(3);
  if (!crop_.size.empty() && !training) {
    const int64_t ch = crop_.size[0], cw = crop_.size[1];
    if (h < ch || w < cw)
      CAIRN_THROW(BadInput, source, ": a ", h, "x", w, " image is smaller than data.random_crop.size ",
                  ch, "x", cw);
    // torchvision's CenterCrop, as apply(): int(round((h - ch) / 2.0)), half to even.
    x = x.narrow(2, int64_t(std::nearbyint(double(h - ch) / 2.0)), ch)
            .narrow(3, int64_t(std::nearbyint(double(w - cw) / 2.0)), cw);
  } else if (training && augments()) {
    // Each image's window and flip as apply() draws them, cut out by one gather: rows top..top+ch,
    // columns left..left+cw, reversed for a flipped image (a flip of the window).
    const int64_t p = crop_.size.empty() ? 0 : crop_.padding;
    const int64_t ch = crop_.size.empty() ? h : crop_.size[0];
    const int64_t cw = crop_.size.empty() ? w : crop_.size[1];
    if (h + 2 * p < ch || w + 2 * p < cw)
      CAIRN_THROW(BadInput, source, ": a ", h, "x", w, " image padded by ", p,
                  " is smaller than data.random_crop.size ", ch, "x", cw);
    if (p > 0) {
      torch::Tensor padded = torch::zeros({n, x.size(1), h + 2 * p, w + 2 * p}, x.options());
      padded.narrow(2, p, h).narrow(3, p, w).copy_(x);
      x = padded;
    }
    std::vector<int64_t> rows, cols;
    rows.reserve(size_t(n * ch));
    cols.reserve(size_t(n * cw));
    for (int64_t i = 0; i < n; ++i) {
      // Without a crop, decide() draws only the flip (the window is the whole image).
      const AugmentDraw d = decide(ids[size_t(i)], draw, h, w);
      for (int64_t r = 0; r < ch; ++r) rows.push_back(d.top + r);
      for (int64_t c = 0; c < cw; ++c) cols.push_back(d.left + (d.flip ? cw - 1 - c : c));
    }
    // Four index tensors broadcast to (n, C, ch, cw) (a slice among them would move the channels
    // last, by advanced indexing's rule).
    x = x.index({torch::arange(n).view({n, 1, 1, 1}), torch::arange(x.size(1)).view({1, -1, 1, 1}),
                 torch::tensor(rows).view({n, 1, ch, 1}), torch::tensor(cols).view({n, 1, 1, cw})});
  }
  return normalize(x, source);
}

torch::Tensor ImageTransforms::normalize(const torch::Tensor& images, const std::string& source) const {
  const torch::Tensor x = images.to(torch::kFloat);
  const int64_t channels = x.size(-3);
  if (channels != mean_.size(0) && mean_.size(0) != 1)
    CAIRN_THROW(BadInput, source, ": has ", channels, " channel(s) but data.normalize has ",
                mean_.size(0), " values");
  return ((x / float(scale_) - mean_) / std_).contiguous();
}

}  // namespace cairn
