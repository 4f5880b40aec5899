# The kernels that ship, and the library that holds them.
#
# Each row of FA_KERNEL_TABLE is one kernel family's entry point; every row is instantiated for each
# dtype in FA_DTYPES, each head dim in FA_HEAD_DIMS and, where the row says so, causal off and on:
# one generated translation unit apiece (named for what it holds, e.g.
# sm80_fwd_hdim128_fp16_causal.cu), so builds run in parallel and a subset can be configured.
#
#   family | direction | entry point (namespace fa::<family>) | params struct | causal axis
#
# causal axis "causal": the entry point is <Tag, head dim, causal, softcap>, one unit each; "-":
# <Tag, head dim>, causality and soft-capping at run time (the KV-cache kernels, which one unit
# serves for all).
#
# Soft-capping (cpp/common/softcap.h) is a third unit of the "causal" rows, <.., true, true> (the
# causal kernels' mask serves a call without bounds too), for the head dims of FA_SOFTCAP_HEAD_DIMS
# in FA_HEAD_DIMS (default 128 and 256: Gemma 2's; a smaller head dim runs on the next one): 8 units
# for the Hopper family; the Ampere family's only where FA_CUDA_ARCHS has an arch besides 90a (on
# Hopper the Hopper family serves soft-capping), keeping a Hopper build within its time.
#
# The Ampere family (sm80) is compiled for every arch in FA_CUDA_ARCHS and has kernels for every
# head dim; the Hopper family (sm90) only when 90a is among them, for its native head dims (a head
# dim between them runs on the next larger one), compiled for sm_90a alone.
#
# In a build for Hopper alone (FA_CUDA_ARCHS 90a), the Ampere family would serve the forward and
# backward of the head dims the Hopper family holds only when FA_KERNEL_FAMILY=sm80 forces it: such
# a build has no Ampere forward and backward units at those head dims (20 units of the default's 78,
# a fifth of its compile time; docs/performance.md), unless FA_SM80_ON_HOPPER asks for them. Then they
# (FA_SM80_RUN_TIME_MASK_HEAD_DIMS) are the causal kernel alone, which serves a call without a mask
# too (unbounded bounds; the causal axis "run-time mask"), one unit instead of two: the forced
# family's non-causal calls 0-4% slower than on their own kernels (docs/performance.md), which is
# why builds with an Ampere-class arch keep both. The KV-cache units are built in every build.
#
# The rows are in the order the units start to compile: the longest first (a build is as long as
# its last unit to finish; measured on the 16-core H100 machine, docs/performance.md).
#
# FA_HEAD_DIM_PAIRS (D/Dv, Dv < D, both multiples of 64, D up to 256; default 192/128): Hopper
# forward kernels for v's head dim below q's and k's, causal off and on, each dtype (entry
# run_forward_dv, units sm90_fwd_hdim<D>v<Dv>_<dtype>[_causal]); a call runs on the smallest pair
# that holds its D and Dv. The pairs with D above 128 and Dv a multiple of 128 (192/128, 256/128)
# get Hopper backward kernels too (entry run_backward_dv, units sm90_bwd_hdim<D>v<Dv>_<dtype>[_causal]);
# a backward runs on the smallest of those that holds its D and Dv. Soft-capping has none: it and
# the other pairs' backward run on one head dim's kernels, padded.
#
# FA_FP8_KV_HEAD_DIMS (of FA_HEAD_DIMS; 64, 128, 256 by default): the Ampere family's KV-cache
# kernels for float8_e4m3fn caches (entry run_forward_kvcache_fp8, units
# sm80_kvcache_fp8_hdim<D>_<dtype>, every arch of FA_CUDA_ARCHS); a smaller head dim runs on the
# next one.
# FA_FP8_HEAD_DIMS (of FA_HEAD_DIMS; 64 and 128, by default 128): the Hopper forward's kernels for float8_e4m3fn
# q, k and v (entry run_forward_fp8, causal off and on, units sm90_fwd_fp8_hdim<D>[_causal]; the
# output's dtype is chosen at run time), only where FA_CUDA_ARCHS has 90a.
# FA_FP8_HEAD_DIM_PAIRS (D/Dv as FA_HEAD_DIM_PAIRS; default 192/128): the FP8 forward's kernels for
# v's head dim below q's and k's (the same entry, units sm90_fwd_fp8_hdim<D>v<Dv>[_causal]); a call
# runs on the smallest pair that holds its D and Dv.
set(FA_SUPPORTED_HEAD_DIMS 32 64 96 128 256)
set(FA_FP8_SUPPORTED_HEAD_DIMS 64 128)
set(FA_FP8_KV_SUPPORTED_HEAD_DIMS 64 128 256)
# The Hopper family's native head dims, forward and backward.
set(FA_SM90_NATIVE_HEAD_DIMS 64 128 256)
set(FA_SM90_BWD_NATIVE_HEAD_DIMS 64 128 256)
set(FA_SM90_HEAD_DIMS "")
set(FA_SM90_BWD_HEAD_DIMS "")
foreach(_hdim IN LISTS FA_HEAD_DIMS)
  if(_hdim IN_LIST FA_SM90_NATIVE_HEAD_DIMS)
    list(APPEND FA_SM90_HEAD_DIMS ${_hdim})
  endif()
  if(_hdim IN_LIST FA_SM90_BWD_NATIVE_HEAD_DIMS)
    list(APPEND FA_SM90_BWD_HEAD_DIMS ${_hdim})
  endif()
