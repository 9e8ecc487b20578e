// The per-lane fragment layouts of the matrix instructions, as data: for every instruction, which
// element of A, B, C/D a lane's register (or register half) holds. One header for three users:
// the SIMT runtime's warp collectives (backends/simt/matrix.cpp), the portable fallbacks of
// backends/gpu/matrix_ops.h (shuffles and shared-memory reads decoded by the same functions) and
// the kernels' tiles (kernels/mma.h). tests/simt/matrix_collectives_test.cpp holds them, lane by
// lane, to its own transcription of the documents' tables.
//
// Element numbering: a lane's operand is a list of `elements`; for 16-bit types element e is the
// low (e even) or high (e odd) half of 32-bit register e / 2, for 32-bit types it is register e.
// Each function returns (row, col) of the element in the operand's matrix: A is M x K, B is
// K x N (row = k), C and D are M x N.
//
// Sources (section names, NVIDIA PTX ISA 8.x, "Warp Level Matrix Multiply-Accumulate
// Instructions"; AMD "AMD Instinct MI200 (CDNA2) Instruction Set Architecture", section
// "Matrix Arithmetic Instructions", and AMD's matrix instruction calculator for gfx90a):
//   M16N8K16 -- "Matrix Fragments for mma.m16n8k16 with floating point type" (.f16, .bf16),
//   M16N8K8Tf32 -- "Matrix Fragments for mma.m16n8k8", the .tf32 variant,
//   Ldmatrix -- "Warp-level matrix load instruction: ldmatrix", shape .m8n8, type .b16,
//   Mfma32x32x8 -- v_mfma_f32_32x32x8f16 / v_mfma_f32_32x32x8bf16_1k,
//   Mfma16x16x16 -- v_mfma_f32_16x16x16f16 / v_mfma_f32_16x16x16bf16_1k.
// In the PTX tables groupID = lane / 4 and threadID_in_group = lane % 4 (g and q below).
#pragma once

#include "backends/gpu/portability.h"  // __host__ __device__ on every target

#define CT_MATRIX_HD __host__ __device__ __forceinline__

namespace ct::gpu::layout {

struct RowCol {
  int row, col;
};

// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32: A 4 x .b32 (8 halves),
// B 2 x .b32 (4 halves), C/D 4 x .f32.
struct M16N8K16 {
  static constexpr int kWarp = 32, M = 16, N = 8, K = 16, kBits = 16;
  static constexpr int kARegs = 4, kBRegs = 2, kC = 4, kAElems = 8, kBElems = 4;
  // a0,a1: (g, 2q + {0,1}); a2,a3: (g + 8, ..); a4,a5: (g, 2q + 8 + {0,1}); a6,a7: (g + 8, ..).
  static CT_MATRIX_HD RowCol a(int lane, int e) {
    return {lane / 4 + 8 * (e / 2 % 2), lane % 4 * 2 + e % 2 + 8 * (e / 4)};
  }
  // b0,b1: (k = 2q + {0,1}, n = g); b2,b3: (k = 2q + 8 + {0,1}, g).
  static CT_MATRIX_HD RowCol b(int lane, int e) {
    return {lane % 4 * 2 + e % 2 + 8 * (e / 2), lane / 4};
  }
  // c0,c1: (g, 2q + {0,1}); c2,c3: (g + 8, 2q + {0,1}).
  static CT_MATRIX_HD RowCol c(int lane, int e) {
    return {lane / 4 + 8 * (e / 2), lane % 4 * 2 + e % 2};
  }
};

// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32: A 4 x .b32, B 2 x .b32, C/D 4 x .f32.
struct M16N8K8Tf32 {
  static constexpr int kWarp = 32, M = 16, N = 8, K = 8, kBits = 32;
  static constexpr int kARegs = 4, kBRegs = 2, kC = 4, kAElems = 4, kBElems = 2;
  // a0: (g, q); a1: (g + 8, q); a2: (g, q + 4); a3: (g + 8, q + 4).
  static CT_MATRIX_HD RowCol a(int lane, int e) {
    return {lane / 4 + 8 * (e % 2), lane % 4 + 4 * (e / 2)};
  }
  // b0: (k = q, n = g); b1: (k = q + 4, g).
  static CT_MATRIX_HD RowCol b(int lane, int e) { return {lane % 4 + 4 * e, lane / 4}; }
  static CT_MATRIX_HD RowCol c(int lane, int e) { return M16N8K16::c(lane, e); }
};

// ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16: matrix j (0 .. count-1) has its 8
// rows at the addresses of lanes 8j .. 8j+7 (row i at lane 8j + i; 16 bytes a row); lane l
// receives register j = the two halves (row l / 4, cols 2 (l % 4) + {0,1}) of matrix j, or with
// .trans the halves (rows 2 (l % 4) + {0,1}, col l / 4) of the matrix as stored.
struct Ldmatrix {
  static constexpr int kWarp = 32;
  static CT_MATRIX_HD int address_lane(int matrix, int row) { return 8 * matrix + row; }
  // The stored element (row, col) behind half h (0 low, 1 high) of lane's register of a matrix.
  static CT_MATRIX_HD RowCol element(int lane, int h, bool trans) {
    return trans ? RowCol{lane % 4 * 2 + h, lane / 4} : RowCol{lane / 4, lane % 4 * 2 + h};
  }
};

// v_mfma_f32_32x32x8{f16,bf16_1k} (wave64): A and B 4 halves (2 x 32-bit registers) a lane,
// C/D 16 x f32. Lanes 0-31 hold k 0-3 of row (column) lane, lanes 32-63 k 4-7; D element i of
// lane l is row 8 (i / 4) + 4 (l / 32) + i % 4, column l % 32.
struct Mfma32x32x8 {
  static constexpr int kWarp = 64, M = 32, N = 32, K = 8, kBits = 16;
  static constexpr int kARegs = 2, kBRegs = 2, kC = 16, kAElems = 4, kBElems = 4;
  static CT_MATRIX_HD RowCol a(int lane, int e) { return {lane % 32, lane / 32 * 4 + e}; }
  static CT_MATRIX_HD RowCol b(int lane, int e) { return {lane / 32 * 4 + e, lane % 32}; }
  static CT_MATRIX_HD RowCol c(int lane, int e) {
    return {8 * (e / 4) + 4 * (lane / 32) + e % 4, lane % 32};
  }
};

// v_mfma_f32_16x16x16{f16,bf16_1k} (wave64): A and B 4 halves a lane (k 4 (l / 16) + e of row
// (column) l % 16), C/D 4 x f32 (row 4 (l / 16) + e, column l % 16).
struct Mfma16x16x16 {
  static constexpr int kWarp = 64, M = 16, N = 16, K = 16, kBits = 16;
  static constexpr int kARegs = 2, kBRegs = 2, kC = 4, kAElems = 4, kBElems = 4;
  static CT_MATRIX_HD RowCol a(int lane, int e) { return {lane % 16, lane / 16 * 4 + e}; }
  static CT_MATRIX_HD RowCol b(int lane, int e) { return {lane / 16 * 4 + e, lane % 16}; }
  static CT_MATRIX_HD RowCol c(int lane, int e) { return {lane / 16 * 4 + e, lane % 16}; }
};

}  // namespace ct::gpu::layout
