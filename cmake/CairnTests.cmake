# How the suite registers its tests with ctest.
#
# cairn_gtest_suites(TARGET LABEL label [NUMERIC suite-regex] [FILTER gtest-filter] [PER_CASE]
#                    [PROPERTIES prop value ...])
#   Two ctest entries at most, one process each, for TARGET's GoogleTest suites (not one per case,
#   as gtest_discover_tests does, nor one per suite: each GoogleTest process starts libtorch, ~0.7 s
#   of CPU, and a hundred starts were a minute of a 2-core suite): the suites that match NUMERIC,
#   and the others, named TARGET.First..Last after their first and last suite. Each runs exactly
#   the cases that FILTER selects (all by default), listed by name; a failing case is named in the
#   test's output ([  FAILED  ] Suite.Case).
#   PER_CASE registers each selected case on its own instead (TARGET.Suite.Case) (for cases minutes long, so ctest -j
#   can run them beside others). Like gtest_discover_tests, the cases are listed after each build
#   (POST_BUILD, `TARGET --gtest_list_tests`), so a new TEST needs no edit here.
#   Every entry gets TIMEOUT 300 unless PROPERTIES names another: a hang fails fast. Each has the
#   one LABEL, and the label `numeric` too where its suite matches NUMERIC: the tests that compare
#   floating-point results, which tools/numeric_tests.sh runs under each ATEN_CPU_CAPABILITY.
#
# GoogleTest's own module has no per-suite mode, hence this small one (cmake/GTestSuitesAdd.cmake
# turns the listing into add_test calls).
set(CAIRN_TEST_TIMEOUT 300 CACHE STRING "ctest TIMEOUT of each test that names none (seconds)")
# Every test takes PROCESSORS 2 of ctest's slots, and tools/test.sh runs ctest -j (2 x cores + 1):
# as many busy tests at once as there are cores, as -j (cores) with one slot each would. The suites
# that mostly wait (on timeouts, on sockets: node_tests' and coordinator_tests' use a tenth of a
# core; the short soak, tests/CMakeLists.txt) take 1, so they run beside the busy tests instead of
# holding a core each (the + 1 is the soak's: with it running, two busy tests still fit).
set(CAIRN_TEST_PROCESSORS 2)
# Every test process's malloc asks for transparent huge pages (glibc >= 2.35's tunable; it only
# madvises, so it does nothing where THP is off, and changes no result). A process of the suite
# faults its memory in by the 4 KiB page otherwise, and on the virtual machines the suite runs on a
# page fault is dear: `provider --help` took 17,300 faults and 1.13 CPU-s, 6,700 and 0.92 with it
# (libtorch's start alone allocates some 40 MB); integration.volunteers.join_train_merge 660,000
# faults and 29.7 CPU-s, 136,000 and 21.5 (two runs each); the whole suite's ctest -j5 1,306 s
# without it, 1,030 s with it (one build, 2026-12-02). README "Tests".
# -DCAIRN_TEST_MALLOC= leaves malloc as it is.
set(CAIRN_TEST_MALLOC "GLIBC_TUNABLES=glibc.malloc.hugetlb=1" CACHE STRING
  "An environment setting for every test process's malloc (empty: none)")
# The environment every test process gets, the GoogleTest suites here and the other entries in
# tests/CMakeLists.txt (which says why each): one BLAS thread (core/BlasThreads.h), sleeping
# OpenMP waits, and malloc as above.
set(CAIRN_TEST_ENV OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE)
if(CAIRN_TEST_MALLOC)
  list(APPEND CAIRN_TEST_ENV "${CAIRN_TEST_MALLOC}")
endif()

