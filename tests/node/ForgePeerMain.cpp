// forge_peer: a stranger on the network for the security integration test. It reads a plan's
// node.json for `--target`, claims to be `--claim` (the target's upstream, say), and sends the
// target a hello and well-formed activations for steps [0, --steps) × micro-batches
// [0, --microbatches) whose tensors have the planned names, dtypes and shapes (random values,
// targets all zero). --mode plain: no CurveZMQ at all; --mode wrong_key: CurveZMQ with the
// target's real public key but a key pair of its own that no node.json lists.
// Prints how many messages the transport took ("sent N timed_out M") and exits 0.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "core/CurveKeys.h"
#include "core/NodeData.h"
#include "node/transport/WireCodec.h"
#include "node/transport/ZmqTransport.h"
#include "trainer/ReservedTensors.h"

int main(int argc, char** argv) {
  CLI::App app{"forge_peer: send forged activations to a provider (security test helper)"};
  std::string node_data, target, claim, mode = "plain", bind = "tcp://127.0.0.1:*";
  int steps = 20, microbatches = 4, micro_batch_size = 8;
  app.add_option("--node-data", node_data)->required();
  app.add_option("--target", target)->required();
  app.add_option("--claim", claim)->required();
  app.add_option("--mode", mode)->check(CLI::IsMember({"plain", "wrong_key"}));
  app.add_option("--bind", bind);
  app.add_option("--steps", steps);
  app.add_option("--microbatches", microbatches);
  app.add_option("--micro-batch-size", micro_batch_size);
  CLI11_PARSE(app, argc, argv);

  const cairn::NodeSpec node = cairn::readNodeSpec(cairn::nodeSpecPath(node_data, target));
  cairn::TransportOptions options;
  if (mode == "wrong_key") {
    cairn::CurveOptions curve;
    curve.own = cairn::generateCurveKeyPair();
    curve.peer_public_keys[target] = node.extra.at("public_key").get<std::string>();
    options.curve = curve;
  }
  zmq::context_t context;
  cairn::ZmqTransport transport(context, claim, bind, options);
  transport.addPeer(target, "tcp://" + node.address);
  int sent = 0, timed_out = 0;
  auto post = [&](const cairn::Message& m) {
    if (transport.send(target, m, std::chrono::milliseconds(300)) == cairn::SendStatus::kSent)
      ++sent;
    else
      ++timed_out;
  };
  cairn::Message hello;
  hello.kind = cairn::MessageKind::kControl;
  hello.job_id = node.job_id;
  hello.sender = claim;
  hello.tag = "hello";
  hello.text = "{}";
  post(hello);
  torch::manual_seed(1234);
  for (int step = 0; step < steps && timed_out < 3; ++step) {
    for (int k = 0; k < microbatches && timed_out < 3; ++k) {
      cairn::Message m;
      m.kind = cairn::MessageKind::kActivation;
      m.job_id = node.job_id;
      m.sender = claim;
      m.step = uint64_t(step);
      m.microbatch = uint64_t(k);
      for (const cairn::BoundaryValue& input : node.inputs) {
        std::vector<int64_t> shape = input.shape;
        if (!shape.empty()) shape[0] = micro_batch_size;
        m.tensors.push_back(
            {input.name, torch::randn(shape).to(*cairn::scalarTypeForName(input.dtype)) * 100});
      }
      m.tensors.push_back({cairn::kTargetsTensor, torch::zeros({micro_batch_size}, torch::kLong)});
      m.tensors.push_back({cairn::kIdsTensor, torch::arange(micro_batch_size, torch::kLong)});
      m.tensors.push_back({cairn::kDenominatorTensor, torch::tensor(double(4 * micro_batch_size))});
      post(m);
    }
  }
  transport.flushAndClose(std::chrono::milliseconds(2000));
  std::printf("sent %d timed_out %d\n", sent, timed_out);
  return 0;
}
