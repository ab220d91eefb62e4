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
  nlohmann::json j = nlohmann::json::parse(packet.text, nullptr, false);
  if (j.is_discarded() || !j.contains("total_steps"))
    CAIRN_THROW(BadInput, "malformed run plan from upstream: ", packet.text);
  RunPlan plan;
  plan.total_steps = j["total_steps"].get<int64_t>();
  plan.steps_per_epoch = j["steps_per_epoch"].get<int64_t>();
  plan.eval_batches = j["eval_batches"].get<int64_t>();
  return plan;
}

void RunPlan::sendDownstream(TimedLink& link) const {
  StagePacket packet;
  packet.kind = PacketKind::kControl;
  packet.tag = "plan";
  packet.text = nlohmann::json{{"total_steps", total_steps},
                               {"steps_per_epoch", steps_per_epoch},
                               {"eval_batches", eval_batches}}
                    .dump();
  link.send(Neighbour::kDownstream, packet);
}

}  // namespace cairn
