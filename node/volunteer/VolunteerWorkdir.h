// VolunteerWorkdir: what `provider --join` keeps on the volunteer's disk (--workdir, default
// ./cairn-volunteer), docs/OPERATIONS.md "Volunteers join":
//   identity.key       the volunteer's CURVE key pair, generated here once (mode 0600) and reused on
//                      every restart; the secret key never leaves this machine
//   membership.json    {format, coordinator, coordinator_key, name}: the coordinator that accepted
//                      this volunteer and the name it gave; a restarted volunteer asks for it again
//   node_data/         the coordinator's assignment in the static layout (job.json,
//                      nodes/<name>/{node.json, stage.pt, secret.key}), trained by runProvider;
//                      an earlier assignment's folder is kept once as node_data.previous, unless
//                      the new one is the same stage again (a restarted volunteer): then its
//                      checkpoints stay and the run resumes from them (as `provider --resume`);
//                      an assignment carrying a checkpoint (a spare taking over a lost node) has it
//                      written to nodes/<name>/checkpoints/ and resumes from it
// Ownership: plain paths and values. Thread-safety: one thread (the volunteer's main thread).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <torch/script.h>

#include "core/CurveKeys.h"
#include "core/NodeData.h"

namespace cairn {

struct Membership {
  std::string coordinator;      // host:port
  std::string coordinator_key;  // Z85
  std::string name;             // the name the coordinator gave this volunteer
};

// An assignment that passed every check (node/volunteer/VolunteerAssignment.h), ready to be written.
struct CheckedAssignment {
  NodeSpec node;
  JobSpec job;
  std::string stage;  // stage.pt bytes (they load as TorchScript)
  // A takeover (a spare given a lost volunteer's node): the newest checkpoint the coordinator
  // holds for the node, written into nodes/<name>/checkpoints/ and resumed from.
  std::optional<std::string> checkpoint;
  int64_t checkpoint_step = -1;
};

struct WrittenAssignment {
  std::string node_data;  // the work folder's node_data/
  // The same stage as the assignment already there (job_id, name, cluster, stage) and it holds
  // valid checkpoints: train with resume (the cluster agrees on the step, NodeRunner).
  bool resume = false;
  std::vector<int64_t> checkpoint_steps;  // with resume: the valid checkpoints held
};

class VolunteerWorkdir {
 public:
  // Creates the folder (and parents) if needed; BadInput naming it when that fails.
  explicit VolunteerWorkdir(std::string path);

  const std::string& path() const { return path_; }
  std::string identityPath() const { return path_ + "/identity.key"; }
  std::string membershipPath() const { return path_ + "/membership.json"; }
  std::string nodeDataPath() const { return path_ + "/node_data"; }

  // The key pair in identity.key; generated and written (0600) when the file does not exist.
  // `*created` (optional) says which. BadInput from readKeyFile for a malformed or readable file.
  CurveKeyPair loadOrCreateIdentity(bool* created = nullptr) const;

  // membership.json, validated (BadInput naming the file and key); nullopt when absent.
  std::optional<Membership> readMembership() const;
  void writeMembership(const Membership& membership) const;

  // Writes `assignment` as node_data/ (job.json, nodes/<name>/{node.json, stage.pt, secret.key
  // holding `identity`}). An earlier node_data/ is moved to node_data.previous first, unless it
  // holds the same stage with valid checkpoints (see WrittenAssignment::resume): then the files
  // are replaced in place and the checkpoints kept. The assignment's checkpoint, if any, is written
  // and verified (BadInput naming it when it does not verify) and the run resumes from it.
  WrittenAssignment writeAssignment(const CheckedAssignment& assignment,
                                    const CurveKeyPair& identity) const;

 private:
  std::string path_;
};

}  // namespace cairn
