#include "trainer/RunPlan.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/Error.h"

namespace cairn {

RunPlan RunPlan::forShard(const TrainOptions& opt, int64_t shard, int64_t test) {
  RunPlan plan;
  plan.steps_per_epoch = shard / opt.batch_size;
  if (plan.steps_per_epoch == 0)
    CAIRN_THROW(BadInput, "job.json: training_definition.batch_size (", opt.batch_size,
                ") exceeds this cluster's shard of ", shard, " samples");
  plan.total_steps = opt.epochs > 0 ? opt.epochs * plan.steps_per_epoch : opt.max_steps;
  if (opt.max_steps > 0) plan.total_steps = std::min(plan.total_steps, opt.max_steps);
  plan.eval_batches = (test + opt.eval_batch_size - 1) / opt.eval_batch_size;
  return plan;
}

RunPlan RunPlan::receiveFromUpstream(TimedLink& link) {
  StagePacket packet = link.receive(Neighbour::kUpstream, PacketKind::kControl, 0, 0, "plan");
  return fromText(packet.text);
}

RunPlan RunPlan::fromText(const std::string& text, const std::string& where) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  auto integer = [&](const nlohmann::json& v, const std::string& what, int64_t least) {
    if (!v.is_number_integer() || v.get<int64_t>() < least)
      CAIRN_THROW(BadInput, "malformed ", where, " (", what,
                  " must be an integer >= ", least, "): ", text);
    return v.get<int64_t>();
  };
  if (j.is_discarded() || !j.is_object() || !j.contains("total_steps"))
    CAIRN_THROW(BadInput, "malformed ", where, ": ", text);
  RunPlan plan;
  plan.total_steps = integer(j["total_steps"], "total_steps", 0);
  plan.steps_per_epoch = integer(j.value("steps_per_epoch", nlohmann::json()), "steps_per_epoch", 1);
  plan.eval_batches = integer(j.value("eval_batches", nlohmann::json()), "eval_batches", 0);
  if (j.contains("epoch_steps")) {
    const nlohmann::json& t = j["epoch_steps"];
    if (!t.is_array())
      CAIRN_THROW(BadInput, "malformed ", where, " (epoch_steps must be an array): ", text);
    for (size_t i = 0; i < t.size(); ++i) {
      const std::string at = "epoch_steps[" + std::to_string(i) + "]";
      if (!t[i].is_array() || t[i].size() != 2)
        CAIRN_THROW(BadInput, "malformed ", where, " (", at,
                    " must be [from_epoch, steps]): ", text);
      plan.epoch_steps.push_back({integer(t[i][0], at + ".from_epoch", 0),
                                  integer(t[i][1], at + ".steps", 1)});
    }
    validateEpochSteps(plan.epoch_steps, where + ": epoch_steps");
    if (j.contains("first_step"))
      plan.first_step = integer(j["first_step"], "first_step", 0);
    if (plan.first_step > plan.total_steps)
      CAIRN_THROW(BadInput, "malformed ", where, " (first_step ", plan.first_step,
                  " is past total_steps ", plan.total_steps, "): ", text);
    if (plan.epoch_steps.front().steps != plan.steps_per_epoch)
      CAIRN_THROW(BadInput, "malformed ", where, " (steps_per_epoch ",
                  plan.steps_per_epoch, " is not epoch_steps[0].steps ",
                  plan.epoch_steps.front().steps, "): ", text);
  }
  return plan;
}

std::string RunPlan::toText() const {
  nlohmann::json j = {{"total_steps", total_steps},
                      {"steps_per_epoch", steps_per_epoch},
                      {"eval_batches", eval_batches}};
  if (!epoch_steps.empty()) {
    nlohmann::json t = nlohmann::json::array();
    for (const EpochSteps& e : epoch_steps) t.push_back({e.from_epoch, e.steps});
    j["epoch_steps"] = t;
    if (first_step > 0) j["first_step"] = first_step;
  }
  return j.dump();
}

void RunPlan::sendDownstream(TimedLink& link) const {
  StagePacket packet;
  packet.kind = PacketKind::kControl;
  packet.tag = "plan";
  packet.text = toText();
  link.send(Neighbour::kDownstream, packet);
}

}  // namespace cairn
