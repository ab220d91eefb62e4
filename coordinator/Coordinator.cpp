#include "coordinator/Coordinator.h"


#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <vector>

#include "coordinator/Admissions.h"
#include "coordinator/CheckpointUploads.h"
#include "coordinator/ChunkServer.h"
#include "coordinator/ChunkService.h"
#include "coordinator/CoordinatorInvite.h"
#include "coordinator/ConnectionWatch.h"
#include "coordinator/CoordinatorStore.h"
#include "coordinator/Grower.h"
#include "coordinator/Growth.h"
#include "coordinator/JoinPolicy.h"
#include "coordinator/MemberReplacer.h"
#include "coordinator/NodeHeaders.h"
#include "coordinator/Outbox.h"
#include "clusterize/ModelMerge.h"
#include "coordinator/Credit.h"
#include "coordinator/FinalResult.h"
#include "coordinator/CoordinatorRelay.h"
#include "coordinator/Gathering.h"
#include "coordinator/RunAssembly.h"
#include "coordinator/RunView.h"
#include "coordinator/TerminalView.h"
#include "coordinator/VolunteerRelays.h"
#include "core/CurveKeys.h"
#include "core/Error.h"
#include "core/JsonReader.h"
#include "core/Log.h"
#include "core/NodeConfigs.h"
#include "core/NodeData.h"
#include "node/volunteer/CoordinationSocket.h"
#include "node/transport/CurveSecurity.h"
#include "node/transport/ZmqSockets.h"

namespace cairn::coordinator {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMaxBandwidthProbeBytes = size_t(64) << 20;

}  // namespace

struct Coordinator::Impl {
  CoordinatorOptions o;
  clusterize::PreparedModel prepared;
  std::unique_ptr<CoordinatorStore> store;
  std::unique_ptr<MemberReplacer> replacer;  // lost volunteers → spares
  std::unique_ptr<Gathering> gathering;      // the first plan, made off the loop (after replacer)
  std::unique_ptr<Grower> grower;            // spares → a new cluster (--grow)
  std::unique_ptr<CoordinatorRelay> relay;   // --relay: links between dial-out-only volunteers
  std::unique_ptr<VolunteerRelays> relays;   // the volunteers' relays (provider --relay), and --relay's
  uint64_t relay_synced = ~uint64_t{0};      // the members' version the relay's links are from
  uint64_t view_links = 0;                    // the relays' linksViewVersion() the view shows
  std::unique_ptr<ChunkServer> chunks;       // data.source "coordinator": made on first request
  std::unique_ptr<NodeHeaders> chunk_nodes;  // the askers' clusters (chunks' worker, like `chunks`)
  CurveKeyPair keys;
  std::string token;
  std::string invite;
  zmq::context_t context;
  std::unique_ptr<ZapAuthenticator> zap;  // before the ROUTER, destroyed after it
  zmq::socket_t router;
  zmq::socket_t router_monitor;  // the ROUTER's closed connections, for `connections`
  ConnectionWatch connections;   // which members' connections all closed (ConnectionWatch.h)
  std::unique_ptr<ChunkService> chunk_service;  // answers chunk requests off this loop (after router)
  std::map<std::string, std::string> routes;  // public key → routing id of its last message
  std::map<std::string, std::string> beat_routes;  // … of its last heartbeat (a member's)
  std::unique_ptr<Admissions> admissions;  // joins waiting for the dial-back; after the context
  CoordinatorStats stats;
  std::unique_ptr<FloodGuard> floods;  // every message is charged to its key first
  std::unique_ptr<RunView> view;  // the run as seen from here (RunView.h)
  bool view_placed = false;       // the plan's nodes are placed in the view
  bool credit_changed = true;     // the view's credit table is to be recomputed (syncView)
  std::optional<uint64_t> view_members;  // the store's membersVersion() the view last synced
  Clock::time_point view_synced, housekept;  // syncView's last turn; run()'s planning/replacing
  Clock::time_point heard_flushed;            // heartbeats' times last written

  // The plan's nodes for the view (none while gathering).
  std::vector<Placement> placement() {
    std::vector<Placement> out;
    if (phase() == "gathering") return out;
    NodeHeaders headers(o.out);
    for (const std::string& name : placed()) {
      const NodeSpec& node = headers.header(name);
      out.push_back({name, node.cluster, node.stage, node.num_stages});
    }
    return out;
  }

