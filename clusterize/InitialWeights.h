// InitialWeights: `clusterize --weights init.safetensors` — overwrite a model's parameters and
// buffers with the tensors of a safetensors file before it is cut, so every stage starts from
// those values. Names are the model's dotted names ("features.0.weight"); dtypes must match exactly
// (no silent conversion). Names that share one tensor in the model (tied weights, e.g. an embedding
// and an output head) need only one of them in the file, as Hugging Face tools write them; when the
// file has several, they must be equal. Every mismatch — a name missing from the file, a name the
// model does not have, a shape or a dtype — is collected and reported together in one BadInput.
// Not thread-safe (writes into the module).
#pragma once

#include <torch/script.h>

#include <string>

namespace cairn::clusterize {

// `model_source` names the model in messages.
void loadInitialWeights(torch::jit::Module& model, const std::string& weights_path,
                        const std::string& model_source);

}  // namespace cairn::clusterize
