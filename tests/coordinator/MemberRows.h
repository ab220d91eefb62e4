// A member row as the coordinator stores it, with a fixed probe (8 GB, 4 cores, 50 GFLOP/s,
// 1,000 Mbit/s): the coordinator tests' shared fixture.
#pragma once

#include <string>

#include "coordinator/CoordinatorStore.h"

namespace cairn::coordinator::test_rows {

inline Member memberRow(const std::string& name, const std::string& key, const std::string& advertise,
                        MemberState state) {
  Member m;
  m.name = name;
  m.public_key = key;
  m.advertise = advertise;
  m.probe_json = R"({"ram_gb":8,"cores":4,"compute_gflops":50,"bandwidth_mbps":1000})";
  m.state = state;
  return m;
}

}  // namespace cairn::coordinator::test_rows
