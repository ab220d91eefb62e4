#include "node/ring/RingThreads.h"

#include <ATen/ThreadLocalState.h>

#include <exception>
#include <system_error>
#include <thread>

#include "core/Log.h"

namespace cairn {

void forEachRing(const std::vector<Ring*>& rings, bool concurrent,
                 const std::function<void(Ring&)>& body) {
  if (rings.size() <= 1 || !concurrent) {
    for (Ring* ring : rings) body(*ring);
    return;
  }
  std::vector<std::exception_ptr> errors(rings.size());
  const at::ThreadLocalState torch_state;  // grad mode and the like, as on the calling thread
  auto run = [&](size_t i) {
    try {
      body(*rings[i]);
    } catch (...) {
      errors[i] = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  std::vector<size_t> inline_rings = {0};
  for (size_t i = 1; i < rings.size(); ++i) {
    try {
      threads.emplace_back([&run, &torch_state, i] {
        at::ThreadLocalStateGuard guard(torch_state);
        run(i);
      });
    } catch (const std::system_error& e) {  // no thread to be had: this ring runs here
      CAIRN_WARN("ring ", rings[i]->spec.id, ": no thread for it (", e.what(),
                 "); it runs after the others on this one");
      inline_rings.push_back(i);
    }
  }
  for (size_t i : inline_rings) run(i);
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace cairn
