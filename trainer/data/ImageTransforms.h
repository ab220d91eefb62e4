// ImageTransforms: the image pipeline of the idx and images formats, per sample, in torchvision's
// order: resize (bilinear, antialiased, rounded back to whole pixel values, like
// torchvision.transforms.Resize on a uint8 tensor) -> training: pad with zeros and cut a random
// window (RandomCrop(size, padding)), mirror left-right with p = 0.5 (RandomHorizontalFlip);
// evaluation: cut the centre window (CenterCrop) -> x = (pixel / scale - mean) / std per channel.
// The random decisions of a sample come from a generator seeded by (seed, sample id, draw), where
// `draw` counts the training batches drawn so far: reproducible whatever the batch composition or
// the number of processes, and resumable (the draw count is checkpointed). applyBatch() does the
// same to a batch of equal-sized images at once (the idx format's batches).
// Thread-safety: immutable after construction.
#pragma once

#include <torch/script.h>

#include <cstdint>
#include <string>

#include "trainer/DataOptions.h"

namespace cairn {

// What the random transforms decided for one sample in one training draw. top/left index the
// padded image.
struct AugmentDraw {
  bool flip = false;
  int64_t top = 0, left = 0;
};

class ImageTransforms {
 public:
  // `channels`: of the images it will transform (data.normalize lists hold 1 or that many values).
  ImageTransforms(const DataOptions& options, int64_t channels, uint64_t seed);

  // A decoded image, uint8 or float (C, H, W) in pixel units, to the float (C, h, w) the model
  // sees. `source` (a file, or "sample N") names the image in errors.
  torch::Tensor apply(const torch::Tensor& image, int64_t id, uint64_t draw, bool training,
                      const std::string& source) const;
  // The decisions apply() takes in training for an image of height x width pixels after resize.
  AugmentDraw decide(int64_t id, uint64_t draw, int64_t height, int64_t width) const;
  bool augments() const { return random_flip_ || !crop_.size.empty(); }
  // apply() to each image of a batch (N, C, H, W) of equal sizes, sample ids `ids`, bit for bit
  // (the crops and flips are copies, the normalisation the same element-wise arithmetic), in a
  // few operators for the whole batch instead of a handful per image; with a resize, image by
  // image. `source` names the images in errors.
  torch::Tensor applyBatch(const torch::Tensor& images, const std::vector<int64_t>& ids,
                           uint64_t draw, bool training, const std::string& source) const;
  // (pixel / scale - mean) / std per channel of images (C, H, W) or (N, C, H, W), any dtype, as
  // float; `source` names them in the error when their channels do not match data.normalize.
  torch::Tensor normalize(const torch::Tensor& images, const std::string& source) const;

 private:
  std::vector<int64_t> resize_;
  RandomCropOptions crop_;
  bool random_flip_;
  uint64_t seed_;
  double scale_;
  torch::Tensor mean_, std_;  // (C, 1, 1)
};

}  // namespace cairn
