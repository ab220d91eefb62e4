#include "core/MainGuard.h"

#include <cstdio>
#include <exception>

#include "core/Error.h"
#include "core/Log.h"

namespace cairn {

int runGuarded(const char* program, const std::function<int()>& body) {
  try {
    return body();
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    if (!e.where().empty()) CAIRN_DEBUG("raised at ", e.where());
    return e.exitCode();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: internal error: %s\n", program, e.what());
    return 1;
  }
}

}  // namespace cairn
