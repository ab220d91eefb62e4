// The images format (torchvision's ImageFolder layout) against Pillow + PyTorch
// (tests/trainer/make_image_files.py): PNG and JPEG of every colour type decode to the pixels
// Pillow's convert("RGB") / ("L") gives, in torchvision's sample order; normalisation, padding +
// random crop + flip (given the offsets cairn drew), the eval centre crop and resize equal the
// reference; augmentation is reproducible by seed; broken files name the file.
#include <gtest/gtest.h>

#include "tests/trainer/DatasetTestSupport.h"
#include "trainer/Dataset.h"
#include "trainer/data/ImageTransforms.h"

namespace cairn {
namespace {

using testing::datasetFixture;
using testing::expectBadInputNaming;
using testing::readReference;

const std::vector<double> kMean{0.5, 0.4, 0.3}, kStd{0.25, 0.2, 0.3};

DataOptions images(const std::string& location) {
  DataOptions o;
  o.format = "images";
  o.location = location;
  o.normalize.scale = 1;  // raw pixel values unless a test asks for more
  return o;
}

std::vector<int64_t> all(const Dataset& d) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < d.size(); ++i) ids.push_back(i);
  return ids;
}

TEST(ImageDataset, DecodesLikePillowInTorchvisionOrder) {
  const std::string dir = datasetFixture("make_image_files.py");
  auto ref = readReference(dir + "/ref.safetensors");
  DataOptions o = images(dir + "/train");
  o.test_location = dir + "/val";
  DatasetPair d = loadDatasets(o, 0);
  ASSERT_EQ(d.train->size(), ref["labels"].size(0));
  Batch b = d.train->get(all(*d.train), false);
  EXPECT_TRUE(b.targets.equal(ref["labels"]));
  for (int64_t i = 0; i < d.train->size(); ++i)
    EXPECT_TRUE(b.inputs[i].equal(ref["rgb"][i].to(torch::kFloat)))
        << "sample " << i << ": max difference "
        << (b.inputs[i] - ref["rgb"][i].to(torch::kFloat)).abs().max().item<float>();
  EXPECT_TRUE(d.test->get(all(*d.test), false).inputs.equal(ref["val_rgb"].to(torch::kFloat)));

  o.channels = 1;
  DatasetPair gray = loadDatasets(o, 0);
  Batch g = gray.train->get(all(*gray.train), false);
  for (int64_t i = 0; i < gray.train->size(); ++i)
    EXPECT_TRUE(g.inputs[i].equal(ref["gray"][i].to(torch::kFloat)))
        << "sample " << i << ": max difference "
        << (g.inputs[i] - ref["gray"][i].to(torch::kFloat)).abs().max().item<float>();
}

TEST(ImageDataset, NormaliseCenterCropAndResizeMatchTorch) {
  const std::string dir = datasetFixture("make_image_files.py");
  auto ref = readReference(dir + "/ref.safetensors");
  DataOptions o = images(dir + "/train");
  o.normalize = {255, kMean, kStd};
  DatasetPair d = loadDatasets(o, 0);
  EXPECT_TRUE(d.train->get(all(*d.train), false).inputs.allclose(ref["norm"], 1e-5, 1e-6));
  // Evaluation with random_crop: the centre 8x9 window (torchvision's rounding: top 1, left 2).
  o.random_crop.size = {8, 9};
  DatasetPair c = loadDatasets(o, 0);
  EXPECT_TRUE(c.train->get(all(*c.train), false).inputs.allclose(ref["center"], 1e-5, 1e-6));

  DataOptions s = images(dir + "/sizes");
  s.normalize.scale = 255;
  s.resize = {8, 8};
  DatasetPair r = loadDatasets(s, 0);
  Batch rb = r.train->get(all(*r.train), false);
  EXPECT_TRUE(rb.targets.equal(ref["sizes_labels"]));
  EXPECT_TRUE(rb.inputs.allclose(ref["sizes_resized"], 1e-5, 1e-6))
      << (rb.inputs - ref["sizes_resized"]).abs().max().item<float>();
  s.resize.clear();
  expectBadInputNaming(
      [&] {
        r = loadDatasets(s, 0);
        r.train->get(all(*r.train), false);
      },
      dir + "/sizes/", "data.resize");
}

TEST(ImageDataset, PadCropFlipEqualTheReferenceAndAreReproducible) {
  const std::string dir = datasetFixture("make_image_files.py");
  auto ref = readReference(dir + "/ref.safetensors");
  DataOptions o = images(dir + "/train");
  o.normalize = {255, kMean, kStd};
  o.random_crop = {{10, 12}, 2};
  o.random_flip = true;
  const uint64_t seed = 3;
  DatasetPair d = loadDatasets(o, seed);
  const std::vector<int64_t> ids = all(*d.train);
  Batch first = d.train->get(ids, true);
  ImageTransforms transforms(o, 3, seed);
  int flips = 0, moved = 0;
  for (int64_t id : ids) {
    const AugmentDraw draw = transforms.decide(id, 0, 10, 12);
    torch::Tensor expected = ref["padded"][id].narrow(1, draw.top, 10).narrow(2, draw.left, 12);
    if (draw.flip) expected = expected.flip({2});
    flips += draw.flip;
    moved += draw.top != 2 || draw.left != 2;
    EXPECT_TRUE(first.inputs[id].allclose(expected, 1e-5, 1e-6)) << "sample " << id;
  }
  EXPECT_GT(flips, 0);  // the seed exercises flips and crops (else the check above proves little)
  EXPECT_LT(flips, int(ids.size()));
  EXPECT_GT(moved, 0);

  Batch second = d.train->get(ids, true);  // the next draw decides anew
  EXPECT_FALSE(second.inputs.equal(first.inputs));
  EXPECT_EQ(d.train->trainingDraws(), 2u);
  DatasetPair same = loadDatasets(o, seed);
  EXPECT_TRUE(same.train->get(ids, true).inputs.equal(first.inputs));
  same.train->setTrainingDraws(1);  // a resumed run continues where it stopped
  EXPECT_TRUE(same.train->get(ids, true).inputs.equal(second.inputs));
  EXPECT_FALSE(loadDatasets(o, seed + 1).train->get(ids, true).inputs.equal(first.inputs));
  // Evaluation batches are never augmented.
  EXPECT_TRUE(d.train->get(ids, false).inputs.equal(d.train->get(ids, false).inputs));
}

TEST(ImageDataset, BrokenFilesNameTheFile) {
  const std::string dir = datasetFixture("make_image_files.py");
  for (const char* f : {"/bad_png/x/cut.png", "/bad_jpeg/x/cut.jpg"}) {
    const std::string folder = dir + std::string(f).substr(0, std::string(f).find("/x/"));
    expectBadInputNaming([&] { loadDatasets(images(folder), 0).train->get({0}, false); }, dir + f,
                         "truncated");
  }
  expectBadInputNaming([&] { loadDatasets(images(dir + "/bad_bmp"), 0); },
                       dir + "/bad_bmp/x/old.bmp", "PNG and JPEG");
  expectBadInputNaming([&] { loadDatasets(images(dir + "/bad_empty"), 0); }, dir + "/bad_empty/y");
  DataOptions o = images(dir + "/train");
  o.test_location = dir + "/sizes";
  expectBadInputNaming([&] { loadDatasets(o, 0); }, dir + "/sizes", "class folders");
  expectBadInputNaming([&] { loadDatasets(images(dir + "/train/ant/b_rgb.png"), 0); }, "b_rgb.png",
                       "one folder per class");
}

}  // namespace
}  // namespace cairn
