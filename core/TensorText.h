// TensorText: a tensor as error messages name it, "Float [2, 3]" (dtype, then sizes). One
// definition for every room that reports a tensor that does not fit (the rooms compile in unity
// batches: a file-local copy in each of two files of one target would collide in a batch).
#pragma once

#include <torch/script.h>

#include <sstream>
#include <string>

namespace cairn {

inline std::string describeTensor(const torch::Tensor& t) {
  std::ostringstream out;
  out << c10::toString(t.scalar_type()) << " " << t.sizes();
  return out.str();
}

}  // namespace cairn