endforeach()
set(FA_KERNEL_TABLE "")
if("90a" IN_LIST FA_CUDA_ARCHS AND FA_SM90_BWD_HEAD_DIMS)
  list(APPEND FA_KERNEL_TABLE "sm90|bwd|run_backward|BackwardParams|causal")
endif()
if("90a" IN_LIST FA_CUDA_ARCHS AND FA_SM90_HEAD_DIMS)
  list(APPEND FA_KERNEL_TABLE "sm90|fwd|run_forward|ForwardParams|causal")
endif()
# The Ampere family's forward and backward head dims (FA_SM80_HEAD_DIMS): every head dim where
# FA_CUDA_ARCHS has an arch besides 90a. In a build for 90a alone, the head dims the Hopper family
# serves (forward and backward, on a native head dim >= it) only with FA_SM80_ON_HOPPER, as the
# causal kernel alone (FA_SM80_RUN_TIME_MASK_HEAD_DIMS); the others as everywhere.
set(_fa_ampere_arch FALSE)
foreach(_arch IN LISTS FA_CUDA_ARCHS)
  if(NOT _arch STREQUAL "90a")
    set(_fa_ampere_arch TRUE)
  endif()
endforeach()
set(FA_SM80_HEAD_DIMS "")
set(FA_SM80_RUN_TIME_MASK_HEAD_DIMS "")
foreach(_hdim IN LISTS FA_HEAD_DIMS)
  set(_fa_served FALSE)
  if(NOT _fa_ampere_arch AND "90a" IN_LIST FA_CUDA_ARCHS)
    foreach(_sm90 IN LISTS FA_SM90_HEAD_DIMS)
      if(_sm90 GREATER_EQUAL _hdim AND _sm90 IN_LIST FA_SM90_BWD_HEAD_DIMS)
        set(_fa_served TRUE)
      endif()
    endforeach()
  endif()
  if(NOT _fa_served)
    list(APPEND FA_SM80_HEAD_DIMS ${_hdim})
  elseif(FA_SM80_ON_HOPPER)
    list(APPEND FA_SM80_HEAD_DIMS ${_hdim})
    list(APPEND FA_SM80_RUN_TIME_MASK_HEAD_DIMS ${_hdim})
  endif()
endforeach()
list(APPEND FA_KERNEL_TABLE "sm80|kvcache|run_forward_kvcache|ForwardParams|-")
if(FA_SM80_HEAD_DIMS)
  list(APPEND FA_KERNEL_TABLE
    "sm80|bwd|run_backward|BackwardParams|causal"
    "sm80|fwd|run_forward|ForwardParams|causal"
  )
endif()
set(FA_SUPPORTED_DTYPES fp16 bf16)

