# The layers of src/mxtrain as CMake targets, so the layering is a fact of the build.
#
# Each layer is one static library over one or more folders of src/mxtrain. A layer's sources
# and its users see headers only through the layer's *view*: a folder under the build tree,
# build/<preset>/layers/<target>/mxtrain/, holding a symbolic link to each folder the layer owns.
# A target's include path is its own view plus the views of the layers it links, so
# `#include "mxtrain/train/trainer.hpp"` in model/ does not compile: no view below train/ holds
# mxtrain/train. tests/layering (label cpu) builds such upward includes and expects exactly that
# error, and builds an allowed downward one that must compile.

# mxtrain_layer(TARGET FOLDERS folder... [SOURCES file...] [DEPENDS target...] [NO_VIEW])
#   FOLDERS  the folders of src/mxtrain this layer owns (its view links them); their *.cpp
#            files (not recursive) are its sources unless SOURCES is given
#   DEPENDS  the layers directly below that this one uses
#   NO_VIEW  the target compiles sources of a folder another layer owns (the backend registry)
function(mxtrain_layer target)
  cmake_parse_arguments(LAYER "NO_VIEW" "" "FOLDERS;SOURCES;DEPENDS" ${ARGN})
  set(sources ${LAYER_SOURCES})
  if(NOT sources)
    foreach(folder IN LISTS LAYER_FOLDERS)
      file(GLOB folder_sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/mxtrain/${folder}/*.cpp)
      list(APPEND sources ${folder_sources})
    endforeach()
  endif()
  add_library(${target} STATIC ${sources})
  if(NOT LAYER_NO_VIEW)
    set(view ${PROJECT_BINARY_DIR}/layers/${target})
    file(MAKE_DIRECTORY ${view}/mxtrain)
    foreach(folder IN LISTS LAYER_FOLDERS)
      if(NOT EXISTS ${view}/mxtrain/${folder})
        file(CREATE_LINK ${PROJECT_SOURCE_DIR}/src/mxtrain/${folder} ${view}/mxtrain/${folder} SYMBOLIC)
      endif()
    endforeach()
    target_include_directories(${target} PUBLIC ${view})
  endif()
  target_link_libraries(${target} PUBLIC ${LAYER_DEPENDS})
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>)
  set_property(GLOBAL APPEND PROPERTY MXTRAIN_LAYERS ${target})
endfunction()
