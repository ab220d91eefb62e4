#include "coordinator/ConnectionWatch.h"

namespace cairn::coordinator {

void ConnectionWatch::heard(const std::string& key, int fd) {
  if (fd < 0) return;
  Seen& seen = keys_[key];
  seen.gone_since.reset();
  const auto [it, fresh] = fd_key_.emplace(fd, key);
  if (!fresh && it->second != key) {
    // The descriptor was another key's (its close not reported yet: not expected, see the header);
    // it is this key's connection now.
    const auto other = keys_.find(it->second);
    if (other != keys_.end()) other->second.open.erase(fd);
    it->second = key;
  }
  seen.open.insert(fd);
}

void ConnectionWatch::closed(int fd, double now) {
  const auto it = fd_key_.find(fd);
  if (it == fd_key_.end()) return;  // a connection no member spoke on
  const auto seen = keys_.find(it->second);
  fd_key_.erase(it);
  if (seen == keys_.end()) return;
  seen->second.open.erase(fd);
  if (seen->second.open.empty()) seen->second.gone_since = now;
}

std::optional<double> ConnectionWatch::goneSince(const std::string& key) const {
  const auto it = keys_.find(key);
  if (it == keys_.end()) return std::nullopt;
  return it->second.gone_since;
}

}  // namespace cairn::coordinator
