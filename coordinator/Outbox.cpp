#include "coordinator/Outbox.h"

#include <filesystem>

#include "core/Log.h"

namespace cairn::coordinator {

void Outbox::begin() {
  if (store_.batchOpen()) return;
  store_.beginBatch();
  began_ = Clock::now();
}

void Outbox::send(const std::string& routing_id, const Frames& frames) {
  if (store_.batchOpen())
    held_.emplace_back(routing_id, frames);
  else
    deliver_(routing_id, frames);
}

void Outbox::commit() {
  store_.commitBatch();
  for (const auto& [path, keep] : superseded_) {  // an old file left behind is only space
    if (keep && keep()) continue;
    std::error_code ec;
    if (!std::filesystem::remove(path, ec) && ec)
      CAIRN_WARN("coordinator: cannot remove ", path, ": ", ec.message());
  }
  superseded_.clear();
  std::vector<std::pair<std::string, Frames>> held;
  held.swap(held_);
  for (const auto& [routing_id, frames] : held) deliver_(routing_id, frames);
}

}  // namespace cairn::coordinator
