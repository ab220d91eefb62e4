#include "coordinator/NodeHeaders.h"

#include <sys/stat.h>

#include <algorithm>

#include "core/Error.h"

namespace cairn::coordinator {

const NodeSpec& NodeHeaders::header(const std::string& name) {
  const std::string path = nodeSpecPath(out_, name);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    entries_.erase(name);
    (void)readNodeSpec(path);  // says what is wrong with it, naming the file
    CAIRN_THROW(BadInput, path, ": cannot be read");
  }
  const std::vector<long long> identity{(long long)st.st_dev, (long long)st.st_ino,
                                        (long long)st.st_size, (long long)st.st_mtim.tv_sec,
                                        (long long)st.st_mtim.tv_nsec};
  auto it = entries_.find(name);
  if (it != entries_.end() && it->second.identity == identity) return it->second.header;
  NodeSpec node = readNodeSpec(path);
  ++parses_;
  // What Replacement.h canHold and its notes need of the rings: their members placed dial-out
  // only, each once, at most kDialOutOnlyKept (a note names 8 and says there are more), in one ring.
  RingSpec dial_out_only;
  dial_out_only.id = "dial-out-only members";
  for (const RingSpec& ring : node.rings)
    for (const PeerRef& m : ring.members) {
      if (!m.dial_out_only || m.name == node.name || dial_out_only.members.size() >= kDialOutOnlyKept)
        continue;
      const auto& kept = dial_out_only.members;
      if (std::none_of(kept.begin(), kept.end(), [&](const PeerRef& p) { return p.name == m.name; }))
        dial_out_only.members.push_back(m);
    }
  node.rings.clear();
  if (!dial_out_only.members.empty()) node.rings.push_back(std::move(dial_out_only));
  node.parameters.clear();
  node.buffers.clear();
  node.inputs.clear();
  node.outputs.clear();
  node.shared_parameters.clear();
  Entry& entry = entries_[name];
  entry.identity = identity;
  entry.header = std::move(node);
  return entry.header;
}

std::vector<NodeSpec> NodeHeaders::headers(const std::vector<std::string>& names) {
  std::vector<NodeSpec> out;
  out.reserve(names.size());
  for (const std::string& name : names) out.push_back(header(name));
  return out;
}

}  // namespace cairn::coordinator