# The pairs of the list variable `option` (FA_HEAD_DIM_PAIRS or FA_FP8_HEAD_DIM_PAIRS), checked, into
# `out` where FA_CUDA_ARCHS has 90a (else none).
function(_fa_head_dim_pairs option out)
  set(_pairs "")
  foreach(_pair IN LISTS ${option})
    if(NOT _pair MATCHES "^([0-9]+)/([0-9]+)$")
      message(FATAL_ERROR "fa: ${option} entry '${_pair}' is not D/Dv (e.g. 192/128)")
    endif()
    set(_d ${CMAKE_MATCH_1})
    set(_dv ${CMAKE_MATCH_2})
    math(EXPR _d_rem "${_d} % 64")
    math(EXPR _dv_rem "${_dv} % 64")
    if(_d_rem OR _dv_rem OR _d GREATER 256 OR NOT _dv LESS _d OR _dv LESS 64)
      message(FATAL_ERROR "fa: ${option} entry '${_pair}': D and Dv must be multiples of 64, Dv < D <= 256")
    endif()
    if("90a" IN_LIST FA_CUDA_ARCHS)
      list(APPEND _pairs ${_pair})
    endif()
  endforeach()
  set(${out} "${_pairs}" PARENT_SCOPE)
endfunction()
_fa_head_dim_pairs(FA_HEAD_DIM_PAIRS FA_SM90_HEAD_DIM_PAIRS)
_fa_head_dim_pairs(FA_FP8_HEAD_DIM_PAIRS FA_SM90_FP8_HEAD_DIM_PAIRS)
# The pairs the Hopper backward takes (cpp/sm90/bwd_config.h): D above 128, Dv a multiple of 128.
set(FA_SM90_BWD_HEAD_DIM_PAIRS "")
foreach(_pair IN LISTS FA_SM90_HEAD_DIM_PAIRS)
  string(REPLACE "/" ";" _dims "${_pair}")
  list(GET _dims 0 _d)
  list(GET _dims 1 _dv)
  math(EXPR _dv_rem "${_dv} % 128")
  if(_d GREATER 128 AND NOT _dv_rem)
    list(APPEND FA_SM90_BWD_HEAD_DIM_PAIRS ${_pair})
  endif()
endforeach()

# One translation unit: ${FA_GENERATED_DIR}/instantiations/<name>.cu instantiating
# fa::<family>::<entry><<args>>(const fa::<params>&, cudaStream_t), compiled with <gencode>;
# appended to _sources.
macro(_fa_generate_unit name what family direction entry params args gencode)
  set(FA_FAMILY ${family})
  set(FA_DIRECTION ${direction})
  set(FA_ENTRY ${entry})
  set(FA_PARAMS ${params})
  set(FA_TEMPLATE_ARGS "${args}")
  set(FA_WHAT "${what}")
  configure_file("${PROJECT_SOURCE_DIR}/cpp/instantiations/instantiation.cu.in"
                 "${FA_GENERATED_DIR}/instantiations/${name}.cu" @ONLY)
  list(APPEND _sources "${FA_GENERATED_DIR}/instantiations/${name}.cu")
  set_source_files_properties("${FA_GENERATED_DIR}/instantiations/${name}.cu" PROPERTIES
    COMPILE_OPTIONS "${gencode}")
endmacro()

