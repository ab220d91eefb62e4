#include "node/ring/GradientOverlap.h"

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "core/Error.h"
#include "core/Log.h"
#include "node/ring/RingSyncMath.h"
#include "node/ring/RingTransaction.h"
#include "trainer/Device.h"

namespace cairn {

// What the hooks (autograd thread) and the communication thread share for one ring. The hooks
// hold it by shared_ptr, so a hook that outlived its GradientOverlap would find it disarmed.
struct GradientOverlap::Readiness {
  // A gradient bucket a hook copied out: its flat gradients and its weights' largest magnitudes
  // (checkGradientContribution), each a copy to the host that may still be under way.
  struct Staged {
    HostCopy gradients;
    HostCopy weight_largest;
    std::exception_ptr error;  // what flattening or starting the copies threw
  };

  std::mutex mutex;
  std::condition_variable changed;
  bool armed = false;          // this backward is the step's last: AccumulateGrad means final
  bool backward_done = false;  // complete(): every bucket counts as final
  bool cancelled = false;
  std::vector<int> bucket_of;   // per ring tensor: its gradient bucket, or -1
  std::vector<char> ready;      // per ring tensor: AccumulateGrad ran in this backward
  std::vector<int> missing;     // per gradient bucket: hooked members not ready yet
  std::vector<int> hooked;      // per gradient bucket: members with a hook
  // Copying out in backward (a placement whose copies run behind the host; set by arm): the hook
  // that finishes a bucket flattens it on the device and starts its copy to the host there, on
  // the stream backward runs on, right behind the kernels that computed it.
  const RingBuckets* buckets = nullptr;            // set by hook()
  std::shared_ptr<const TensorPlacement> stager;   // null: the communication thread flattens
  std::vector<char> copying;                       // per gradient bucket: a hook started its copy
  std::vector<char> copied;                        // ... and `staged` holds it (or its error)
  std::vector<Staged> staged;

  // On the autograd thread, outside the mutex: bucket `b`'s copy out, then the thread told.
  void copyOut(size_t b, const std::shared_ptr<const TensorPlacement>& placement) {
    Staged out;
    try {
      torch::NoGradGuard no_grad;
      const RingBucket& bucket = buckets->gradient_buckets[b];
      out.gradients = placement->toHostLater(buckets->flattenInPlace(bucket, true));
      out.weight_largest = placement->toHostLater(bucketWeightMagnitudes(*buckets, bucket));
    } catch (...) {  // never into backward: the communication thread rethrows it
      out.error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mutex);
    staged[b] = std::move(out);
    copied[b] = 1;
    changed.notify_all();
  }
};

struct GradientOverlap::PerRing {
  Ring* ring = nullptr;
  std::shared_ptr<Readiness> readiness = std::make_shared<Readiness>();
  bool hooked = false;
  std::vector<std::pair<uintptr_t, std::shared_ptr<torch::autograd::Node>>> hooks;
  // One armed step (written by the communication thread, read after join):
  std::thread worker;
  std::vector<torch::Tensor> before;  // per bucket: flat gradients before its all-reduce
  // Per bucket copied out in backward: its averaged flat gradients, written back by complete()
  // (after backward: on a GPU a copy back now would wait for the rest of backward).
  std::vector<torch::Tensor> averaged;
  size_t in_backward = 0;             // buckets started while backward still ran (statistics)
  std::exception_ptr error;
};

GradientOverlap::GradientOverlap(RingContext& context) : context_(context) {}

GradientOverlap::~GradientOverlap() {
  cancel();
  for (auto& entry : rings_) unhook(*entry.second);
}

void GradientOverlap::hook(PerRing& r) {
  Ring& ring = *r.ring;
  Readiness& s = *r.readiness;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.buckets = &ring;
    s.bucket_of.assign(ring.tensors.size(), -1);
    s.ready.assign(ring.tensors.size(), 0);
    s.hooked.assign(ring.gradient_buckets.size(), 0);
    s.missing.assign(ring.gradient_buckets.size(), 0);
  }
  for (size_t b = 0; b < ring.gradient_buckets.size(); ++b)
    for (size_t i : ring.gradient_buckets[b].members) {
      s.bucket_of[i] = int(b);
      const torch::Tensor& t = ring.tensors[i];
      // A parameter that needs no gradient never gets one: its bucket need not wait for it.
      if (!t.requires_grad() || !t.is_leaf()) continue;
      std::shared_ptr<torch::autograd::Node> accumulator =
          torch::autograd::impl::grad_accumulator(t);
      if (!accumulator) continue;
      std::shared_ptr<Readiness> shared = r.readiness;
      const uintptr_t key =
          accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
              [shared, i](const torch::autograd::variable_list& outputs,
                          const torch::autograd::variable_list&) {
                int finished = -1;
                std::shared_ptr<const TensorPlacement> stager;
                {
                  std::lock_guard<std::mutex> lock(shared->mutex);
                  if (shared->armed && !shared->ready[i]) {
                    shared->ready[i] = 1;
                    const int bucket = shared->bucket_of[i];
                    if (bucket >= 0 && --shared->missing[size_t(bucket)] == 0) {
                      finished = bucket;
                      stager = shared->stager;
                      if (stager) shared->copying[size_t(bucket)] = 1;
                      shared->changed.notify_all();
                    }
                  }
                }
                if (finished >= 0 && stager) shared->copyOut(size_t(finished), stager);
                return outputs;
              }));
      r.hooks.emplace_back(key, std::move(accumulator));
      ++s.hooked[b];
    }
  r.hooked = true;
}

