"""Shared by the dataset fixture scripts (make_*_files.py): a safetensors writer for reference
tensors (numpy arrays; bfloat16 as raw bytes), so the C++ tests read what numpy/PyTorch/Pillow read
through core's own safetensors reader, independently of the dataset code under test."""
import json
import struct

import numpy as np

_NAMES = {np.dtype("float64"): "F64", np.dtype("float32"): "F32", np.dtype("float16"): "F16",
          np.dtype("int64"): "I64", np.dtype("int32"): "I32", np.dtype("int16"): "I16",
          np.dtype("int8"): "I8", np.dtype("uint8"): "U8", np.dtype("bool"): "BOOL"}


def write_safetensors(path, tensors):
    """tensors: name -> numpy array, or name -> (dtype name, shape, raw little-endian bytes)."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        if isinstance(t, tuple):
            dtype, shape, data = t
        else:
            shape = list(np.shape(t))  # before ascontiguousarray, which makes a 0-d array 1-d
            t = np.ascontiguousarray(t)
            dtype, data = _NAMES[t.dtype], t.astype(t.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def write_llmc_shard(path, tokens, llama3=False):
    """karpathy/llm.c dev/data/data_common.py write_datafile: 256 int32 of header, then tokens."""
    header = np.zeros(256, dtype="<i4")
    header[0], header[1] = (20240801, 7) if llama3 else (20240520, 1)
    header[2] = len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype="<u4" if llama3 else "<u2").tobytes())


def npy_bytes(descr, shape, data, fortran=False):
    """A hand-made .npy (version 1.0), for headers numpy itself would not write."""
    text = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, fortran, shape)
    pad = 64 - (10 + len(text) + 1) % 64
    text = text + " " * (pad % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode() + data