# The Hopper units for the head dim pairs of FA_HEAD_DIM_PAIRS (appended to _sources): the
# backward's first (the longer units), then the forward's; and their lists for build_config.h
# (FA_CFG_SM90_HEAD_DIM_PAIRS, FA_CFG_SM90_BWD_HEAD_DIM_PAIRS).
macro(_fa_generate_pair_units)
  set(FA_CFG_SM90_HEAD_DIM_PAIRS "")
  set(FA_CFG_SM90_BWD_HEAD_DIM_PAIRS "")
  foreach(_pair IN LISTS FA_SM90_BWD_HEAD_DIM_PAIRS)
    string(REPLACE "/" ";" _dims "${_pair}")
    list(GET _dims 0 _d)
    list(GET _dims 1 _dv)
    string(APPEND FA_CFG_SM90_BWD_HEAD_DIM_PAIRS "${_d}, ${_dv}, ")
    foreach(_dtype IN LISTS FA_DTYPES)
      foreach(_causal false true)
        set(_name "sm90_bwd_hdim${_d}v${_dv}_${_dtype}")
        if(_causal)
          string(APPEND _name "_causal")
        endif()
        _fa_generate_unit(${_name} "sm90 bwd, ${_fa_tag_${_dtype}}, head dims ${_d} (q, k) and ${_dv} (v), causal: ${_causal}"
                          sm90 bwd run_backward_dv BackwardParams "fa::${_fa_tag_${_dtype}}, ${_d}, ${_dv}, ${_causal}, false"
                          "-gencode=arch=compute_90a,code=sm_90a")
      endforeach()
    endforeach()
  endforeach()
  foreach(_pair IN LISTS FA_SM90_HEAD_DIM_PAIRS)
    string(REPLACE "/" ";" _dims "${_pair}")
    list(GET _dims 0 _d)
    list(GET _dims 1 _dv)
    string(APPEND FA_CFG_SM90_HEAD_DIM_PAIRS "${_d}, ${_dv}, ")
    foreach(_dtype IN LISTS FA_DTYPES)
      foreach(_causal false true)
        set(_name "sm90_fwd_hdim${_d}v${_dv}_${_dtype}")
        if(_causal)
          string(APPEND _name "_causal")
        endif()
        _fa_generate_unit(${_name} "sm90 fwd, ${_fa_tag_${_dtype}}, head dims ${_d} (q, k) and ${_dv} (v), causal: ${_causal}"
                          sm90 fwd run_forward_dv ForwardParams "fa::${_fa_tag_${_dtype}}, ${_d}, ${_dv}, ${_causal}, false"
                          "-gencode=arch=compute_90a,code=sm_90a")
      endforeach()
    endforeach()
  endforeach()
endmacro()

# The FP8 forward's units (FA_SM90_FP8_HEAD_DIMS, then the pairs FA_SM90_FP8_HEAD_DIM_PAIRS),
# appended to _sources, and their lists for build_config.h (FA_CFG_SM90_FP8_HEAD_DIMS,
# FA_CFG_SM90_FP8_HEAD_DIM_PAIRS).
macro(_fa_generate_fp8_forward_units)
  set(FA_CFG_SM90_FP8_HEAD_DIMS "")
  set(FA_CFG_SM90_FP8_HEAD_DIM_PAIRS "")
  set(_fa_fp8_units "")
  foreach(_hdim IN LISTS FA_SM90_FP8_HEAD_DIMS)
    string(APPEND FA_CFG_SM90_FP8_HEAD_DIMS "${_hdim}, ")
    list(APPEND _fa_fp8_units "${_hdim}|${_hdim}|${_hdim}")
  endforeach()
  foreach(_pair IN LISTS FA_SM90_FP8_HEAD_DIM_PAIRS)
    string(REPLACE "/" ";" _dims "${_pair}")
    list(GET _dims 0 _d)
    list(GET _dims 1 _dv)
    string(APPEND FA_CFG_SM90_FP8_HEAD_DIM_PAIRS "${_d}, ${_dv}, ")
    list(APPEND _fa_fp8_units "${_d}v${_dv}|${_d}|${_dv}")
  endforeach()
  foreach(_unit IN LISTS _fa_fp8_units)
    string(REPLACE "|" ";" _unit "${_unit}")
    list(GET _unit 0 _suffix)
    list(GET _unit 1 _d)
    list(GET _unit 2 _dv)
    foreach(_causal false true)
      set(_name "sm90_fwd_fp8_hdim${_suffix}")
      if(_causal)
        string(APPEND _name "_causal")
      endif()
      _fa_generate_unit(${_name} "sm90 fwd, float8_e4m3fn q, k, v, head dims ${_d} (q, k) and ${_dv} (v), causal: ${_causal}"
                        sm90 fwd run_forward_fp8 ForwardParams "${_d}, ${_causal}, ${_dv}"
                        "-gencode=arch=compute_90a,code=sm_90a")
    endforeach()
  endforeach()
endmacro()

