# Locates the installed torch without importing it (importing needs its CUDA libraries, which a
# build machine may lack), and tells whether it is a CUDA build.
#   FA_TORCH_DIR       the torch package folder
#   FA_TORCH_HAS_CUDA  TRUE when torch ships libtorch_cuda
if(NOT FA_TORCH_DIR)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import importlib.util as u; s = u.find_spec('torch'); print(s.submodule_search_locations[0] if s else '')"
    OUTPUT_VARIABLE FA_TORCH_DIR OUTPUT_STRIP_TRAILING_WHITESPACE)
endif()
if(NOT FA_TORCH_DIR OR NOT EXISTS "${FA_TORCH_DIR}/share/cmake/Torch")
  message(FATAL_ERROR
    "fa: torch was not found by ${Python_EXECUTABLE}. Install torch first, then build fa with "
    "`pip install --no-build-isolation .` so that the build sees it.")
endif()
file(GLOB _fa_torch_cuda_lib "${FA_TORCH_DIR}/lib/libtorch_cuda.so" "${FA_TORCH_DIR}/lib/torch_cuda.dll")
if(_fa_torch_cuda_lib)
  set(FA_TORCH_HAS_CUDA TRUE)
else()
  set(FA_TORCH_HAS_CUDA FALSE)
endif()
list(APPEND CMAKE_PREFIX_PATH "${FA_TORCH_DIR}/share/cmake")
