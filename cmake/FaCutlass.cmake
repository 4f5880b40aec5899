# Locates the CUTLASS/CuTe headers: FA_CUTLASS_DIR (a folder holding cute/ and cutlass/) when given,
# else the headers inside the installed nvidia-cutlass wheel (cutlass_library/source/include).
#   FA_CUTLASS_INCLUDE_DIR
if(FA_CUTLASS_DIR)
  set(FA_CUTLASS_INCLUDE_DIR "${FA_CUTLASS_DIR}")
  if(EXISTS "${FA_CUTLASS_DIR}/include/cute")
    set(FA_CUTLASS_INCLUDE_DIR "${FA_CUTLASS_DIR}/include")
  endif()
else()
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import importlib.util as u; s = u.find_spec('cutlass_library'); print(s.submodule_search_locations[0] if s else '')"
    OUTPUT_VARIABLE _fa_cutlass_pkg OUTPUT_STRIP_TRAILING_WHITESPACE)
  set(FA_CUTLASS_INCLUDE_DIR "${_fa_cutlass_pkg}/source/include")
endif()
if(NOT EXISTS "${FA_CUTLASS_INCLUDE_DIR}/cute/tensor.hpp")
  message(FATAL_ERROR
    "fa: CUTLASS/CuTe headers not found (looked in '${FA_CUTLASS_INCLUDE_DIR}'). "
    "`pip install nvidia-cutlass==4.2.0.0`, or pass -DFA_CUTLASS_DIR=/path/to/cutlass/include "
    "(pip: -C cmake.define.FA_CUTLASS_DIR=...).")
endif()
message(STATUS "fa: CUTLASS headers: ${FA_CUTLASS_INCLUDE_DIR}")
