#include "core/OpCount.h"

#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "core/Error.h"
#include "core/Log.h"

namespace cairn {
namespace {

// The callback is a plain function (RecordFunctionCallback takes a function pointer), so the counts
// live here; one OpCount at a time (the provider's).
std::mutex g_mutex;
std::map<std::string, uint64_t> g_counts;

std::unique_ptr<at::ObserverContext> countOp(const at::RecordFunction& fn) {
  std::lock_guard<std::mutex> lock(g_mutex);
  ++g_counts[fn.name()];
  return nullptr;
}

}  // namespace

std::unique_ptr<OpCount> OpCount::fromEnvironment(const std::string& node) {
  const char* value = std::getenv("CAIRN_COUNT_OPS");
  if (!value || !*value) return nullptr;
  std::string path = value;
  for (size_t at = path.find("{node}"); at != std::string::npos;
       at = path.find("{node}", at + node.size()))
    path.replace(at, 6, node);
  return std::make_unique<OpCount>(path);
}

OpCount::OpCount(std::string path) : path_(std::move(path)) {
  if (!std::ofstream(path_))  // said now, before the run, not after it
    CAIRN_THROW(BadInput, "CAIRN_COUNT_OPS=", path_, ": cannot write that file");
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_counts.clear();
  }
  // Operators only (RecordScope::FUNCTION): not TorchScript's function scopes, autograd's backward
  // nodes or user scopes, whose work is counted by the operators they dispatch.
  handle_ = at::addGlobalCallback(
      at::RecordFunctionCallback(&countOp).scopes({at::RecordScope::FUNCTION}).needsInputs(false));
  CAIRN_INFO("CAIRN_COUNT_OPS: counting the ATen operators this process dispatches into ", path_);
}

OpCount::~OpCount() {
  at::removeCallback(handle_);
  nlohmann::json ops = nlohmann::json::object();
  uint64_t total = 0;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (const auto& [name, n] : g_counts) {
      ops[name] = n;
      total += n;
    }
  }
  std::ofstream out(path_);
  out << nlohmann::json{{"total", total}, {"ops", ops}}.dump(1) << "\n";
  if (!out) CAIRN_WARN("CAIRN_COUNT_OPS: could not write ", path_);
}

}  // namespace cairn
