# Third-party dependencies, all from Debian packages (scripts/setup.sh installs them). On the GPU
# machine the header-only ones travel in a carried folder named by CMAKE_PREFIX_PATH /
# CMAKE_INCLUDE_PATH (docs/building.md#building-for-cuda).
add_library(mxtrain_deps INTERFACE)
add_library(mxtrain::deps ALIAS mxtrain_deps)

find_path(TOMLPP_INCLUDE_DIR toml++/toml.h)
if(NOT TOMLPP_INCLUDE_DIR)
  message(FATAL_ERROR "toml++ not found: run scripts/setup.sh (Debian package libtomlplusplus-dev)")
endif()
find_path(CLI11_INCLUDE_DIR CLI/CLI.hpp)
if(NOT CLI11_INCLUDE_DIR)
  message(FATAL_ERROR "CLI11 not found: run scripts/setup.sh (Debian package libcli11-dev)")
endif()
find_path(NLOHMANN_JSON_INCLUDE_DIR nlohmann/json.hpp)
if(NOT NLOHMANN_JSON_INCLUDE_DIR)
  message(FATAL_ERROR "nlohmann/json not found: run scripts/setup.sh (Debian package nlohmann-json3-dev)")
endif()
# toml++ is used header-only so the same code builds where only its headers travel.
target_include_directories(mxtrain_deps SYSTEM INTERFACE ${TOMLPP_INCLUDE_DIR} ${CLI11_INCLUDE_DIR}
                                                         ${NLOHMANN_JSON_INCLUDE_DIR})
target_compile_definitions(mxtrain_deps INTERFACE TOML_HEADER_ONLY=1 TOML_EXCEPTIONS=1)

find_path(CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas x86_64-linux-gnu/openblas-pthread x86_64-linux-gnu)
find_library(OPENBLAS_LIBRARY NAMES openblas)
if(NOT CBLAS_INCLUDE_DIR OR NOT OPENBLAS_LIBRARY)
  message(FATAL_ERROR "OpenBLAS not found: run scripts/setup.sh (Debian package libopenblas-dev)")
endif()
target_include_directories(mxtrain_deps SYSTEM INTERFACE ${CBLAS_INCLUDE_DIR})
target_link_libraries(mxtrain_deps INTERFACE ${OPENBLAS_LIBRARY})

find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(Threads REQUIRED)
target_link_libraries(mxtrain_deps INTERFACE OpenMP::OpenMP_CXX Threads::Threads)

# Open MPI: the CPU communicator and one way to start many nodes. Optional at build time: without
# it, dist.backend=mpi is an error that says to install libopenmpi-dev.
find_package(MPI QUIET COMPONENTS CXX)
set(MXTRAIN_HAVE_MPI OFF)
if(MPI_CXX_FOUND)
  set(MXTRAIN_HAVE_MPI ON)
  target_link_libraries(mxtrain_deps INTERFACE MPI::MPI_CXX)
  target_compile_definitions(mxtrain_deps INTERFACE MXTRAIN_HAVE_MPI=1)
endif()

# The data layer's libraries, each optional at build time like MPI (without one, the input that
# needs it is an error naming the Debian package): PCRE2 (the byte-level BPE pre-tokenizer
# patterns need Unicode classes and look-ahead), utf8proc (Unicode NFC, Qwen2's tokenizer
# normalizer), sentencepiece, and zstd (.jsonl.zst, streamed).
add_library(mxtrain_data_deps INTERFACE)
# mxtrain_optional_library(NAME HEADER LIBRARY): sets MXTRAIN_HAVE_<NAME> and, when found, adds
# the headers, the library and the definition MXTRAIN_HAVE_<NAME>=1 to mxtrain_data_deps.
function(mxtrain_optional_library name header library)
  find_path(${name}_INCLUDE_DIR ${header})
  find_library(${name}_LIBRARY NAMES ${library})
  set(MXTRAIN_HAVE_${name} OFF PARENT_SCOPE)
  if(${name}_INCLUDE_DIR AND ${name}_LIBRARY)
    set(MXTRAIN_HAVE_${name} ON PARENT_SCOPE)
    target_include_directories(mxtrain_data_deps SYSTEM INTERFACE ${${name}_INCLUDE_DIR})
    target_link_libraries(mxtrain_data_deps INTERFACE ${${name}_LIBRARY})
    target_compile_definitions(mxtrain_data_deps INTERFACE MXTRAIN_HAVE_${name}=1)
  endif()
endfunction()
mxtrain_optional_library(PCRE2 pcre2.h pcre2-8)
mxtrain_optional_library(UTF8PROC utf8proc.h utf8proc)
mxtrain_optional_library(SENTENCEPIECE sentencepiece_processor.h sentencepiece)
mxtrain_optional_library(ZSTD zstd.h zstd)

if(MXTRAIN_WITH_CUDA)
  set(MXTRAIN_WITH_CUDA_INT 1)
  target_compile_definitions(mxtrain_deps INTERFACE MXTRAIN_HAVE_CUDA=1)
else()
  set(MXTRAIN_WITH_CUDA_INT 0)
endif()

if(MXTRAIN_TESTS)
  find_package(GTest REQUIRED)
endif()
if(MXTRAIN_BENCHMARKS)
  find_package(benchmark QUIET)
endif()
