// NodeHeaders: the placed nodes' node.json files as the coordinator's frequent paths need them —
// name, cluster, stage, stages, role, memory and time estimates, `extra` — each file parsed once
// per version: it is read again only when its identity (device, inode, size, modification time)
// changed; every writer replaces node.json by a rename (writeJsonFile), so a rewrite is a new
// inode. With N one-stage clusters each node.json lists N ring members (160 KB at 1,000 volunteers),
// and parsing every placed node's file per joining spare (spareNote), per poll of a lost node and
// per chunk piece took the coordinator's loop seconds (docs/BENCHMARKS.md "Churn").
//   header(name)   the node's NodeSpec with its lists left empty (parameters, buffers, inputs,
//                  outputs, shared parameters) but for one ring holding only the ring members
//                  placed dial-out only (at most kDialOutOnlyKept: what Replacement.h canHold
//                  needs): use readNodeSpec for the whole file
// Ownership: owns its copies. Thread-safety: one thread per instance (the loop has one, the
// chunk worker its own).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/NodeData.h"

namespace cairn::coordinator {

class NodeHeaders {
 public:
  explicit NodeHeaders(std::string out) : out_(std::move(out)) {}
  // BadInput as readNodeSpec's when the file is missing or broken.
  const NodeSpec& header(const std::string& name);
  std::vector<NodeSpec> headers(const std::vector<std::string>& names);
  size_t parses() const { return parses_; }  // files parsed so far (tests)
  static constexpr size_t kDialOutOnlyKept = 9;

 private:
  struct Entry {
    std::vector<long long> identity;  // st_dev, st_ino, st_size, st_mtim (s, ns)
    NodeSpec header;
  };
  std::string out_;
  std::map<std::string, Entry> entries_;
  size_t parses_ = 0;
};

}  // namespace cairn::coordinator