  // Members, phase and placement into the view, at most once a second (off the message path).
  void syncView(bool now = false) {
    if (!now && Clock::now() - view_synced < std::chrono::seconds(1)) return;
    view_synced = Clock::now();
    if (credit_changed) view->setCredit(creditJson(store->creditTotals(), store->members()));
    credit_changed = false;
    const std::string p = phase();
    view->setPhase(p);
    if (view_members != store->membersVersion()) {  // the rows moved (not a heartbeat's time)
      view_members = store->membersVersion();
      view->syncMembers(store->members(), unixNow());
    }
    if (view_placed || p == "gathering") return;
    view_placed = true;
    for (const Placement& node : placement()) view->place(node);
    if (const auto n = store->meta("num_clusters")) view->setNumClusters(std::stoi(*n));
  }

  // What a member says about itself, for the view (the speaker check is handle()'s).
  void observe(const ToCoordinator& m, const std::optional<Member>& member) {
    if (!member) return;
    const double now = unixNow();
    if (const auto* beat = std::get_if<Heartbeat>(&m); beat && beat->name == member->name)
      view->heartbeat(beat->name, beat->state, beat->step, now);
    if (const auto* leaving = std::get_if<LeavingNotice>(&m); leaving && leaving->name == member->name)
      view->event(leaving->name, "leaving", leaving->reason, now);
    if (const auto* result = std::get_if<ResultUpload>(&m); result && result->name == member->name)
      view->event(result->name, "result", std::to_string(result->trained_stage.size()) + " bytes", now);
  }

  std::string phase() const { return store->meta("phase").value_or("gathering"); }

  // Group commit (Outbox.h): replies wait for the batch of store writes they acknowledge.
  std::unique_ptr<Outbox> outbox;
  std::unique_ptr<CheckpointUploads> checkpoints;  // written off this loop (CheckpointWriter.h)
  void send(const std::string& routing_id, const Frames& frames) { outbox->send(routing_id, frames); }

  void reply(const std::string& key, const Frames& frames) {
    auto it = routes.find(key);
    if (it != routes.end()) send(it->second, frames);
  }

  void refuse(const std::string& routing_id, const std::string& who, const std::string& reason) {
    ++stats.refused_joins;
    CAIRN_WARN("coordinator: refused ", who, ": ", reason);
    send(routing_id, encode(Rejected{reason}));
  }

  // The message charged to its key (FloodGuard.h); false: dropped undecoded (answered at most once).
  bool withinBudget(const Routed& r) {
    size_t bytes = 0;
    for (const std::string& frame : r.frames) bytes += frame.size();
    const FloodGuard::Verdict verdict = floods->check(r.user_id, bytes, unixNow());
    stats.flood_dropped = floods->dropped();
    stats.flood_blocked = floods->blockedKeys();
    if (const auto answer = floodAnswer(verdict, floods->limits(), r.user_id))
      send(r.routing_id, encode(*answer));
    return verdict == FloodGuard::Verdict::kTake;
  }

  // The route back to a key (its routing id), for replies sent later (assignments, peers updates,
  // the end of the run). Memory is bounded by the run, not by the keys that ever wrote: past
  // FloodLimits::max_keys routes, those of keys that are not members are forgotten (a key that
  // joins, or speaks again, has its route again).
  void keepRoute(const Routed& r, bool is_member) {
    routes[r.user_id] = r.routing_id;
    if (is_member) connections.heard(r.user_id, r.source_fd);
    if (!is_member && routes.size() > floods->limits().max_keys)
      for (auto it = routes.begin(); it != routes.end();)
        it = store->memberByKey(it->first) ? std::next(it) : routes.erase(it);
    stats.routes = routes.size();
  }

