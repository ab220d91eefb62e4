#include "node/VolunteerAssignment.h"

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
  if (a.checkpoint)
    bad("it asks to resume from its checkpoint of step " + std::to_string(a.checkpoint_step) +
        ", and a volunteer cannot take over a stage from an uploaded checkpoint yet (a fresh "
        "assignment, without one, works)");
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
  return out;
}

}  // namespace cairn
