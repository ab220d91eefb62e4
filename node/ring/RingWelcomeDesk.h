// RingWelcomeDesk: join requests answered between syncs (docs/PROTOCOL.md "Ring membership").
// A welcome used to leave only at the admitting member's next sync. A joiner waits for it before
// it trains, and its cluster's pipeline waits for the joiner; when the admitting member is itself
// blocked in a pipeline wait that depends (through another ring's sync) on the joiner's cluster,
// its next sync never comes: a wait cycle that only the peer timeouts end (every node fails).
// So a ring member keeps what a welcome needs as of its last committed sync, and answers from it
// at any time:
//   keepWelcomeSnapshot  after every committed admitting sync (and at start()): a copy of the
//                        ring's tensors, generation, transactions and step, kept only while the
//                        view lacks some member (someone may ask to join) and the mode is not
//                        "gradients" (its parameters move at every step, past any sync's copy);
//   welcomeBetweenSyncs  when this node is alone in the ring's view and the snapshot is still the
//                        ring's state (same generation and transactions): every member that asked
//                        is welcomed from the snapshot into generation g+1, and this node moves to
//                        that generation and view at once; its next sync is the joiner's first,
//                        exactly as after a welcome sent at a sync (the joiner's state is the
//                        state of this node's last sync, which its next sync starts from: DiLoCo's
//                        θ_prev and momentum included). A view of several members still admits at
//                        a sync: admitting between syncs would need their agreement.
//   WelcomeDesk          the thread that does it while the trainer is outside the ring calls
//                        (blocked in a pipeline wait, or computing): it looks at the mailbox only
//                        while some ring is ready (alone, with its snapshot: Ring::welcome_ready)
//                        and RingClusterSync is idle (`busy` is 0), takes that ring's join
//                        requests, and serves them only with RingClusterSync's ring lock
//                        (try_lock: it never waits on it, and puts a request back when the
//                        trainer took the lock first).
// Ownership: WelcomeDesk owns its thread and borrows the context, the rings, the lock and the
// busy count (RingClusterSync's; they outlive it). Thread-safety: keepWelcomeSnapshot and
// welcomeBetweenSyncs need the ring's exclusive use (its ring thread in a sync, or the desk
// holding the ring lock); WelcomeDesk is made and destroyed on the trainer's thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "node/ring/RingState.h"

namespace cairn {

// After a committed admitting sync (or at start()): keep (or drop) the ring's welcome snapshot.
void keepWelcomeSnapshot(RingContext& context, Ring& ring);

// A welcome decided between syncs: whom to send it to, and the message.
struct PendingWelcome {
  std::vector<std::string> joiners;
  Message message;
};
// The welcome this node gives now from the ring's snapshot (see above), having moved the ring to
// the next generation with the joiners; nullopt when it cannot (not alone, no current snapshot,
// nobody asked). The caller sends it (sendWelcome) once it released the ring.
std::optional<PendingWelcome> welcomeBetweenSyncs(RingContext& context, Ring& ring);

class WelcomeDesk {
 public:
  // `rings`: every ring of the node (the list never changes; their contents only under
  // `rings_mutex`); `busy`: how many ring calls of the trainer are under way (raised before they
  // take `rings_mutex`, lowered after they release it).
  WelcomeDesk(RingContext& context, std::vector<Ring*> rings, std::recursive_mutex& rings_mutex,
              const std::atomic<int>& busy);
  ~WelcomeDesk();  // stops the thread (within one receive poll, 100 ms)
  WelcomeDesk(const WelcomeDesk&) = delete;
  WelcomeDesk& operator=(const WelcomeDesk&) = delete;

 private:
  void run();
  bool anyReady() const;
  bool idle();  // one poll's wait, cut short by the stop; true when stopped
  // One join request taken from the mailbox: put back when the rings are busy, else noted and,
  // where possible, answered.
  void serve(Message m);

  RingContext& context_;
  std::map<std::string, Ring*> tags_;  // each ring's control tag → the ring (never changes)
  std::recursive_mutex& rings_mutex_;
  const std::atomic<int>& busy_;
  std::mutex stop_mutex_;
  std::condition_variable stop_changed_;
  bool stop_ = false;  // under stop_mutex_
  std::thread thread_;
};

}  // namespace cairn
