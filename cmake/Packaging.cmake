# The Debian packages (docs/OPERATIONS.md "Running as a service"): `cmake --build build --target
# package` (CPack's DEB generator) writes into build/:
#   cairn-provider_<version>_<arch>.deb     what a volunteer installs: /usr/bin/cairn-provider,
#                                           /usr/sbin/cairn-volunteer, the service
#                                           cairn-provider@.service, its man page, OPERATIONS.md
#   cairn-coordinator_<version>_<arch>.deb  what a researcher installs: /usr/bin/cairn-clusterize
#                                           (`--serve` runs the coordinator, its web page inside),
#                                           /usr/bin/cairn-keys, their man pages
# The binaries keep their build names in build/ (build/node/provider, ...); the packages install
# them under cairn- names, as /usr/bin is shared with everything else. Dependencies come from
# dpkg-shlibdeps (Debian's libtorch, libzmq5, ...). Only a build against Debian's libtorch is
# packaged: PyTorch's own libtorch is not a Debian package a dependency could name ([M]).
# tests/package/package_test.sh (ctest package.debs) builds both and checks them.
include(GNUInstallDirs)
set(CAIRN_PACKAGE_DIR ${PROJECT_SOURCE_DIR}/tools/package)
set(CAIRN_PACKAGE_BUILD ${CMAKE_BINARY_DIR}/package)

# What the packages install of each binary: a stripped copy (Debian policy 10.1: no symbols or
# debug sections in an installed binary; the build's own stay as they are) under its installed
# name in build/package/bin, and its man page from its --help (help2man: Debian's package of that
# name; tools/setup.sh installs it), made from that copy as `cairn-provider` on the PATH so the page
# names the installed program and no build path. Both are part of every build (ALL): ~2 s.
find_program(CAIRN_HELP2MAN help2man REQUIRED)
set(cairn_package_outputs "")
foreach(entry IN ITEMS
    "provider|cairn-provider|the cairn volunteer: trains one pipeline stage of a cairn run"
    "clusterize|cairn-clusterize|plan a cairn run, coordinate its volunteers, merge the trained model"
    "cairn_keys|cairn-keys|make CURVE key pairs for a static cairn plan"
    "|cairn-volunteer|set up and remove the cairn volunteers of this machine (its services)")
  string(REPLACE "|" ";" entry "${entry}")
  list(GET entry 0 target)
  list(GET entry 1 installed)
  list(GET entry 2 summary)
  set(copy ${CAIRN_PACKAGE_BUILD}/bin/${installed})
  set(page ${CAIRN_PACKAGE_BUILD}/${installed}.1.gz)
  if(target)
    add_custom_command(OUTPUT ${copy}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${CAIRN_PACKAGE_BUILD}/bin
      COMMAND ${CMAKE_STRIP} --remove-section=.comment --remove-section=.note --strip-unneeded
              -o ${copy} $<TARGET_FILE:${target}>
      DEPENDS ${target} VERBATIM)
  else()  # a script from tools/package
    add_custom_command(OUTPUT ${copy}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${CAIRN_PACKAGE_BUILD}/bin
      COMMAND ${CMAKE_COMMAND} -E copy ${CAIRN_PACKAGE_DIR}/${installed} ${copy}
      DEPENDS ${CAIRN_PACKAGE_DIR}/${installed} VERBATIM)
  endif()
  add_custom_command(OUTPUT ${page}
    COMMAND ${CMAKE_COMMAND} -E env PATH=${CAIRN_PACKAGE_BUILD}/bin:/usr/bin:/bin OPENBLAS_NUM_THREADS=1
            ${CAIRN_HELP2MAN} --no-info --no-discard-stderr --version-string=${PROJECT_VERSION}
            --name=${summary} --output=${CAIRN_PACKAGE_BUILD}/${installed}.1 ${installed}
    COMMAND gzip -9nf ${CAIRN_PACKAGE_BUILD}/${installed}.1
    DEPENDS ${copy} VERBATIM)
  list(APPEND cairn_package_outputs ${copy} ${page})
endforeach()
add_custom_target(cairn_package_files ALL DEPENDS ${cairn_package_outputs})

# /usr/share/doc/<package>/: copyright and changelog (Debian policy 12.5, 12.7), written here.
string(TIMESTAMP cairn_changelog_date "%a, %d %b %Y %H:%M:%S +0000" UTC)
set(CAIRN_PACKAGE_MAINTAINER "cairn developers <cairn-developers@users.noreply.github.com>")
file(WRITE ${CAIRN_PACKAGE_BUILD}/changelog
  "cairn (${PROJECT_VERSION}) unstable; urgency=medium\n\n"
  "  * Built with CPack from the cairn source tree; its git log is the history.\n\n"
  " -- ${CAIRN_PACKAGE_MAINTAINER}  ${cairn_changelog_date}\n")
