// The explicit instantiations of grad/device/sampling.hpp's functions, once
// for both builds of them: kernels/sampling.cu (CUDA) and
// kernels/cuda_absent.cpp (no nvcc).
#pragma once

#include "grad/device/sampling.hpp"

#define GRAD_SAMPLING_INSTANCES(T)                                                                        \
  template void cuda_top_k_async<T>(const T*, std::size_t, std::size_t, std::int32_t*, T*, void*, void*); \
  template TopK<T> cuda_top_k<T>(std::span<const T>, std::size_t);                                      \
  template std::int32_t cuda_argmax<T>(std::span<const T>);