void GradientOverlap::unhook(PerRing& r) {
  for (auto& [key, accumulator] : r.hooks) accumulator->del_post_hook(key);
  r.hooks.clear();
  r.hooked = false;
}

void GradientOverlap::arm(const std::vector<Ring*>& rings) {
  const at::ThreadLocalState torch_state;  // grad mode and the like, as on the trainer thread
  const int threads = at::get_num_threads();
  for (Ring* ring : rings) {
    CAIRN_ENFORCE(ring->group, "gradient overlap armed for ring ", ring->spec.id,
                  " without a group");
    auto& slot = rings_[ring];
    if (!slot) {
      slot = std::make_unique<PerRing>();
      slot->ring = ring;
    }
    PerRing& r = *slot;
    if (r.worker.joinable()) continue;  // already armed for this step
    if (!r.hooked) hook(r);
    Readiness& s = *r.readiness;
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      std::fill(s.ready.begin(), s.ready.end(), 0);
      s.missing = s.hooked;
      s.backward_done = false;
      s.cancelled = false;
      s.stager = context_.placement && context_.placement->copiesLater() ? context_.placement
                                                                         : nullptr;
      s.copying.assign(ring->gradient_buckets.size(), 0);
      s.copied.assign(ring->gradient_buckets.size(), 0);
      s.staged.assign(ring->gradient_buckets.size(), Readiness::Staged());
      s.armed = true;
    }
    r.before.assign(ring->gradient_buckets.size(), torch::Tensor());
    r.averaged.assign(ring->gradient_buckets.size(), torch::Tensor());
    r.in_backward = 0;
    r.error = nullptr;
    // The communication thread: buckets in order, each once all of it is final.
    r.worker = std::thread([&r, torch_state, threads] {
      at::ThreadLocalStateGuard guard(torch_state);
      at::set_num_threads(threads);  // the intra-op threads the job configured, not the default
      Readiness& st = *r.readiness;
      try {
        for (size_t b = 0; b < r.before.size(); ++b) {
          bool during_backward = false;
          std::optional<Readiness::Staged> staged;
          {
            std::unique_lock<std::mutex> lock(st.mutex);
            // A bucket a hook is copying out waits for that copy, even after backward ended.
            st.changed.wait(lock, [&] {
              return st.cancelled || (st.copying[b] ? st.copied[b] != 0
                                                    : st.backward_done || st.missing[b] == 0);
            });
            if (st.cancelled) return;
            during_backward = !st.backward_done;
            if (st.copying[b]) staged = std::move(st.staged[b]);
          }
          if (!staged) {
            averageGradientBucket(*r.ring, *r.ring->group, b, &r.before[b]);
          } else {
            if (staged->error) std::rethrow_exception(staged->error);
            staged->gradients.wait();
            staged->weight_largest.wait();
            averageFlatGradients(*r.ring, *r.ring->group, r.ring->gradient_buckets[b],
                                 staged->gradients.host, &r.before[b],
                                 &staged->weight_largest.host);
            r.averaged[b] = staged->gradients.host;
          }
          if (during_backward) ++r.in_backward;
        }
      } catch (...) {
        r.error = std::current_exception();
      }
    });
  }
}

