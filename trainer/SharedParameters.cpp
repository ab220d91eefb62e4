#include "trainer/SharedParameters.h"

#include <algorithm>
#include <set>

#include "core/Error.h"
#include "trainer/ClusterSync.h"
#include "trainer/StageExecutor.h"

namespace cairn {
namespace {

const std::string kSharedPrefix = "__shared:";

std::string shapeText(const torch::Tensor& t) {
  std::string out = "[";
  for (int64_t d = 0; d < t.dim(); ++d) out += (d ? ", " : "") + std::to_string(t.size(d));
  return out + "] " + std::string(c10::toString(t.scalar_type()));
}

}  // namespace

void checkSharedParameters(const NodeSpec& node, const TrainOptions& options,
                           const std::string& job_path) {
  if (node.shared_parameters.empty() || options.schedule != ScheduleKind::kAsync) return;
  CAIRN_THROW(BadInput, job_path, ": training_definition.schedule is \"async\", but node ",
              node.name, " shares parameter ", node.shared_parameters.front().name,
              " with other stages (node.json shared_parameters), and the async schedule cannot "
              "keep its copies equal (each stage steps on its own); use schedule \"sync\", or "
              "re-run clusterize with this job (it keeps such a parameter in one stage for the "
              "async schedule)");
}

SharedParameters::SharedParameters(TrainerContext& ctx, TimedLink& link)
    : ctx_(ctx), link_(link), stage_(ctx.cfg.node.stage) {
  std::map<std::string, torch::Tensor> parameters;
  for (const auto& p : ctx_.executor.module().named_parameters(true)) parameters[p.name] = p.value;
  for (const SharedParameterSpec& spec : ctx_.cfg.node.shared_parameters) {
    Group g;
    g.name = spec.name;
    g.first = spec.stages.front();
    g.last = spec.stages.back();
    if (!spec.local_name.empty()) {
      const auto it = parameters.find(spec.local_name);
      if (it == parameters.end())
        CAIRN_THROW(BadInput, "node.json of ", ctx_.cfg.node.name, ": shared parameter ",
                    spec.local_name, " is not a parameter of ", ctx_.cfg.node.stage_file);
      g.copy = it->second;
      g.first_holder = stage_ == g.first;
    }
    groups_.push_back(std::move(g));
  }
  checkSharedParameters(ctx_.cfg.node, ctx_.opt, "job.json");
}

std::vector<SharedParameters::Group*> SharedParameters::across(int upper) {
  std::vector<Group*> out;
  for (Group& g : groups_)
    if (g.first <= upper && upper < g.last) out.push_back(&g);
  return out;
}

void SharedParameters::send(Neighbour to, int upper, int64_t step, const char* tag,
                            const std::function<torch::Tensor(Group&)>& value) {
  const auto groups = across(upper);
  if (groups.empty()) return;
  StagePacket p;
  p.kind = PacketKind::kControl;
  p.step = uint64_t(step);
  p.tag = tag;
  for (Group* g : groups) {
    torch::Tensor t = value(*g);
    if (t.defined()) p.tensors.emplace_back(kSharedPrefix + g->name, t.detach());
  }
  link_.send(to, p);
}

void SharedParameters::receive(Neighbour from, int upper, int64_t step, const char* tag,
                               bool all_required,
                               const std::function<void(Group&, const torch::Tensor&)>& take) {
  const auto groups = across(upper);
  if (groups.empty()) return;
  const StagePacket p = link_.receive(from, PacketKind::kControl, uint64_t(step), 0, tag);
  const NodeSpec& node = ctx_.cfg.node;
  const std::string peer = from == Neighbour::kUpstream ? node.upstream->name : node.downstream->name;
  std::set<std::string> expected;
  for (Group* g : groups) expected.insert(kSharedPrefix + g->name);
  for (const auto& [name, t] : p.tensors)
    if (!expected.count(name))
      CAIRN_THROW(BadInput, "\"", tag, "\" from ", peer, " carries ", name,
                  ", which is not a shared parameter across that link");
  for (Group* g : groups) {
    if (!p.has(kSharedPrefix + g->name)) {
      if (all_required)
        CAIRN_THROW(BadInput, "\"", tag, "\" from ", peer, " lacks ", kSharedPrefix + g->name);
      continue;
    }
    const torch::Tensor& t = p.tensor(kSharedPrefix + g->name);
    const torch::Tensor& like = g->copy.defined() ? g->copy : g->kept;
    if (like.defined() && (t.sizes() != like.sizes() || t.scalar_type() != like.scalar_type()))
      CAIRN_THROW(BadInput, "\"", tag, "\" from ", peer, ": ", kSharedPrefix + g->name, " is ",
                  shapeText(t), "; this node's copy is ", shapeText(like));
    take(*g, t);
  }
}

void SharedParameters::receivePartials(int64_t step) {
  if (stage_ == ctx_.cfg.node.num_stages - 1) return;
  receive(Neighbour::kDownstream, stage_, step, "shared_partial", true,
          [&](Group& g, const torch::Tensor& partial) {
            if (!g.copy.defined()) {
              g.kept = partial;
              return;
            }
            torch::Tensor& grad = g.copy.mutable_grad();
            const torch::Tensor value = partial.to(g.copy.device());
            if (grad.defined())
              grad.add_(value);
            else
              grad = value.clone();
          });
}

void SharedParameters::sendPartials(int64_t step) {
  if (stage_ == 0) return;
  send(Neighbour::kUpstream, stage_ - 1, step, "shared_partial", [](Group& g) {
    if (!g.copy.defined()) return g.kept;
    return g.copy.grad().defined() ? g.copy.grad() : torch::zeros_like(g.copy);
  });
}

void SharedParameters::shareTotals(int64_t step) {
  if (stage_ > 0)
    receive(Neighbour::kUpstream, stage_ - 1, step, "shared_total", true,
            [&](Group& g, const torch::Tensor& total) {
              if (!g.copy.defined()) {
                g.kept = total;
                return;
              }
              torch::Tensor& grad = g.copy.mutable_grad();
              if (grad.defined())
                grad.copy_(total);
              else
                grad = total.to(g.copy.device()).clone();
            });
  if (stage_ + 1 < ctx_.cfg.node.num_stages)
    send(Neighbour::kDownstream, stage_, step, "shared_total", [](Group& g) {
      if (!g.copy.defined()) return g.kept;
      return g.copy.grad().defined() ? g.copy.grad() : torch::zeros_like(g.copy);
    });
}

std::vector<torch::Tensor> SharedParameters::withoutCopies(
    const std::vector<torch::Tensor>& parameters) const {
  std::set<const c10::TensorImpl*> copies;
  for (const Group& g : groups_)
    if (g.copy.defined() && !g.first_holder) copies.insert(g.copy.unsafeGetTensorImpl());
  std::vector<torch::Tensor> out;
  for (const auto& p : parameters)
    if (!copies.count(p.unsafeGetTensorImpl())) out.push_back(p);
  return out;
}

void SharedParameters::shareWeights(int64_t step, const char* tag, bool always) {
  // Without a ClusterSync nothing but the optimizer writes the weights: the copies stay equal.
  if (groups_.empty() || !ctx_.cfg.cluster_sync) return;
  const uint64_t version = ctx_.cfg.cluster_sync->weightsVersion();
  const bool changed = always || version != weights_sent_version_;
  weights_sent_version_ = version;
  for (Group& g : groups_) g.kept = torch::Tensor();
  torch::NoGradGuard no_grad;
  if (stage_ > 0)
    receive(Neighbour::kUpstream, stage_ - 1, step, tag, always,
            [&](Group& g, const torch::Tensor& weights) {
              if (g.copy.defined()) g.copy.copy_(weights);
              g.kept = weights;  // passed on below (a holder's copy now equals it)
            });
  if (stage_ + 1 < ctx_.cfg.node.num_stages)
    send(Neighbour::kDownstream, stage_, step, tag, [&](Group& g) {
      if (g.first_holder) return changed ? g.copy : torch::Tensor();
      return g.kept;
    });
}

}  // namespace cairn