function(cairn_gtest_suites target)
  cmake_parse_arguments(ARG "PER_CASE" "FILTER;LABEL;NUMERIC" "PROPERTIES" ${ARGN})
  if(NOT ARG_LABEL)
    message(FATAL_ERROR "cairn_gtest_suites(${target}): LABEL is required (README: every test has one)")
  endif()
  if(NOT ARG_FILTER)
    set(ARG_FILTER "*")
  endif()
  set(props ${ARG_PROPERTIES})
  if(NOT "TIMEOUT" IN_LIST props)
    list(APPEND props TIMEOUT ${CAIRN_TEST_TIMEOUT})
  endif()
  # ctest's slots: PROCESSORS 2 unless PROPERTIES says otherwise (see CAIRN_TEST_PROCESSORS).
  if(NOT "PROCESSORS" IN_LIST props)
    list(APPEND props PROCESSORS ${CAIRN_TEST_PROCESSORS})
  endif()
  # CAIRN_TEST_ENV, added to whatever environment PROPERTIES names (one value: ; escaped).
  list(JOIN CAIRN_TEST_ENV "\\;" suite_env)
  list(FIND props ENVIRONMENT env_at)
  if(env_at EQUAL -1)
    list(APPEND props ENVIRONMENT "${suite_env}")
  else()
    math(EXPR env_at "${env_at} + 1")
    list(GET props ${env_at} env)
    list(REMOVE_AT props ${env_at})
    list(INSERT props ${env_at} "${env}\\;${suite_env}")
  endif()
  # Each property value as a bracket argument, so values with ; or spaces pass through unchanged.
  set(props_text "")
  foreach(word IN LISTS props)
    string(APPEND props_text " [==[${word}]==]")
  endforeach()
  string(MD5 key "${target};${ARG_FILTER};${ARG_PER_CASE};${ARG_LABEL}")
  string(SUBSTRING "${key}" 0 8 key)
  set(base "${CMAKE_CURRENT_BINARY_DIR}/${target}_${key}")
  # Rewritten only when the properties change (configure_file leaves an equal file alone), and the
  # executable relinks when they do, so its POST_BUILD listing below gives ctest the new ones.
  file(WRITE "${base}_props.txt.in" "${props_text}")
  configure_file("${base}_props.txt.in" "${base}_props.txt" COPYONLY)
  set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS "${base}_props.txt")
  set(mode SUITE)
  if(ARG_PER_CASE)
    set(mode CASE)
  endif()
  add_custom_command(TARGET ${target} POST_BUILD
    COMMAND "${CMAKE_COMMAND}" -D "EXE=$<TARGET_FILE:${target}>" -D "PREFIX=${target}" -D "FILTER=${ARG_FILTER}"
            -D "MODE=${mode}" -D "LABEL=${ARG_LABEL}"
            -D "NUMERIC=${ARG_NUMERIC}" -D "PROPS_FILE=${base}_props.txt" -D "OUT=${base}_tests.cmake"
            -P "${PROJECT_SOURCE_DIR}/cmake/GTestSuitesAdd.cmake"
    BYPRODUCTS "${base}_tests.cmake" VERBATIM)
  # ctest reads this file; until the target is built it registers one failing placeholder.
  file(WRITE "${base}_include.cmake"
    "if(EXISTS [==[${base}_tests.cmake]==])\n"
    "  include([==[${base}_tests.cmake]==])\n"
    "else()\n"
    "  add_test([==[${target}_NOT_BUILT_${key}]==] [==[${target}_NOT_BUILT]==])\n"
    "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${base}_include.cmake")
endfunction()

# cairn_script_tests(PREFIX prefix SCRIPT script.py CASES c1 c2 ... [PORTS base1 base2 ...]
#                    [TIMEOUT s] [LABEL label] [ARGS extra args ...])
#   One ctest entry `prefix.CASE` per case of a test script: `python3 SCRIPT CASE ARGS...
#   --work <build>/integration/<prefix>_<case>`, and `--port BASE` where PORTS gives each case its
#   fixed block (static plans must name every address before a provider starts; tests/CMakeLists.txt
#   says which blocks are taken).
function(cairn_script_tests)
  cmake_parse_arguments(ARG "" "PREFIX;SCRIPT;TIMEOUT;LABEL" "CASES;PORTS;ARGS" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT ${CAIRN_TEST_TIMEOUT})
  endif()
  if(NOT ARG_LABEL)
    set(ARG_LABEL integration)
  endif()
  string(REPLACE "." "_" dir_prefix "${ARG_PREFIX}")
  set(i 0)
  foreach(case IN LISTS ARG_CASES)
    set(port_args "")
    if(ARG_PORTS)
      list(GET ARG_PORTS ${i} port)
      set(port_args --port ${port})
    endif()
    add_test(NAME ${ARG_PREFIX}.${case}
      COMMAND ${CAIRN_PYTHON} ${ARG_SCRIPT} ${case} ${ARG_ARGS} ${port_args}
              --work ${CMAKE_CURRENT_BINARY_DIR}/integration/${dir_prefix}_${case})
    set_tests_properties(${ARG_PREFIX}.${case} PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS ${ARG_LABEL})
    math(EXPR i "${i} + 1")
  endforeach()
endfunction()