bool GradientOverlap::armed(const Ring* ring) const {
  auto it = rings_.find(ring);
  return it != rings_.end() && it->second->worker.joinable();
}

bool GradientOverlap::anyArmed() const {
  for (const auto& entry : rings_)
    if (entry.second->worker.joinable()) return true;
  return false;
}

void GradientOverlap::stop(PerRing& r) {
  Readiness& s = *r.readiness;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.armed = false;
    s.cancelled = true;
  }
  s.changed.notify_all();
  if (r.worker.joinable()) r.worker.join();
}

void GradientOverlap::cancel() {
  for (auto& entry : rings_) stop(*entry.second);
}

void GradientOverlap::forget(const Ring* ring) {
  auto it = rings_.find(ring);
  if (it == rings_.end()) return;
  stop(*it->second);
  unhook(*it->second);
  rings_.erase(it);
}

void GradientOverlap::complete(Ring& ring) {
  auto it = rings_.find(&ring);
  CAIRN_ENFORCE(it != rings_.end() && it->second->worker.joinable(),
                "gradient overlap completed for ring ", ring.spec.id, " without being armed");
  PerRing& r = *it->second;
  Readiness& s = *r.readiness;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.armed = false;  // hooks of later backwards (next step's micro-batches) mean nothing
    s.backward_done = true;
  }
  s.changed.notify_all();
  r.worker.join();
  context_.countStats([&](RingClusterSyncStats& st) {
    ++st.overlapped_gradient_syncs;
    st.buckets_reduced_in_backward += int64_t(r.in_backward);
    st.buckets_copied_in_backward +=
        std::count_if(r.averaged.begin(), r.averaged.end(),
                      [](const torch::Tensor& t) { return t.defined(); });
  });
  bool work_done = false;
  try {
    if (r.error) std::rethrow_exception(r.error);
    for (size_t b = 0; b < r.averaged.size(); ++b)
      if (r.averaged[b].defined()) ring.unflatten(ring.gradient_buckets[b], r.averaged[b], true);
    work_done = true;
    ring.group->barrier();  // the commit
  } catch (const PeerLost& e) {
    // As transact. A redo starts from the gradients backward left (buckets never started were
    // never touched), then syncs again among the survivors, the ordinary way.
    const bool stands = settleLoss(context_, ring, e, work_done, [&] {
      for (size_t b = 0; b < r.before.size(); ++b)
        if (r.before[b].defined()) ring.unflatten(ring.gradient_buckets[b], r.before[b], true);
      r.before.clear();
    });
    r.averaged.clear();
    if (!stands) {
      transact(context_, ring, /*gradients=*/true, /*admit=*/false,
               [&ring] { averageGradients(ring, *ring.group); });
      return;
    }
  }
  r.before.clear();
  r.averaged.clear();
  commitTransaction(ring);
}

}  // namespace cairn
