#include "node/volunteer/VolunteerAssignment.h"

#include <cstdio>
#include <sstream>

#include "core/Error.h"

namespace cairn {

std::string describeCoordinator(const Invite& invite) {
  return "the coordinator at " + invite.address() + " (key " + invite.coordinator_key + ")";
}

std::string whyNotANodeName(const std::string& name) {
  if (name.empty() || name.size() > 128) return "must be 1 to 128 characters";
  if (name == "." || name == "..") return "must not be \".\" or \"..\"";
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == '.';
    if (!ok) return "must use only letters, digits, '_', '-' and '.'";
  }
  return "";
}

CheckedAssignment checkAssignment(const Assignment& a, const std::string& accepted_name,
                                  const std::string& own_public_key,
                                  const std::string& coordinator) {
  auto bad = [&](const std::string& what) {
    CAIRN_THROW(BadInput, coordinator, " sent an assignment this volunteer cannot use: ", what);
  };
  if (a.checkpoint && a.checkpoint_step < 0)
    bad("it carries a checkpoint but no checkpoint_step (>= 0) saying which step it is");
  if (a.name != accepted_name)
    bad("it is for \"" + a.name + "\" but the coordinator accepted this volunteer as \"" +
        accepted_name + "\"");
  CheckedAssignment out;
  try {
    out.node = parseNodeSpec(a.node, "coordinator assignment: node.json");
    out.job = parseJobSpec(a.job, "coordinator assignment: job.json");
  } catch (const BadInput& e) {
    bad(e.what());
  }
  if (out.node.name != a.name)
    bad("coordinator assignment: node.json: name is \"" + out.node.name + "\", not \"" + a.name +
        "\"");
  if (const std::string why = whyNotANodeName(a.name); !why.empty())
    bad("the name \"" + a.name + "\" " + why);
  if (out.node.job_id != out.job.job_id)
    bad("coordinator assignment: node.json: job_id \"" + out.node.job_id +
        "\" differs from job.json's \"" + out.job.job_id + "\"");
  const nlohmann::json& extra = out.node.extra;
  if (extra.contains("public_key") &&
      (!extra["public_key"].is_string() || extra["public_key"].get<std::string>() != own_public_key))
    bad("coordinator assignment: node.json: extra.public_key is " + extra["public_key"].dump() +
        ", not this volunteer's key " + own_public_key);
  try {
    std::istringstream bytes(a.stage);
    torch::jit::load(bytes);
  } catch (const c10::Error& e) {
    bad("its stage (" + std::to_string(a.stage.size()) + " bytes) does not load as TorchScript: " +
        std::string(e.what_without_backtrace()).substr(0, 300));
  }
  out.node.extra["num_clusters"] = a.num_clusters;
  out.node.extra["public_key"] = own_public_key;
  out.stage = a.stage;
  out.checkpoint = a.checkpoint;
  out.checkpoint_step = a.checkpoint_step;
  return out;
}

NodeSpec checkPeersUpdate(const PeersUpdate& update, const NodeSpec& current,
                          const std::string& own_public_key, const std::string& coordinator) {
  auto bad = [&](const std::string& what) {
    CAIRN_THROW(BadInput, coordinator, " sent a peers update this volunteer cannot use: ", what);
  };
  if (update.name != current.name)
    bad("it is for \"" + update.name + "\" but this volunteer holds \"" + current.name + "\"");
  NodeSpec node;
  try {
    node = parseNodeSpec(update.node, "coordinator peers: node.json");
  } catch (const BadInput& e) {
    bad(e.what());
  }
  if (node.name != current.name || node.job_id != current.job_id || node.cluster != current.cluster ||
      node.stage != current.stage || node.num_stages != current.num_stages ||
      node.role != current.role || node.stage_file != current.stage_file)
    bad("its node.json is another node (name, job_id, cluster, stage, role or stage file differ "
        "from " + current.name + "'s); only the peers' addresses and keys may change");
  if (node.address != current.address)
    bad("it moves this node itself from " + current.address + " to " + node.address);
  const nlohmann::json& extra = node.extra;
  if (extra.contains("public_key") &&
      (!extra["public_key"].is_string() || extra["public_key"].get<std::string>() != own_public_key))
    bad("node.json: extra.public_key is " + extra["public_key"].dump() + ", not this volunteer's key " +
        own_public_key);
  node.extra["public_key"] = own_public_key;
  if (current.extra.contains("num_clusters")) node.extra["num_clusters"] = current.extra["num_clusters"];
  return node;
}

std::string whyTooBigForVolunteer(const NodeSpec& node, double memory_gb) {
  const double need_gb = node.estimated_memory_bytes / 1e9;
  if (memory_gb <= 0 || need_gb <= memory_gb) return "";
  char figures[160];
  std::snprintf(figures, sizeof figures, "needs an estimated %.2f GB and this volunteer gives "
                "%.2f GB (--memory-gb)", need_gb, memory_gb);
  return "refused node " + node.name + ": its stage " + figures;
}

}  // namespace cairn