# The KV-cache units for float8_e4m3fn caches (FA_SM80_FP8_KV_HEAD_DIMS), appended to _sources,
# and their list for build_config.h (FA_CFG_SM80_FP8_KV_HEAD_DIMS).
macro(_fa_generate_fp8_kv_units)
  set(FA_CFG_SM80_FP8_KV_HEAD_DIMS "")
  foreach(_hdim IN LISTS FA_SM80_FP8_KV_HEAD_DIMS)
    string(APPEND FA_CFG_SM80_FP8_KV_HEAD_DIMS "${_hdim}, ")
    foreach(_dtype IN LISTS FA_DTYPES)
      _fa_generate_unit("sm80_kvcache_fp8_hdim${_hdim}_${_dtype}"
                        "sm80 kvcache, ${_fa_tag_${_dtype}} queries, float8_e4m3fn cache, head dim ${_hdim}"
                        sm80 kvcache run_forward_kvcache_fp8 ForwardParams "fa::${_fa_tag_${_dtype}}, ${_hdim}"
                        "${FA_GENCODE_FLAGS}")
    endforeach()
  endforeach()
endmacro()

foreach(_hdim IN LISTS FA_SOFTCAP_HEAD_DIMS)
  if(NOT _hdim IN_LIST FA_SUPPORTED_HEAD_DIMS)
    message(FATAL_ERROR "fa: FA_SOFTCAP_HEAD_DIMS entry '${_hdim}' is not one of ${FA_SUPPORTED_HEAD_DIMS}")
  endif()
endforeach()
set(FA_SM80_FP8_KV_HEAD_DIMS "")
foreach(_hdim IN LISTS FA_FP8_KV_HEAD_DIMS)
  if(NOT _hdim IN_LIST FA_FP8_KV_SUPPORTED_HEAD_DIMS)
    message(FATAL_ERROR "fa: FA_FP8_KV_HEAD_DIMS entry '${_hdim}' is not one of ${FA_FP8_KV_SUPPORTED_HEAD_DIMS}")
  endif()
  if(_hdim IN_LIST FA_HEAD_DIMS)
    list(APPEND FA_SM80_FP8_KV_HEAD_DIMS ${_hdim})
  endif()
endforeach()
set(FA_SM90_FP8_HEAD_DIMS "")
foreach(_hdim IN LISTS FA_FP8_HEAD_DIMS)
  if(NOT _hdim IN_LIST FA_FP8_SUPPORTED_HEAD_DIMS)
    message(FATAL_ERROR "fa: FA_FP8_HEAD_DIMS entry '${_hdim}' is not one of ${FA_FP8_SUPPORTED_HEAD_DIMS}")
  endif()
  if(_hdim IN_LIST FA_HEAD_DIMS AND "90a" IN_LIST FA_CUDA_ARCHS)
    list(APPEND FA_SM90_FP8_HEAD_DIMS ${_hdim})
  endif()
endforeach()
set(FA_SM80_SOFTCAP_HEAD_DIMS "")
set(FA_SM90_SOFTCAP_HEAD_DIMS "")
foreach(_hdim IN LISTS FA_SOFTCAP_HEAD_DIMS)
  if(_hdim IN_LIST FA_HEAD_DIMS)
    if(_fa_ampere_arch)
      list(APPEND FA_SM80_SOFTCAP_HEAD_DIMS ${_hdim})
    endif()
    if("90a" IN_LIST FA_CUDA_ARCHS AND _hdim IN_LIST FA_SM90_HEAD_DIMS AND _hdim IN_LIST FA_SM90_BWD_HEAD_DIMS)
      list(APPEND FA_SM90_SOFTCAP_HEAD_DIMS ${_hdim})
    endif()
  endif()
endforeach()

foreach(_hdim IN LISTS FA_HEAD_DIMS)
  if(NOT _hdim IN_LIST FA_SUPPORTED_HEAD_DIMS)
    message(FATAL_ERROR "fa: FA_HEAD_DIMS entry '${_hdim}' is not one of ${FA_SUPPORTED_HEAD_DIMS}")
  endif()
endforeach()
foreach(_dtype IN LISTS FA_DTYPES)
  if(NOT _dtype IN_LIST FA_SUPPORTED_DTYPES)
    message(FATAL_ERROR "fa: FA_DTYPES entry '${_dtype}' is not one of ${FA_SUPPORTED_DTYPES}")
  endif()
endforeach()

set(FA_GENERATED_DIR "${CMAKE_CURRENT_BINARY_DIR}/generated")
set(_fa_tag_fp16 Float16)
set(_fa_tag_bf16 BFloat16)

