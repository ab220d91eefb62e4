# clusterize on a node_configs.json with a negative ram: exit code 2 and one line naming it.
execute_process(COMMAND ${BINARY} --nodes ${DATA}/negative_ram_node_configs.json
                RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_VARIABLE out)
if(NOT rc EQUAL 2)
  message(FATAL_ERROR "expected exit code 2, got ${rc}: ${err}")
endif()
string(FIND "${err}" "negative_ram_node_configs.json: node \"1\": benchmarks.ram must be a positive number (got -4)" pos)
if(pos EQUAL -1)
  message(FATAL_ERROR "unexpected message: ${err}")
endif()
