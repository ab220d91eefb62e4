# provider pointed at a node_data folder without that node: exit code 2 naming the file.
execute_process(COMMAND ${BINARY} --name node_9 --node-data /nonexistent/node_data
                RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_VARIABLE out)
if(NOT rc EQUAL 2)
  message(FATAL_ERROR "expected exit code 2, got ${rc}: ${err}")
endif()
string(FIND "${err}" "/nonexistent/node_data/nodes/node_9/node.json: cannot open" pos)
if(pos EQUAL -1)
  message(FATAL_ERROR "unexpected message: ${err}")
endif()
