// Every binary's main() runs its body through runGuarded(): a cairn::Error becomes one line on
// stderr ("provider: error: ...") and its exit code (2 bad input, 3 peer lost, 1 internal); any
// other exception is reported as an internal error. The source location is logged at debug level.
#pragma once

#include <functional>

namespace cairn {

int runGuarded(const char* program, const std::function<int()>& body);

}  // namespace cairn
