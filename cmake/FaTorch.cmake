# Locates the installed torch without importing it and without torch's CMake package: the binding
# uses only the LibTorch stable ABI (header-only wrappers over a C shim), so it needs torch's headers
# and the libraries that export that shim, never the CUDA parts of torch's CMake config (which fail
# with a CUDA-enabled torch and no CUDA toolkit).
#   FA_TORCH_DIR           the torch package folder
#   FA_TORCH_HAS_CUDA      TRUE when torch ships libtorch_cuda
#   fa_use_torch_stable_abi(target [CUDA])
#                          compiles target against the stable ABI (oldest runtime: torch 2.9) and
#                          links the shim's library: libtorch_cpu, and libtorch_cuda with CUDA
if(NOT FA_TORCH_DIR)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import importlib.util as u; s = u.find_spec('torch'); print(s.submodule_search_locations[0] if s else '')"
    OUTPUT_VARIABLE FA_TORCH_DIR OUTPUT_STRIP_TRAILING_WHITESPACE)
endif()
if(NOT FA_TORCH_DIR OR NOT EXISTS "${FA_TORCH_DIR}/include/torch/csrc/stable/library.h")
  message(FATAL_ERROR
    "fa: torch (2.9 or newer, with the stable ABI headers) was not found by ${Python_EXECUTABLE}. "
    "Install torch first, then build fa with `pip install --no-build-isolation .` so that the "
    "build sees it.")
endif()

find_library(FA_TORCH_CPU_LIBRARY NAMES torch_cpu PATHS "${FA_TORCH_DIR}/lib" NO_DEFAULT_PATH)
find_library(FA_TORCH_CUDA_LIBRARY NAMES torch_cuda PATHS "${FA_TORCH_DIR}/lib" NO_DEFAULT_PATH)
if(NOT FA_TORCH_CPU_LIBRARY)
  message(FATAL_ERROR "fa: ${FA_TORCH_DIR}/lib has no libtorch_cpu")
endif()
if(FA_TORCH_CUDA_LIBRARY)
  set(FA_TORCH_HAS_CUDA TRUE)
else()
  set(FA_TORCH_HAS_CUDA FALSE)
endif()

# 2.9: the oldest torch whose stable ABI has what the binding calls (TORCH_TARGET_VERSION keeps
# newer calls out at compile time).
set(FA_TORCH_TARGET_VERSION "0x0209000000000000")

function(fa_use_torch_stable_abi target)
  cmake_parse_arguments(ARG "CUDA" "" "" ${ARGN})
  target_include_directories(${target} SYSTEM PRIVATE "${FA_TORCH_DIR}/include")
  target_include_directories(${target} PRIVATE "${PROJECT_SOURCE_DIR}/cpp/include")  # fa/params.h
  target_compile_definitions(${target} PRIVATE TORCH_TARGET_VERSION=${FA_TORCH_TARGET_VERSION})
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fopenmp-simd>)
  # Nothing but the op registrations (static initialisers) is needed from outside: export nothing,
  # so no inline torch header code leaks into the dynamic symbol table.
  set_target_properties(${target} PROPERTIES
    CXX_VISIBILITY_PRESET hidden
    CUDA_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    POSITION_INDEPENDENT_CODE ON)
  if(ARG_CUDA)
    # The shim declares its CUDA functions (the current stream) under USE_CUDA.
    target_compile_definitions(${target} PRIVATE USE_CUDA)
    target_link_libraries(${target} PRIVATE "${FA_TORCH_CUDA_LIBRARY}")
  endif()
  target_link_libraries(${target} PRIVATE "${FA_TORCH_CPU_LIBRARY}")
endfunction()
