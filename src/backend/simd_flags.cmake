# Kernels are compiled several times for different instruction sets and picked
# at run time (backend/cpu/cpu_features.h). A file's suffix selects its flags:
#   *_avx2.cc    -> AVX2 + FMA + F16C
#   *_avx512.cc  -> AVX-512 F/BW/VL/DQ + BF16 + F16C
# Everything else is built for the baseline x86-64 target, so the binary runs
# on any x86-64 machine.
function(strata_backend_simd_flags target)
  get_target_property(srcs ${target} SOURCES)
  foreach(src ${srcs})
    if(src MATCHES "_avx2\\.cc$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma;-mf16c")
    elseif(src MATCHES "_avx512\\.cc$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS
        "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx512bf16;-mfma;-mf16c;-mavx2")
    endif()
  endforeach()
endfunction()
