#include "node/ring/RingCheckpoint.h"

#include "core/Error.h"

namespace cairn {

void saveRingState(const std::vector<std::unique_ptr<Ring>>& ring_list, const RingContext& context,
                   std::vector<std::pair<std::string, torch::Tensor>>* tensors,
                   nlohmann::json* meta) {
  nlohmann::json rings = nlohmann::json::object();
  for (const auto& ring : ring_list) {
    for (size_t i = 0; i < ring->buckets.size(); ++i) {
      const auto& b = ring->buckets[i];
      const std::string n = std::to_string(i);
      if (b.previous.defined())
        tensors->emplace_back("sync." + ring->spec.id + ".previous." + n, b.previous.clone());
      if (b.momentum.defined())
        tensors->emplace_back("sync." + ring->spec.id + ".momentum." + n, b.momentum.clone());
    }
    rings[ring->spec.id] = {{"generation", ring->generation}, {"view", ring->view}};
  }
  (*meta)["last_synced_step"] = context.last_synced_step;
  (*meta)["mode"] = toString(context.sync.mode);
  (*meta)["rings"] = rings;
}

void loadRingState(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                   const nlohmann::json& meta, std::map<std::string, torch::Tensor>* loaded,
                   int64_t* last_synced_step) {
  loaded->clear();
  for (const auto& [name, t] : tensors)
    if (name.rfind("sync.", 0) == 0) (*loaded)[name] = t;
  if (meta.is_object() && meta.contains("last_synced_step")) {
    const auto& s = meta["last_synced_step"];
    if (!s.is_number_integer() || s.get<int64_t>() < 0)
      CAIRN_THROW(BadInput,
                  "checkpoint meta key sync.last_synced_step: expected a non-negative "
                  "integer, got ",
                  s.dump());
    *last_synced_step = s.get<int64_t>();
  }
}

// DiLoCo outer state from a checkpoint (loadState): replaces the θ_prev taken from the stage.
void applyLoadedState(Ring& ring, SyncMode mode, std::map<std::string, torch::Tensor>* loaded) {
  const std::string prefix = "sync." + ring.spec.id + ".";
  for (auto it = loaded->begin(); it != loaded->end();) {
    const std::string& name = it->first;
    if (name.compare(0, prefix.size(), prefix) != 0) {
      ++it;
      continue;
    }
    const std::string rest = name.substr(prefix.size());
    const auto dot = rest.find('.');
    const std::string what = rest.substr(0, dot);
    size_t index = ring.buckets.size();
    try {
      if (dot != std::string::npos) index = std::stoul(rest.substr(dot + 1));
    } catch (const std::exception&) {
    }
    if ((what != "previous" && what != "momentum") || index >= ring.buckets.size() ||
        !ring.buckets[index].previous.defined())
      CAIRN_THROW(BadInput, "checkpoint tensor ", name, ": ring ", ring.spec.id, " has ",
                  ring.buckets.size(), " buckets; expected sync.", ring.spec.id,
                  ".previous.<i> or .momentum.<i> of a floating parameter bucket (", toString(mode),
                  " mode)");
    RingBucket& b = ring.buckets[index];
    const torch::Tensor& t = it->second;
    if (t.scalar_type() != b.dtype || t.dim() != 1 || t.numel() != b.numel)
      CAIRN_THROW(BadInput, "checkpoint tensor ", name, ": expected a 1-d ", dtypeName(b.dtype),
                  " tensor of ", b.numel, " elements, got ", dtypeName(t.scalar_type()), " ",
                  t.sizes());
    (what == "previous" ? b.previous : b.momentum) = t.clone();
    it = loaded->erase(it);
  }
}

}  // namespace cairn
