#include "tools/bench/coordinator_load/LoadWorker.h"

#include <algorithm>

namespace cairn::bench::load {

void LoadWorker::run() {
  using std::chrono::milliseconds;
  std::vector<Clock::time_point> due(volunteers_.size(), Clock::now());
  std::vector<zmq::pollitem_t> items;
  std::vector<std::pair<size_t, bool>> owners;  // (volunteer, is the router)
  while (!recorder_.progress().stop.load()) {
    auto now = Clock::now();
    Clock::time_point next = now + milliseconds(50);
    items.clear();
    owners.clear();
    for (size_t i = 0; i < volunteers_.size(); ++i) {
      LoadVolunteer& v = *volunteers_[i];
      if (due[i] <= now) due[i] = v.tick(now);
      next = std::min(next, due[i]);
      if (void* d = v.dealer()) {
        items.push_back({d, 0, ZMQ_POLLIN, 0});
        owners.emplace_back(i, false);
      }
      for (void* r : {v.router(), v.acceptRouter()}) {
        if (!r) continue;
        items.push_back({r, 0, ZMQ_POLLIN, 0});
        owners.emplace_back(i, true);
      }
    }
    // Timers wake the loop on a 10 ms grid: each wake-up polls every socket of the loop, and
    // waking once per volunteer's timer (thousands a second, at random phases) made the generator
    // the busiest process on the machine. Answers still wake it at once (latencies are measured
    // from each message's own send time, so the grid does not enter them).
    const auto grid = std::chrono::duration_cast<milliseconds>(next.time_since_epoch()).count();
    next = Clock::time_point(milliseconds((grid / 10 + 1) * 10));
    const auto wait = std::clamp(std::chrono::duration_cast<milliseconds>(next - Clock::now()),
                                 milliseconds(0), milliseconds(50));
    try {
      zmq::poll(items.data(), items.size(), wait);
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) throw;
      continue;
    }
    now = Clock::now();
    for (size_t k = 0; k < items.size(); ++k) {
      if (!(items[k].revents & ZMQ_POLLIN)) continue;
      LoadVolunteer& v = *volunteers_[owners[k].first];
      if (owners[k].second) {
        v.readRouter();
      } else {
        v.readDealer(now);
        due[owners[k].first] = now;  // an answer may let the next request go (one in flight)
      }
    }
  }
}

}  // namespace cairn::bench::load
