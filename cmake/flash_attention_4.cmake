# FlashAttention-4's Hopper attention backward (train.attention_backward = flash-attention-4),
# compiled ahead of time by scripts/fa4_kernels.sh into MXTRAIN_FLASH_ATTENTION_4: one object
# file a function and (head dimension, group) configuration, each a TVM-FFI packed function;
# TVM-FFI's runtime library (PyPI apache-tvm-ffi) and the CuTe DSL's static CUDA shim (PyPI
# nvidia-cutlass-dsl-libs-cu13), both linked by mxtrain_backend_cuda. fa4_kernels.txt lists the
# configurations; they become generated/mxtrain/flash_attention_4_kernels.inc, the table
# backend/cuda/flash_attention_4.cpp dispatches on.
set(fa4 "${MXTRAIN_FLASH_ATTENTION_4}")
foreach(required fa4_kernels.txt lib/libtvm_ffi.so lib/libcuda_dialect_runtime_static.a include/tvm/ffi/c_api.h
                 include/dlpack/dlpack.h)
  if(NOT EXISTS "${fa4}/${required}")
    message(FATAL_ERROR "MXTRAIN_FLASH_ATTENTION_4=${fa4} has no ${required}: make the folder with "
                        "scripts/fa4_kernels.sh (docs/attention.md), or leave the option empty")
  endif()
endforeach()
file(STRINGS "${fa4}/fa4_kernels.txt" fa4_lines REGEX "^d[0-9]+_g[0-9]+ ")
set(fa4_table "// Generated from ${fa4}/fa4_kernels.txt by cmake/flash_attention_4.cmake.\n")
set(fa4_objects "")
set(fa4_tags "")
foreach(line IN LISTS fa4_lines)
  string(REPLACE " " ";" fields "${line}")
  list(LENGTH fields count)
  if(NOT count EQUAL 6)
    message(FATAL_ERROR "${fa4}/fa4_kernels.txt: '${line}' is not 'tag head_dim group query_tile key_tile rounded_head_dim'")
  endif()
  list(GET fields 0 tag)
  list(GET fields 2 group)
  string(REPLACE ";" ", " arguments "${fields}")
  set(names bwd_pre bwd bwd_post_dq)
  if(group GREATER 1)  # grouped heads: dK and dV have a postprocess of their own
    list(APPEND names bwd_post_dkv)
    string(APPEND fa4_table "MXTRAIN_FA4_GROUPED(${arguments})\n")
  else()
    string(APPEND fa4_table "MXTRAIN_FA4_MULTI_HEAD(${arguments})\n")
  endif()
  foreach(name IN LISTS names)
    if(NOT EXISTS "${fa4}/fa4_${tag}_${name}.o")
      message(FATAL_ERROR "${fa4}: fa4_kernels.txt lists ${tag} but fa4_${tag}_${name}.o is missing; re-run scripts/fa4_kernels.sh")
    endif()
    list(APPEND fa4_objects "${fa4}/fa4_${tag}_${name}.o")
  endforeach()
  list(APPEND fa4_tags ${tag})
endforeach()
if(NOT fa4_tags)
  message(FATAL_ERROR "${fa4}/fa4_kernels.txt lists no configuration")
endif()
file(CONFIGURE OUTPUT ${PROJECT_BINARY_DIR}/generated/mxtrain/flash_attention_4_kernels.inc CONTENT "${fa4_table}")
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${fa4}/fa4_kernels.txt")
set_source_files_properties(${fa4_objects} PROPERTIES EXTERNAL_OBJECT TRUE)
target_sources(mxtrain_backend_cuda PRIVATE ${fa4_objects})
# Only the one file that calls them sees the define and the TVM-FFI headers.
set_source_files_properties(${PROJECT_SOURCE_DIR}/src/mxtrain/backend/cuda/flash_attention_4.cpp PROPERTIES
                            COMPILE_DEFINITIONS MXTRAIN_HAVE_FLASH_ATTENTION_4=1
                            INCLUDE_DIRECTORIES "${fa4}/include;${PROJECT_BINARY_DIR}/generated")
target_link_libraries(mxtrain_backend_cuda PUBLIC "${fa4}/lib/libtvm_ffi.so" "${fa4}/lib/libcuda_dialect_runtime_static.a")
string(REPLACE ";" " " fa4_list "${fa4_tags}")
message(STATUS "FlashAttention-4 backward: ${fa4_list} (${fa4})")

