# loom_add_plugin(<target> SOURCES <src>... [OUTPUT_NAME <name>])
#
# Builds a Loom plugin: a MODULE library that exports exactly loom_plugin_init / loom_plugin_score
# (version script), with hidden visibility, -z defs (no undefined host symbols), --exclude-libs,ALL
# (static dependencies stay private) and $ORIGIN in its RPATH. Link only what the plugin needs;
# never the host. Name the output libloom-<kind>-<name> so `loom plugins` finds it.
function(loom_add_plugin target)
  cmake_parse_arguments(P "" "OUTPUT_NAME" "SOURCES" ${ARGN})
  add_library(${target} MODULE ${P_SOURCES})
  target_link_libraries(${target} PRIVATE loom::sdk)
  set_target_properties(${target} PROPERTIES
    PREFIX ""
    CXX_VISIBILITY_PRESET hidden
    C_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    BUILD_RPATH "$ORIGIN"
    INSTALL_RPATH "$ORIGIN")
  if(P_OUTPUT_NAME)
    set_target_properties(${target} PROPERTIES OUTPUT_NAME ${P_OUTPUT_NAME})
  endif()
  if(NOT APPLE AND NOT WIN32)
    target_link_options(${target} PRIVATE
      "LINKER:--version-script=${LOOM_SDK_CMAKE_DIR}/loom_plugin.map"
      "LINKER:-z,defs" "LINKER:--exclude-libs,ALL")
  endif()
endfunction()