execute_process(COMMAND gzip -9nf ${CAIRN_PACKAGE_BUILD}/changelog)

foreach(component provider coordinator)
  set(doc share/doc/cairn-${component})
  install(FILES ${CAIRN_PACKAGE_DIR}/copyright ${CAIRN_PACKAGE_BUILD}/changelog.gz
          DESTINATION ${doc} COMPONENT ${component})
endforeach()

set(bin ${CAIRN_PACKAGE_BUILD}/bin)
set(man1 ${CMAKE_INSTALL_MANDIR}/man1)
install(PROGRAMS ${bin}/cairn-provider DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT provider)
install(PROGRAMS ${bin}/cairn-volunteer DESTINATION ${CMAKE_INSTALL_SBINDIR} COMPONENT provider)
install(FILES ${CAIRN_PACKAGE_DIR}/cairn-provider@.service DESTINATION lib/systemd/system
        COMPONENT provider)
install(FILES ${PROJECT_SOURCE_DIR}/docs/OPERATIONS.md DESTINATION share/doc/cairn-provider
        COMPONENT provider)
install(FILES ${CAIRN_PACKAGE_BUILD}/cairn-provider.1.gz ${CAIRN_PACKAGE_BUILD}/cairn-volunteer.1.gz
        DESTINATION ${man1} COMPONENT provider)
install(PROGRAMS ${bin}/cairn-clusterize ${bin}/cairn-keys DESTINATION ${CMAKE_INSTALL_BINDIR}
        COMPONENT coordinator)
install(FILES ${CAIRN_PACKAGE_BUILD}/cairn-clusterize.1.gz ${CAIRN_PACKAGE_BUILD}/cairn-keys.1.gz
        DESTINATION ${man1} COMPONENT coordinator)

set(CPACK_PACKAGE_NAME cairn)
set(CPACK_PACKAGE_VENDOR "cairn developers")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "${CAIRN_PACKAGE_MAINTAINER}")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_PACKAGE_DIRECTORY ${CMAKE_BINARY_DIR})
set(CPACK_GENERATOR DEB)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL provider coordinator)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
# Debian's libtorch calls BLAS through libblas.so.3, which on a bare Debian 12 is the reference
# BLAS, ~13x slower per matmul (tools/setup.sh): both packages depend on OpenBLAS's pthread build
# (dpkg-shlibdeps appends what the binaries link). tools/package_test.sh found it: a fresh root's
# volunteer probed 5.6 GFLOPS where this machine gives 81.
set(CPACK_DEBIAN_PROVIDER_PACKAGE_DEPENDS libopenblas0-pthread)
set(CPACK_DEBIAN_COORDINATOR_PACKAGE_DEPENDS libopenblas0-pthread)
set(CPACK_DEBIAN_PROVIDER_PACKAGE_NAME cairn-provider)
set(CPACK_DEBIAN_COORDINATOR_PACKAGE_NAME cairn-coordinator)
set(CPACK_DEBIAN_PROVIDER_PACKAGE_CONTROL_EXTRA
    ${CAIRN_PACKAGE_DIR}/postinst ${CAIRN_PACKAGE_DIR}/prerm ${CAIRN_PACKAGE_DIR}/postrm)
string(CONCAT CPACK_COMPONENT_PROVIDER_DESCRIPTION
    "volunteer for a cairn distributed training run\n"
    "cairn trains one PyTorch model across many volunteer machines. This\n"
    "package is the volunteer's side: cairn-provider trains the pipeline\n"
    "stage a coordinator assigns it, streaming activations and gradients to\n"
    "its neighbours over CurveZMQ; the service cairn-provider@NAME runs it\n"
    "unattended as its own unprivileged user, with the invite that\n"
    "cairn-volunteer sets up.")
string(CONCAT CPACK_COMPONENT_COORDINATOR_DESCRIPTION
    "plan and coordinate cairn distributed training runs\n"
    "cairn trains one PyTorch model across many volunteer machines. This\n"
    "package is the researcher's side: cairn-clusterize profiles a\n"
    "TorchScript model, cuts it into pipeline stages and groups the machines\n"
    "into clusters; with --serve it is the coordinator volunteers join (its\n"
    "live web page included), and it merges the trained model.")
include(CPack)
