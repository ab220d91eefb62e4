# provider pointed at a node_data folder without that node: exit code 2 naming the file; and an
# unwritable CAIRN_COUNT_OPS file, the same.
execute_process(COMMAND ${BINARY} --name node_9 --node-data /nonexistent/node_data
                RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_VARIABLE out)
if(NOT rc EQUAL 2)
  message(FATAL_ERROR "expected exit code 2, got ${rc}: ${err}")
endif()
string(FIND "${err}" "/nonexistent/node_data/nodes/node_9/node.json: cannot open" pos)
if(pos EQUAL -1)
  message(FATAL_ERROR "unexpected message: ${err}")
endif()

# CAIRN_COUNT_OPS (core/OpCount.h) naming a file that cannot be written: exit code 2 naming it,
# before the run starts.
execute_process(COMMAND ${CMAKE_COMMAND} -E env CAIRN_COUNT_OPS=/nonexistent/dir/ops.json
                        ${BINARY} --name node_9 --node-data /nonexistent/node_data
                RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_VARIABLE out)
if(NOT rc EQUAL 2)
  message(FATAL_ERROR "CAIRN_COUNT_OPS: expected exit code 2, got ${rc}: ${err}")
endif()
string(FIND "${err}" "CAIRN_COUNT_OPS=/nonexistent/dir/ops.json: cannot write that file" pos)
if(pos EQUAL -1)
  message(FATAL_ERROR "CAIRN_COUNT_OPS: unexpected message: ${err}")
endif()