# fa_add_kernel_library(<target>): a static library of every instantiation above, and
# ${FA_GENERATED_DIR}/fa/build_config.h, which tells the binding what the library holds.
function(fa_add_kernel_library target)
  set(_sources "")
  foreach(_flag SM80_BWD SM90_FWD SM90_BWD FP16 BF16)
    set(FA_CFG_${_flag} false)
  endforeach()
  # The pair units start to compile after the Hopper rows' and before the Ampere family's (whose
  # units are shorter: the build's tail).
  set(_fa_pairs_generated FALSE)
  foreach(_row IN LISTS FA_KERNEL_TABLE)
    string(REPLACE "|" ";" _row "${_row}")
    list(GET _row 0 _family)
    if(_family STREQUAL "sm80" AND NOT _fa_pairs_generated)
      _fa_generate_pair_units()  # (sets FA_FAMILY and the like: read from the row below)
      _fa_generate_fp8_forward_units()
      _fa_generate_fp8_kv_units()
      set(_fa_pairs_generated TRUE)
    endif()
    list(GET _row 0 FA_FAMILY)
    list(GET _row 1 FA_DIRECTION)
    list(GET _row 2 FA_ENTRY)
    list(GET _row 3 FA_PARAMS)
    list(GET _row 4 _causal_axis)
    string(TOUPPER "${FA_FAMILY}_${FA_DIRECTION}" _family_dir)
    set(_row_head_dims ${FA_SM80_HEAD_DIMS})
    set(_row_gencode ${FA_GENCODE_FLAGS})
    if(FA_DIRECTION STREQUAL "kvcache")
      set(_row_head_dims ${FA_HEAD_DIMS})
    elseif(FA_FAMILY STREQUAL "sm90")
      if(FA_DIRECTION STREQUAL "bwd")
        set(_row_head_dims ${FA_SM90_BWD_HEAD_DIMS})
      else()
        set(_row_head_dims ${FA_SM90_HEAD_DIMS})
      endif()
      # wgmma N sizes outside CuTe's default list (80, 144, ...) come from cpp/sm90/mma_ops.h,
      # without CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED (which would add 30 s to each unit's compile).
      set(_row_gencode "-gencode=arch=compute_90a,code=sm_90a")
    endif()
    set(FA_CFG_${_family_dir} true)
    foreach(_dtype IN LISTS FA_DTYPES)
      set(FA_TAG ${_fa_tag_${_dtype}})
      foreach(FA_HDIM IN LISTS _row_head_dims)
        set(_causal_values false true)
        string(TOUPPER "${FA_FAMILY}" _family_up)
        if(FA_HDIM IN_LIST FA_${_family_up}_SOFTCAP_HEAD_DIMS)
          list(APPEND _causal_values softcap)
        endif()
        if(_causal_axis STREQUAL "-")
          set(_causal_values run-time)
        elseif(FA_FAMILY STREQUAL "sm80" AND FA_HDIM IN_LIST FA_SM80_RUN_TIME_MASK_HEAD_DIMS)
          list(REMOVE_ITEM _causal_values false true)
          list(PREPEND _causal_values run-time-mask)
        endif()
        foreach(_causal IN LISTS _causal_values)
          set(_name "${FA_FAMILY}_${FA_DIRECTION}_hdim${FA_HDIM}_${_dtype}")
          set(FA_TEMPLATE_ARGS "fa::${FA_TAG}, ${FA_HDIM}")
          set(FA_WHAT "${FA_FAMILY} ${FA_DIRECTION}, ${FA_TAG}, head dim ${FA_HDIM}, causal: ${_causal}")
          if(_causal STREQUAL "softcap")
            set(FA_WHAT "${FA_FAMILY} ${FA_DIRECTION}, ${FA_TAG}, head dim ${FA_HDIM}, causal mask, soft-capped")
            string(APPEND FA_TEMPLATE_ARGS ", true, true")
            string(APPEND _name "_causal_softcap")
          elseif(_causal STREQUAL "run-time-mask")
            set(FA_WHAT "${FA_FAMILY} ${FA_DIRECTION}, ${FA_TAG}, head dim ${FA_HDIM}, causal mask serving every mask")
            string(APPEND FA_TEMPLATE_ARGS ", true, false")
            string(APPEND _name "_mask")
          elseif(NOT _causal STREQUAL "run-time")
            string(APPEND FA_TEMPLATE_ARGS ", ${_causal}, false")
          endif()
          if(_causal STREQUAL "true")
            string(APPEND _name "_causal")
          endif()
          _fa_generate_unit(${_name} "${FA_WHAT}" ${FA_FAMILY} ${FA_DIRECTION} ${FA_ENTRY} ${FA_PARAMS}
                            "${FA_TEMPLATE_ARGS}" "${_row_gencode}")
        endforeach()
      endforeach()
    endforeach()
  endforeach()
  if(NOT _fa_pairs_generated)
    _fa_generate_pair_units()
    _fa_generate_fp8_forward_units()
    _fa_generate_fp8_kv_units()
  endif()
  foreach(_dtype IN LISTS FA_DTYPES)
    string(TOUPPER "${_dtype}" _up)
    set(FA_CFG_${_up} true)
  endforeach()
  string(REPLACE ";" ", " FA_CFG_HEAD_DIMS "${FA_HEAD_DIMS}")
  set(FA_CFG_SM90_HEAD_DIMS "")
  if(FA_CFG_SM90_FWD)
    string(REPLACE ";" ", " FA_CFG_SM90_HEAD_DIMS "${FA_SM90_HEAD_DIMS},")
  endif()
  set(FA_CFG_SM90_BWD_HEAD_DIMS "")
  if(FA_CFG_SM90_BWD)
    string(REPLACE ";" ", " FA_CFG_SM90_BWD_HEAD_DIMS "${FA_SM90_BWD_HEAD_DIMS},")
  endif()
  set(FA_CFG_SM80_HEAD_DIMS "")
  if(FA_CFG_SM80_BWD)
    string(REPLACE ";" ", " FA_CFG_SM80_HEAD_DIMS "${FA_SM80_HEAD_DIMS},")
  endif()
  string(REPLACE ";" ", " FA_CFG_SM80_SOFTCAP_HEAD_DIMS "${FA_SM80_SOFTCAP_HEAD_DIMS}")
  string(REPLACE ";" ", " FA_CFG_SM80_RUN_TIME_MASK_HEAD_DIMS "${FA_SM80_RUN_TIME_MASK_HEAD_DIMS}")
  if(FA_CFG_SM80_RUN_TIME_MASK_HEAD_DIMS)
    string(APPEND FA_CFG_SM80_RUN_TIME_MASK_HEAD_DIMS ",")
  endif()
  string(REPLACE ";" ", " FA_CFG_SM90_SOFTCAP_HEAD_DIMS "${FA_SM90_SOFTCAP_HEAD_DIMS}")
  if(FA_CFG_SM80_SOFTCAP_HEAD_DIMS)
    string(APPEND FA_CFG_SM80_SOFTCAP_HEAD_DIMS ",")
  endif()
  if(FA_CFG_SM90_SOFTCAP_HEAD_DIMS)
    string(APPEND FA_CFG_SM90_SOFTCAP_HEAD_DIMS ",")
  endif()
  string(REPLACE ";" "," FA_CFG_ARCHS "${FA_CUDA_ARCHS}")
  configure_file("${PROJECT_SOURCE_DIR}/cpp/include/fa/build_config.h.in"
                 "${FA_GENERATED_DIR}/fa/build_config.h" @ONLY)

  add_library(${target} STATIC ${_sources})
  target_include_directories(${target}
    PUBLIC "${PROJECT_SOURCE_DIR}/cpp/include" "${FA_GENERATED_DIR}"
    PRIVATE "${PROJECT_SOURCE_DIR}/cpp" "${FA_CUTLASS_INCLUDE_DIR}")
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-O3 --use_fast_math --expt-relaxed-constexpr
      -DNDEBUG -Xcudafe=--diag_suppress=177 --split-compile=0>)
  if(FA_LINEINFO)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo>)
  endif()
  if(FA_PTXAS_VERBOSE)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xptxas=-v>)
  endif()
  set_target_properties(${target} PROPERTIES
    CUDA_ARCHITECTURES OFF
    CUDA_STANDARD 17
    CUDA_STANDARD_REQUIRED ON
    POSITION_INDEPENDENT_CODE ON)
endfunction()