  // The next message on the ROUTER, waiting at most `wait`; the chunk answers that became ready
  // meanwhile are sent on first (ChunkService.h).
  std::optional<Routed> nextMessage(std::chrono::milliseconds wait) {
    zmq::pollitem_t items[] = {{static_cast<void*>(router), 0, ZMQ_POLLIN, 0},
                               {static_cast<void*>(chunk_service->ready()), 0, ZMQ_POLLIN, 0},
                               {nullptr, checkpoints->readyFd(), ZMQ_POLLIN, 0},  // a file written
                               {static_cast<void*>(router_monitor), 0, ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, 4, wait);
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) throw;
      return std::nullopt;
    }
    // Closed connections before the next message: a descriptor reused by a new one closed first.
    uint16_t event = 0;
    uint32_t fd = 0;
    while (readMonitorEvent(router_monitor, &event, &fd))
      if (event == ZMQ_EVENT_DISCONNECTED) connections.closed(int(fd), unixNow());
    if (items[1].revents & ZMQ_POLLIN)
      chunk_service->forward([this](const std::string& routing_id, const Frames& frames) {
        sendRouted(router, routing_id, frames);
      });
    if (!(items[0].revents & ZMQ_POLLIN)) return std::nullopt;
    return recvRouted(router, std::chrono::milliseconds(0), &stats.malformed);
  }

  void handle(Routed& r) {  // its frames' attachments are moved into the message
    ++stats.messages;
    std::string why;
    const std::optional<Member> member = store->memberByKey(r.user_id);
    if (isChunkRequest(r.frames)) {  // a Root fetching its cluster's data (ChunkServer.h)
      // Read on the service's worker (only it touches `chunks`); what the answer depends on in the
      // store is read here, on the loop.
      (void)chunk_service->submit(
          r.routing_id, [this, frames = r.frames, deals = servedDeals(*store),
                         who = member ? std::optional(member->name) : std::nullopt] {
            return serveChunkRequest(&chunks, *chunk_nodes, o.out, frames, who, deals);
          });
      stats.chunk_requests_dropped = chunk_service->dropped();
      return;
    }
    auto message = decodeToCoordinator(std::move(r.frames), o.max_attachment_bytes, &why,
                                       AttachmentChecksum::kLeaveToReceiver);  // CheckpointWriter's
    if (!message) {
      ++stats.malformed;
      CAIRN_WARN("coordinator: dropped a message from ", member ? member->name : "key " + r.user_id,
                 ": ", why);
      send(r.routing_id, encode(Rejected{"malformed message: " + why}));
      return;
    }
    keepRoute(r, member.has_value());
    observe(*message, member);
    if (const auto* join = std::get_if<JoinAsk>(&*message))
      return admissions->onJoin(r, *join, /*run_over=*/phase() == "done");
    if (const auto* probe = std::get_if<BandwidthProbeMsg>(&*message)) {
      if (probe->payload.size() > kMaxBandwidthProbeBytes)
        return refuse(r.routing_id, "a bandwidth probe", "probes are at most 64 MiB");
      // Not held: the volunteer times this answer to measure its bandwidth, and it records nothing.
      sendRouted(router, r.routing_id, encode(BandwidthAck{int64_t(probe->payload.size())}));
      return;
    }
    // Everything else speaks for a member: the key must be that member's.
    auto speaker = [&](const std::string& name) -> bool {
      if (member && member->name == name) return true;
      ++stats.malformed;
      CAIRN_WARN("coordinator: dropped a message claiming to be ", name, " from ",
                 member ? member->name : "key " + r.user_id, " (a volunteer speaks only for itself)");
      send(r.routing_id, encode(notThisMember(member ? member->name : "", name)));
      return false;
    };
    if (const auto* beat = std::get_if<Heartbeat>(&*message)) {
      if (speaker(beat->name)) {
        beat_routes[r.user_id] = r.routing_id;
        store->touch(beat->name, unixNow());
        replacer->onHeartbeat(*member);  // the speaker: its row, read before the touch
        relays->onHeartbeat(*member, *beat, unixNow());
        grower->onHeartbeat(beat->name);
      }
    } else if (const auto* result = std::get_if<ResultUpload>(&*message)) {
      if (speaker(result->name)) onResult(*result);
    } else if (auto* ckpt = std::get_if<CheckpointUpload>(&*message)) {
      if (speaker(ckpt->name)) checkpoints->onUpload(std::move(*ckpt), r.routing_id);
    } else if (const auto* batch = std::get_if<MetricsBatch>(&*message)) {
      if (speaker(batch->name)) {
        grower->observe(batch->name, batch->records);
        std::vector<nlohmann::json> taken;
        send(r.routing_id, encode(view->ingest(*batch, unixNow(), &taken)));
        if (const size_t skipped = creditRecords(*store, member->public_key, batch->name, taken))
          CAIRN_WARN("coordinator: ", skipped, " step record(s) of ", batch->name,
                     " were malformed or out of bounds: not credited");
        credit_changed = true;
      }
    } else if (const auto* leaving = std::get_if<LeavingNotice>(&*message)) {
      if (speaker(leaving->name)) {
        CAIRN_WARN("coordinator: ", leaving->name, " is leaving (", leaving->reason, ")");
        store->setState(leaving->name, MemberState::kLeft);
      }
    }
  }

  std::vector<std::string> placed() const {
    const std::string text = store->meta("placed").value_or("[]");  // none before the plan
    return nlohmann::json::parse(text).get<std::vector<std::string>>();
  }

  void onResult(const ResultUpload& r) {
    const std::vector<std::string> names = placed();
    if (std::find(names.begin(), names.end(), r.name) == names.end()) {
      CAIRN_WARN("coordinator: ", r.name, " sent a result but holds no stage of the plan; dropped");
      return;
    }
    const std::string dir = nodeDirectory(o.out, r.name);
    const std::string weights = dir + "/" + clusterize::kTrainedStageFile;
    writeFileDurably(weights, r.trained_stage);
    writeJsonFile(dir + "/result.json", r.summary);
    store->putResult({r.name, weights, r.summary.dump()});
    store->setState(r.name, MemberState::kDone);
    const auto m = store->memberByName(r.name);
    reply(m->public_key, encode(ResultAck{r.name}));
    outbox->commit();  // the ack leaves now, not after the merge below (the process may end then)
    CAIRN_INFO("coordinator: result of ", r.name, " (", r.trained_stage.size(), " bytes)");
    const auto results = store->results();
    std::set<std::string> have;
    for (const auto& s : results) have.insert(s.name);
    for (const auto& n : names)
      if (!have.count(n)) return;
    finish(results);
  }

  // A placed node lost after its final checkpoint (FinalResult.h): its result from that checkpoint
  // instead of a spare.
  FinalResults final_results;
  bool resultFromCheckpoint(const std::string& name) {
    const auto result = final_results.take(o.out, name, store->checkpoint(name));
    if (result) onResult(*result);
    return result.has_value();
  }

  // --relay: the relay admits and forwards what the plan's node.json say (after a plan, a
  // replacement, a growth: whenever a member's row changed).
  void syncRelay() {
    view->setRelays(relays->figures(unixNow()));
    if (const std::set<std::string> changed = relays->poll(unixNow()); !changed.empty()) {
      replacer->owePeers(changed);
      relay_synced = ~uint64_t{0};  // node.json changed without a member's row
    }
    if (relays->linksViewVersion() != view_links) {  // a copy only when it changed (every link listed)
      view_links = relays->linksViewVersion();
      view->setLinks(relays->linksView());
    }
    if (!relay) return;
    view->setRelay(relay->figures());
    if (store->membersVersion() == relay_synced) return;
    relay->sync(o.out, store->placedNames());
    relay_synced = store->membersVersion();
  }
  void finish(const std::vector<StoredResult>& results) {
    const FinishedRun f = finishRun(o.out, results, creditJson(store->creditTotals(), store->members()));
    std::cout << f.lines << std::flush;
    store->setMeta("phase", "done");
    for (const auto& [key, route] : routes) send(route, encode(Finished{"the run is over"}));
  }

  // Binds the ROUTER (behind the ZAP authenticator); the invite names the address volunteers
  // dial (CoordinatorInvite.h).
  void bindAndInvite() {
    zap = std::make_unique<ZapAuthenticator>(context, ZapAuthenticator::AnyKey{});
    std::string bound;
    router =
        coordinationServer(context, keys, o.listen, o.max_attachment_bytes + (1 << 20), &bound);
    router_monitor = monitorSocket(context, router, ZMQ_EVENT_DISCONNECTED, "coordinator", "router");
    invite = formInvite(bound, o.advertise, o.listen, keys.public_key, token, o.invite_file);
  }
};

