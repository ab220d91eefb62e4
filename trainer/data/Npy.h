// .npy files (NumPy's format, numpy/lib/format.py): the magic "\x93NUMPY", a version byte pair,
// the header length (2 bytes in version 1, 4 in versions 2 and 3, little-endian), then the header:
// a Python dict literal such as {'descr': '<u2', 'fortran_order': False, 'shape': (1000,), }
// padded with spaces and a newline, then the array's bytes in C order.
//
// The header is parsed by hand, strictly: Debian ships no C++ reader for .npy (cnpy and
// xtensor-io are not packaged), and the header is a tiny literal whose grammar numpy fixes. Exactly
// the keys descr, fortran_order and shape; descr a plain little-endian (or byte-sized) dtype of
// kind b, i, u or f; fortran_order False; the file exactly as long as the header promises.
// Anything else (structured or object dtypes, big-endian, Fortran order, a truncated or padded
// file, a header over 1 MiB) is a BadInput naming the file.
// Thread-safety: free functions, no state.
#pragma once

#include <torch/script.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trainer/data/FileReader.h"

namespace cairn {

struct NpyArray {
  std::string descr;           // as written, e.g. "<u2"
  char kind = 0;               // 'b' (bool), 'i' (signed), 'u' (unsigned), 'f' (floating)
  int item_size = 0;           // bytes per element
  std::vector<int64_t> shape;  // () for a scalar
  uint64_t data_offset = 0;    // where the elements start in the file
  int64_t elements = 0;
};

// Reads and validates the header of a .npy file against the file's size.
NpyArray readNpyHeader(const FileReader& file);

// The torch dtype of an array's elements when the wire carries it (bool, uint8, int32, int64,
// float16, float32, float64); nullopt for the others (int8, int16, uint16, uint32, uint64).
std::optional<torch::ScalarType> wireDtypeOf(const NpyArray& array);

}  // namespace cairn
