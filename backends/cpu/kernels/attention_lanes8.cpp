// The attention kernels with 8-lane vectors, for AVX-512 builds: attention.cpp runs them at head
// widths up to 16 (and says why). Builds without AVX-512 have only these, in attention.cpp.
#ifdef __AVX512F__
#define CJAX_ATTENTION_NS lanes8
#define CJAX_ATTENTION_LANES 8
#include "backends/cpu/kernels/attention_kernels.h"
#endif
