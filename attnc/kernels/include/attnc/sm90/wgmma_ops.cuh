// Owns: the wgmma.mma_async instructions the Hopper prefill issues, one wrapper per
// (input type, N): D[64 x N] (+)= A[64 x 16] * B[16 x N] with fp32 accumulators d[N / 8][4]
// (warp w of the warpgroup holds rows 16w + lane / 4 and 16w + lane / 4 + 8; block j holds
// columns 8j + 2 * (lane % 4) and the next one: the mma.sync C layout repeated along N).
//   ss: A and B from shared-memory descriptors (both K-major).
//   rs: A from four registers (the mma.sync m16n8k16 A fragment of the warp's 16 rows), B from
//       a descriptor; kTransB = 1 reads B MN-major (rows of B along K are contiguous in N).
// scale_d = 0 overwrites D, 1 accumulates.
// Every wrapper comes from ATTNC_WGMMA_SPEC: the accumulator operand list is built by doubling
// (ATTNC_WGMMA_ACC_BLOCKS_*), the PTX register list is one table per N (ATTNC_WGMMA_REGS_*).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

// "+f" operands of accumulator blocks j .. j + count - 1 (4 floats per block).
#define ATTNC_WGMMA_ACC_BLOCKS_1(j) \
  "+f"(d[(j)][0]), "+f"(d[(j)][1]), "+f"(d[(j)][2]), "+f"(d[(j)][3])
#define ATTNC_WGMMA_ACC_BLOCKS_2(j) ATTNC_WGMMA_ACC_BLOCKS_1(j), ATTNC_WGMMA_ACC_BLOCKS_1((j) + 1)
#define ATTNC_WGMMA_ACC_BLOCKS_4(j) ATTNC_WGMMA_ACC_BLOCKS_2(j), ATTNC_WGMMA_ACC_BLOCKS_2((j) + 2)
#define ATTNC_WGMMA_ACC_BLOCKS_8(j) ATTNC_WGMMA_ACC_BLOCKS_4(j), ATTNC_WGMMA_ACC_BLOCKS_4((j) + 4)
#define ATTNC_WGMMA_ACC_BLOCKS_16(j) ATTNC_WGMMA_ACC_BLOCKS_8(j), ATTNC_WGMMA_ACC_BLOCKS_8((j) + 8)
#define ATTNC_WGMMA_ACC_BLOCKS_32(j) \
  ATTNC_WGMMA_ACC_BLOCKS_16(j), ATTNC_WGMMA_ACC_BLOCKS_16((j) + 16)
#define ATTNC_WGMMA_ACC_64 ATTNC_WGMMA_ACC_BLOCKS_8(0)
#define ATTNC_WGMMA_ACC_80 ATTNC_WGMMA_ACC_BLOCKS_8(0), ATTNC_WGMMA_ACC_BLOCKS_2(8)
#define ATTNC_WGMMA_ACC_128 ATTNC_WGMMA_ACC_BLOCKS_16(0)
#define ATTNC_WGMMA_ACC_144 ATTNC_WGMMA_ACC_BLOCKS_16(0), ATTNC_WGMMA_ACC_BLOCKS_2(16)
#define ATTNC_WGMMA_ACC_256 ATTNC_WGMMA_ACC_BLOCKS_32(0)

// PTX accumulator registers %0 .. %(N / 2 - 1); the operands after them are numbered from N / 2.
#define ATTNC_WGMMA_REGS_64                                                        \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"          \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define ATTNC_WGMMA_REGS_80 ATTNC_WGMMA_REGS_64 ",%32, %33, %34, %35, %36, %37, %38, %39"
#define ATTNC_WGMMA_REGS_128                                                          \
  ATTNC_WGMMA_REGS_64                                                                 \
  ",%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"  \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define ATTNC_WGMMA_REGS_144 ATTNC_WGMMA_REGS_128 ",%64, %65, %66, %67, %68, %69, %70, %71"
#define ATTNC_WGMMA_REGS_256                                                                 \
  ATTNC_WGMMA_REGS_128                                                                       \
  ",%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"         \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"          \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111," \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"

// Wgmma<CTYPE, N> for PTX input type PTX; i0 .. i6 are the operand numbers N / 2 .. N / 2 + 6
// (ss uses i0 = desc_a, i1 = desc_b, i2 = scale_d; rs uses i0..i3 = a, i4 = desc_b,
// i5 = scale_d, i6 = kTransB).
#define ATTNC_WGMMA_SPEC(CTYPE, PTX, N, i0, i1, i2, i3, i4, i5, i6)                              \
  template <>                                                                                     \
  struct Wgmma<CTYPE, N> {                                                                        \
    __device__ __forceinline__ static void ss(float (&d)[N / 8][4], uint64_t desc_a,              \
                                              uint64_t desc_b, int scale_d) {                     \
      asm volatile(                                                                               \
          "{\n.reg .pred p;\nsetp.ne.b32 p, %" #i2 ", 0;\n"                                       \
          "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #PTX "." #PTX " {"                   \
          ATTNC_WGMMA_REGS_##N "}, %" #i0 ", %" #i1 ", p, 1, 1, 0, 0;\n}\n"                      \
          : ATTNC_WGMMA_ACC_##N                                                                   \
          : "l"(desc_a), "l"(desc_b), "r"(scale_d));                                              \
    }                                                                                             \
    template <int kTransB>                                                                        \
    __device__ __forceinline__ static void rs(float (&d)[N / 8][4], const uint32_t (&a)[4],       \
                                              uint64_t desc_b, int scale_d) {                     \
      asm volatile(                                                                               \
          "{\n.reg .pred p;\nsetp.ne.b32 p, %" #i5 ", 0;\n"                                       \
          "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #PTX "." #PTX " {"                   \
          ATTNC_WGMMA_REGS_##N "}, {%" #i0 ", %" #i1 ", %" #i2 ", %" #i3 "}, %" #i4              \
          ", p, 1, 1, %" #i6 ";\n}\n"                                                             \
          : ATTNC_WGMMA_ACC_##N                                                                   \
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d),               \
            "n"(kTransB));                                                                        \
    }                                                                                             \
  };

// Both input types at one N.
#define ATTNC_WGMMA_BOTH_TYPES(N, i0, i1, i2, i3, i4, i5, i6)              \
  ATTNC_WGMMA_SPEC(__nv_bfloat16, bf16, N, i0, i1, i2, i3, i4, i5, i6) \
  ATTNC_WGMMA_SPEC(half, f16, N, i0, i1, i2, i3, i4, i5, i6)

namespace attnc {
namespace sm90 {

/// One m64nNk16 wgmma (ss and rs forms) for input type T; specialised for N in 64, 80, 128,
/// 144 (timing experiments: ATTNC_SM90_HEAVY_KV_TILE), 256.
template <class T, int N>
struct Wgmma;

ATTNC_WGMMA_BOTH_TYPES(64, 32, 33, 34, 35, 36, 37, 38)
ATTNC_WGMMA_BOTH_TYPES(80, 40, 41, 42, 43, 44, 45, 46)
ATTNC_WGMMA_BOTH_TYPES(128, 64, 65, 66, 67, 68, 69, 70)
ATTNC_WGMMA_BOTH_TYPES(144, 72, 73, 74, 75, 76, 77, 78)
ATTNC_WGMMA_BOTH_TYPES(256, 128, 129, 130, 131, 132, 133, 134)

}  // namespace sm90
}  // namespace attnc
