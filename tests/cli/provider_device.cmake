# provider --device: a malformed device and a CUDA device this build or machine lacks exit 2 with
# a sentence naming --device, before any file is read or socket opened.
execute_process(COMMAND ${BINARY} --name node_0 --node-data /nonexistent/node_data --device gpu
                RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_VARIABLE out)
if(NOT rc EQUAL 2)
  message(FATAL_ERROR "--device gpu: expected exit code 2, got ${rc}: ${err}")
endif()
string(FIND "${err}" "--device \"gpu\" is not a device: expected auto, cpu, cuda or cuda:N" pos)
if(pos EQUAL -1)
  message(FATAL_ERROR "--device gpu: unexpected message: ${err}")
endif()

execute_process(COMMAND ${BINARY} --name node_0 --node-data /nonexistent/node_data --device cuda
                RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_VARIABLE out)
if(NOT rc EQUAL 2)
  message(FATAL_ERROR "--device cuda: expected exit code 2, got ${rc}: ${err}")
endif()
if(CUDA_BUILD)
  # A CUDA build: no GPU here is refused; with one, the run starts and the missing node is refused.
  string(REGEX MATCH "sees no usable CUDA device|nonexistent/node_data/nodes/node_0/node.json" hit "${err}")
else()
  string(REGEX MATCH "--device cuda: this build of cairn links libtorch [0-9.]+ without CUDA" hit "${err}")
endif()
if(NOT hit)
  message(FATAL_ERROR "--device cuda: unexpected message: ${err}")
endif()
