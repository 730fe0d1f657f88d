# Writes outbox.pc at install time (install(CODE) in the top CMakeLists.txt sets the
# OUTBOX_PC_* variables), when CMAKE_INSTALL_PREFIX is the prefix actually installed to:
# `cmake --install build --prefix /opt/x` gives a file that says /opt/x. DESTDIR is honoured
# and the file goes into install_manifest.txt like every other.
set(OUTBOX_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
foreach(kind LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${OUTBOX_PC_${kind}}")
    set(OUTBOX_PC_${kind}_VALUE "${OUTBOX_PC_${kind}}")
    set(OUTBOX_PC_${kind}_FULL "${OUTBOX_PC_${kind}}")
  else()
    set(OUTBOX_PC_${kind}_VALUE "\${prefix}/${OUTBOX_PC_${kind}}")
    set(OUTBOX_PC_${kind}_FULL "${CMAKE_INSTALL_PREFIX}/${OUTBOX_PC_${kind}}")
  endif()
endforeach()
set(outbox_pc_file "$ENV{DESTDIR}${OUTBOX_PC_LIBDIR_FULL}/pkgconfig/outbox.pc")
message(STATUS "Installing: ${outbox_pc_file}")
configure_file("${OUTBOX_PC_TEMPLATE}" "${outbox_pc_file}" @ONLY)
list(APPEND CMAKE_INSTALL_MANIFEST_FILES "${outbox_pc_file}")
