# Run after a test binary is built (cmake/CairnTests.cmake, cairn_gtest_suites): lists its cases
# (EXE --gtest_list_tests --gtest_filter=FILTER) and writes OUT, an add_test per suite (MODE SUITE)
# or per case (MODE CASE), each running exactly its cases by name, labelled LABEL (and numeric where
# the suite matches the regex NUMERIC), with the properties in PROPS_FILE.
# Each test is named PREFIX.Suite (or PREFIX.Suite.Case).
#   cmake -D EXE=... -D PREFIX=... -D FILTER=... -D MODE=SUITE|CASE -D LABEL=... -D NUMERIC=...
#            -D PROPS_FILE=... -D OUT=... -P this
execute_process(COMMAND "${EXE}" --gtest_list_tests "--gtest_filter=${FILTER}"
  OUTPUT_VARIABLE listing ERROR_VARIABLE errors RESULT_VARIABLE rc TIMEOUT 60)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${EXE} --gtest_list_tests failed (${rc}):\n${listing}\n${errors}")
endif()
file(READ "${PROPS_FILE}" props)

# The listing: "Suite." lines, then indented case names; "  # GetParam() = ..." comments dropped.
string(REPLACE ";" "\\;" listing "${listing}")
string(REPLACE "\n" ";" lines "${listing}")
set(suites "")
set(suite "")
foreach(line IN LISTS lines)
  string(REGEX REPLACE "#.*$" "" line "${line}")
  if(line MATCHES "^([^ ]+)\\.[ ]*$")
    set(suite "${CMAKE_MATCH_1}")
    list(APPEND suites "${suite}")
    set(cases_${suite} "")
  elseif(line MATCHES "^  ([^ ]+)[ ]*$" AND NOT suite STREQUAL "")
    list(APPEND "cases_${suite}" "${suite}.${CMAKE_MATCH_1}")
  endif()
endforeach()

set(text "")
foreach(suite IN LISTS suites)
  set(groups "")
  if(MODE STREQUAL "CASE")
    foreach(name IN LISTS "cases_${suite}")
      list(APPEND groups "${name}")
    endforeach()
  else()
    string(REPLACE ";" ":" joined "${cases_${suite}}")
    list(APPEND groups "${suite}=${joined}")
  endif()
  foreach(group IN LISTS groups)
    if(group MATCHES "^([^=]+)=(.*)$")
      set(name "${PREFIX}.${CMAKE_MATCH_1}")
      set(filter "${CMAKE_MATCH_2}")
    else()
      set(name "${PREFIX}.${group}")
      set(filter "${group}")
    endif()
    set(labels "${LABEL}")
    if(NOT NUMERIC STREQUAL "" AND suite MATCHES "${NUMERIC}")
      string(APPEND labels ";numeric")
    endif()
    string(APPEND text
      "add_test([==[${name}]==] [==[${EXE}]==] [==[--gtest_filter=${filter}]==])\n"
      "set_tests_properties([==[${name}]==] PROPERTIES LABELS [==[${labels}]==] ${props})\n")
  endforeach()
endforeach()
file(WRITE "${OUT}" "${text}")