Coordinator::Coordinator(CoordinatorOptions options, clusterize::PreparedModel prepared)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.o = std::move(options);
  s.prepared = std::move(prepared);
  std::filesystem::create_directories(s.o.out);
  s.store = std::make_unique<CoordinatorStore>(s.o.out + "/coordinator.db");
  s.chunk_nodes = std::make_unique<NodeHeaders>(s.o.out);
  s.outbox = std::make_unique<Outbox>(*s.store, [&s](const std::string& routing_id, const Frames& frames) {
    sendRouted(s.router, routing_id, frames);
  });
  s.checkpoints = std::make_unique<CheckpointUploads>(
      *s.store, *s.outbox, s.o.out, [&s] { return s.view->plannedSteps(); },
      [&s](const std::string& routing_id, const Frames& frames) { s.send(routing_id, frames); });
  if (!s.store->meta("started_at")) s.store->setMeta("started_at", std::to_string(unixNow()));
  s.floods = std::make_unique<FloodGuard>(s.o.flood, s.o.max_attachment_bytes);
  s.view = std::make_unique<RunView>(s.o.out, s.placement());
  s.view->setStartedAt(std::stod(*s.store->meta("started_at")));
  s.syncView(/*now=*/true);
  s.replacer = std::make_unique<MemberReplacer>(
      *s.store, s.o.out, s.o.lost_after.count() / 1000.0, unixNow(),
      [&s](const std::string& key, const Frames& frames) { s.reply(key, frames); });
  const GoneRule gone{[&s](const std::string& key) { return s.connections.goneSince(key); },
                      s.o.gone_after.count() / 1000.0};
  s.replacer->watchConnections(gone);
  s.replacer->sendAtOnce([&s](const std::string& key, const Frames& frames) {
    const auto route = s.beat_routes.find(key);
    return route != s.beat_routes.end() && (s.send(route->second, frames), true);
  });
  s.replacer->onLostAfterFinishing([&s](const std::string& name) { return s.resultFromCheckpoint(name); });
  s.keys = loadOrMakeCoordinatorKeys(s.o.out);
  if (!s.o.relay_listen.empty())
    s.relay = std::make_unique<CoordinatorRelay>(s.o.relay_listen, s.o.relay_advertise, s.keys,
                                                 static_cast<int64_t>(s.o.max_attachment_bytes));
  s.relays = std::make_unique<VolunteerRelays>(
      *s.store, s.o.out, s.o.lost_after.count() / 1000.0, unixNow(),
      s.relay ? std::optional(s.relay->ref()) : std::nullopt,
      [&s](const std::string& key, const Frames& frames) { s.reply(key, frames); });
  s.relays->watchConnections(gone);
  const auto relays_now = [&s] { return s.relays->forPlanning(unixNow()); };
  s.replacer->relayThrough(relays_now);
  s.gathering = std::make_unique<Gathering>(
      *s.store, s.prepared,
      GatheringOptions{s.o.out, s.o.min_volunteers, s.o.max_volunteers, s.o.gather, relays_now,
                       s.o.before_plan},
      *s.replacer, [&s](const std::string& key, const Frames& frames) { s.reply(key, frames); });
  s.grower = std::make_unique<Grower>(
      *s.store, s.o.out,
      GrowOptions{s.o.grow, s.o.max_clusters, s.o.keep_spares,
                  [&s](const Member& m) { return s.replacer->heardLately(m, unixNow()); }, relays_now},
      [&s](const std::string& key, const Frames& frames) { s.reply(key, frames); });
  s.token = chooseToken(*s.store, s.o.token);
  s.admissions = std::make_unique<Admissions>(
      *s.store, s.context, s.keys,
      AdmissionOptions{s.o.out, s.token, s.o.allowed_keys, s.o.reach_timeout,
                       [&s](const Member& m) { return s.replacer->spareNote(m); }},
      [&s](const std::string& routing_id, const Frames& frames) {
        s.send(routing_id, frames);
      },
      [&s](const std::string& key, const Frames& frames) { s.reply(key, frames); },
      [&s](const std::string& routing_id, const std::string& who, const std::string& reason) {
        s.refuse(routing_id, who, reason);
      });
  s.bindAndInvite();
  s.chunk_service = std::make_unique<ChunkService>(s.context);
}

