// The images format: torchvision's ImageFolder layout. data.location holds one folder per class;
// classes are the folder names in sorted order (class i = the i-th name), samples every PNG or JPEG
// below a class folder (sub-folders included), ordered as torchvision orders them (by folder
// path, then file name). Files with other image suffixes (.bmp, .gif, .ppm, .pgm, .tif, .tiff,
// .webp) are a BadInput naming them; other files are skipped. Hidden entries (".name") are
// skipped. A test folder (data.test_location) must hold the same classes. Images are decoded
// (trainer/data/ImageDecode.h) and transformed (trainer/data/ImageTransforms.h) per batch; only
// the list of files is kept in memory.
#include <algorithm>
#include <filesystem>

#include "core/Error.h"
#include "trainer/data/Formats.h"
#include "trainer/data/ImageDecode.h"
#include "trainer/data/ImageTransforms.h"

namespace cairn {
namespace {

namespace fs = std::filesystem;

struct ImageList {
  std::string root;
  std::vector<std::string> classes;
  std::vector<std::pair<std::string, int64_t>> samples;  // path, class
  uint64_t bytes = 0;
};

bool hidden(const fs::path& p) {
  const std::string name = p.filename().string();
  return !name.empty() && name[0] == '.';
}

ImageList listImages(const std::string& root, const std::string& key) {
  ImageList list;
  list.root = root;
  std::error_code error;
  if (!fs::is_directory(root, error))
    CAIRN_THROW(BadInput, "job.json: ", key, " ", root, ": not a folder (one folder per class)");
  for (const fs::directory_entry& e : fs::directory_iterator(root, error))
    if (e.is_directory() && !hidden(e.path())) list.classes.push_back(e.path().filename());
  if (error) CAIRN_THROW(BadInput, root, ": cannot list the folder");
  std::sort(list.classes.begin(), list.classes.end());
  if (list.classes.empty())
    CAIRN_THROW(BadInput, "job.json: ", key, " ", root,
                ": holds no class folder (images go in <folder>/<class>/<file>)");
  for (size_t c = 0; c < list.classes.size(); ++c) {
    std::vector<std::pair<std::string, std::string>> files;  // (folder, name): torchvision's order
    const fs::path dir = fs::path(root) / list.classes[c];
    for (auto it = fs::recursive_directory_iterator(
             dir, fs::directory_options::follow_directory_symlink, error);
         it != fs::recursive_directory_iterator(); it.increment(error)) {
      if (error) break;
      if (hidden(it->path())) {
        if (it->is_directory()) it.disable_recursion_pending();
        continue;
      }
      if (!it->is_regular_file()) continue;
      const std::string name = it->path().filename().string();
      if (hasSuffix(name, {".png", ".jpg", ".jpeg"})) {
        files.emplace_back(it->path().parent_path().string(), name);
        list.bytes += it->file_size();
      } else if (hasSuffix(name, {".bmp", ".gif", ".ppm", ".pgm", ".tif", ".tiff", ".webp"})) {
        CAIRN_THROW(BadInput, it->path().string(),
                    ": cairn decodes PNG and JPEG images only; convert this file");
      }
    }
    if (error) CAIRN_THROW(BadInput, dir.string(), ": cannot list the folder: ", error.message());
    if (files.empty())
      CAIRN_THROW(BadInput, dir.string(), ": class \"", list.classes[c],
                  "\" holds no .png, .jpg or .jpeg file");
    std::sort(files.begin(), files.end());
    for (const auto& [folder, name] : files)
      list.samples.emplace_back((fs::path(folder) / name).string(), int64_t(c));
  }
  return list;
}

class ImageFolderDataset : public Dataset {
 public:
  ImageFolderDataset(ImageList list, const DataOptions& o, uint64_t seed)
      : list_(std::move(list)), channels_(o.channels), transforms_(o, o.channels, seed) {}
  int64_t size() const override { return int64_t(list_.samples.size()); }
  Batch get(const std::vector<int64_t>& ids, bool training) const override {
    std::vector<torch::Tensor> images;
    std::vector<int64_t> labels;
    for (int64_t id : ids) {
      const auto& [path, label] = list_.samples.at(size_t(id));
      torch::Tensor x =
          transforms_.apply(decodeImageFile(path, channels_), id, draws_, training, path);
      if (!images.empty() && x.sizes() != images.front().sizes())
        CAIRN_THROW(BadInput, path, ": becomes ", x.sizes(), " but ",
                    list_.samples.at(size_t(ids.front())).first, " becomes ",
                    images.front().sizes(),
                    "; images of different sizes need data.resize or data.random_crop");
      images.push_back(x);
      labels.push_back(label);
    }
    if (training && transforms_.augments()) ++draws_;
    return {torch::stack(images), torch::tensor(labels, torch::kLong), {}};
  }
  std::vector<ShardInfo> shards() const override { return {{list_.root, size(), list_.bytes}}; }
  const std::vector<std::string>& classes() const { return list_.classes; }
  uint64_t trainingDraws() const override { return draws_; }
  void setTrainingDraws(uint64_t draws) override { draws_ = draws; }

 private:
  ImageList list_;
  int64_t channels_;
  ImageTransforms transforms_;
  mutable uint64_t draws_ = 0;
};

ImageList limitedImages(ImageList list, int64_t limit) {
  if (limit > 0 && limit < int64_t(list.samples.size())) list.samples.resize(size_t(limit));
  return list;
}

}  // namespace

DatasetPair loadImageFolderDatasets(const DataOptions& o, uint64_t seed) {
  DatasetPair pair;
  ImageList train = listImages(o.location, "data.location");
  if (!o.test_location.empty()) {
    ImageList test = listImages(o.test_location, "data.test_location");
    if (test.classes != train.classes)
      CAIRN_THROW(BadInput, "job.json: data.test_location ", o.test_location, " holds ",
                  test.classes.size(), " class folders that are not those of data.location ",
                  o.location, " (", train.classes.size(),
                  "); the class index is the position of the folder name");
    pair.test =
        std::make_unique<ImageFolderDataset>(limitedImages(std::move(test), o.test_samples), o, seed);
  }
  pair.train =
      std::make_unique<ImageFolderDataset>(limitedImages(std::move(train), o.train_samples), o, seed);
  return pair;
}

}  // namespace cairn