# quack's BF16 GEMMs (scripts/quack_gemm_export.py, run by scripts/fa4_kernels.sh into the same
# folder): candidates of the GEMM autotune beside cuBLASLt's algorithms, and the gated (SwiGLU)
# GEMM of train.gemm_kernels = cublaslt+quack-swiglu, GPT-2's GELU GEMMs (gelu, dgelu, dgelub:
# cublaslt+quack-gelu), and the LM head's linear cross-entropy
# (lce_*: train.head_loss = quack-lce) (docs/gemm-kernels.md).
# A folder made before they were part of it has no quack_gemms.txt and links none. One made by
# another version of the export script (its SOURCES stamp, written by scripts/fa4_kernels.sh)
# may lack functions this source expects: the trainer then runs cuBLASLt there, so say so.
file(SHA256 "${PROJECT_SOURCE_DIR}/scripts/quack_gemm_export.py" quack_export_hash)
set(quack_stamp "")
if(EXISTS "${fa4}/SOURCES")
  file(STRINGS "${fa4}/SOURCES" quack_stamp REGEX " scripts/quack_gemm_export.py$")
endif()
if(EXISTS "${fa4}/quack_gemms.txt" AND NOT quack_stamp MATCHES "^${quack_export_hash} ")
  message(WARNING "${fa4} was made by another version of scripts/quack_gemm_export.py: quack's GEMMs this "
                  "source expects may be missing there (their settings then run cuBLASLt). Re-export them: "
                  "QUACK_ONLY=1 scripts/fa4_kernels.sh ${fa4} (about a minute), or MXTRAIN_WITH_FA4=1 ./scripts/setup.sh")
endif()
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/scripts/quack_gemm_export.py")
if(EXISTS "${fa4}/quack_gemms.txt")
  file(STRINGS "${fa4}/quack_gemms.txt" quack_lines REGEX "^(tn|nn|nt|gated|gelu|dgelu|dgelub|lce_fwd|lce_dx|lce_dw|lce_dwadd) ")
  set(quack_table "// Generated from ${fa4}/quack_gemms.txt by cmake/flash_attention_4.cmake.\n")
  set(quack_objects "")
  foreach(line IN LISTS quack_lines)
    string(REPLACE " " ";" fields "${line}")
    list(LENGTH fields count)
    if(NOT count EQUAL 7)
      message(FATAL_ERROR "${fa4}/quack_gemms.txt: '${line}' is not 'layout config tile_m tile_n cluster_m cluster_n pingpong'")
    endif()
    list(GET fields 0 layout)
    list(GET fields 1 config)
    if(NOT EXISTS "${fa4}/quack_${layout}_${config}.o")
      message(FATAL_ERROR "${fa4}: quack_gemms.txt lists ${layout} ${config} but quack_${layout}_${config}.o is missing; "
                          "re-run scripts/fa4_kernels.sh")
    endif()
    list(APPEND quack_objects "${fa4}/quack_${layout}_${config}.o")
    string(REPLACE ";" ", " arguments "${fields}")
    string(APPEND quack_table "MXTRAIN_QUACK_GEMM(${arguments})\n")
  endforeach()
  if(NOT quack_objects)
    message(FATAL_ERROR "${fa4}/quack_gemms.txt lists no GEMM")
  endif()
  file(CONFIGURE OUTPUT ${PROJECT_BINARY_DIR}/generated/mxtrain/quack_gemm_kernels.inc CONTENT "${quack_table}")
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${fa4}/quack_gemms.txt")
  set_source_files_properties(${quack_objects} PROPERTIES EXTERNAL_OBJECT TRUE)
  target_sources(mxtrain_backend_cuda PRIVATE ${quack_objects})
  set_source_files_properties(${PROJECT_SOURCE_DIR}/src/mxtrain/backend/cuda/quack_gemm.cpp PROPERTIES
                              COMPILE_DEFINITIONS MXTRAIN_HAVE_QUACK_GEMMS=1
                              INCLUDE_DIRECTORIES "${fa4}/include;${PROJECT_BINARY_DIR}/generated")
  list(LENGTH quack_objects quack_count)
  message(STATUS "quack GEMMs for the autotune: ${quack_count} (${fa4})")
endif()