Coordinator::~Coordinator() = default;

std::string Coordinator::invite() const { return impl_->invite; }
const CoordinatorStats& Coordinator::stats() const { return impl_->stats; }
const RunView& Coordinator::view() const { return *impl_->view; }

int Coordinator::run() {
  Impl& s = *impl_;
  std::cout << "invite: " << s.invite << "\n"
            << "volunteers join with: provider --join " << s.invite
            << " [--listen HOST:PORT [--advertise HOST:PORT]]  (without --listen: dial-out only)\n"
            << std::flush;
  if (s.phase() == "done") {
    std::cout << "this run is finished; its results are in " << s.o.out << "/run_result.json\n";
    return 0;
  }
  if (s.phase() == "planned")
    CAIRN_INFO("coordinator: resuming a planned run (", s.placed().size(),
               " placed volunteers); waiting for their results");
  std::unique_ptr<TerminalView> terminal;  // the live view, on its own thread
  if (s.o.view_every.count() > 0) terminal = std::make_unique<TerminalView>(*s.view, s.o.view_every);
  auto last_drained = Clock::now();  // the ROUTER was last found empty
  while (true) {
    if (s.o.stop_requested && s.o.stop_requested()) {
      s.outbox->commit();
      CAIRN_INFO("coordinator: stopping; its state is in ", s.o.out,
                 "/coordinator.db (run the same command to pick it up)");
      return 0;
    }
    // An open batch is not waited on: with nothing queued it is committed at once (below).
    auto routed = s.nextMessage(std::chrono::milliseconds(s.outbox->open() ? 0 : 100));
    if (!routed) last_drained = Clock::now();
    s.outbox->begin();
    if (s.checkpoints->takeWritten()) s.credit_changed = true;
    if (routed && s.withinBudget(*routed)) {
      try {
        s.handle(*routed);
      } catch (const Error& e) {
        if (e.kind() == ErrorKind::kInternal) throw;
        ++s.stats.malformed;
        CAIRN_WARN("coordinator: a message from key ", routed->user_id, " was refused: ", e.what());
        s.send(routed->routing_id, encode(Rejected{e.what()}));
      }
    }
    s.admissions->poll();
    s.syncView();
    // Planning, lost members, growth: they read every member row, so every 200 ms, not per
    // message. Who is lost is judged only when the inbound queue was empty within that time:
    // heartbeats queued behind a burst (every node uploading its final checkpoint and results at
    // once: the churn benchmark's run without faults gave 5 finishing nodes to spares, and hung)
    // are read first; behind for over half the loss timeout, it judges anyway.
    if (Clock::now() - s.housekept >= std::chrono::milliseconds(200)) {
      const auto backlog = Clock::now() - last_drained;
      s.housekept = Clock::now();
      if (const auto placed = s.gathering->poll()) {  // the first plan applied on this turn
        for (const Placement& node : *placed) s.view->place(node);
        s.view->setNumClusters(std::stoi(s.store->meta("num_clusters").value_or("1")));
        s.view_placed = true;
        // Its assignments went out on this turn (and the I/O thread sends their bytes next): the
        // silence it caused is not the volunteers'.
        s.replacer->deafUntil(unixNow());
        s.relays->deafUntil(unixNow());
      }
      if (backlog <= std::chrono::milliseconds(200) || backlog > s.o.lost_after / 2)
        s.replacer->poll(unixNow());
      for (const NodeSpec& n : s.grower->poll(unixNow())) {
        s.view->place({n.name, n.cluster, n.stage, n.num_stages});
        s.view->setNumClusters(n.cluster + 1);
      }
      if (s.housekept - s.heard_flushed >= std::chrono::seconds(5)) {
        s.store->flushHeard();  // heartbeats' times (CoordinatorStore::touch)
        s.heard_flushed = s.housekept;
      }
      s.outbox->commit();  // a plan, a replacement or a growth rewrote node.json: their rows now
      s.syncRelay();
    }
    if (!routed || s.phase() == "done" || Clock::now() - s.outbox->began() >= std::chrono::milliseconds(10))
      s.outbox->commit();
    if (s.phase() == "done") {
      s.syncView(/*now=*/true);
      // Let the `finished` and `result_ack` messages leave before the socket closes.
      s.router.set(zmq::sockopt::linger, 2000);
      return 0;
    }
  }
}

}  // namespace cairn::coordinator
