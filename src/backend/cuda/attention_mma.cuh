// PagedAttention on the tensor cores (kernels.h PagedAttentionUsesTensorCores
// says when): bf16 mma.sync m16n8k16 with F32 accumulation, FlashAttention-2's
// loop. Included by kernels.cu after attention.cuh (whose FindTile,
// SplitsFor, AttentionReduceKernel and split-K workspace layout it shares),
// inside namespace strata::cuda.
//
// Tiling. Query rows are numbered as in attention.cuh (t * group + h: a
// token's whole GQA group is adjacent, so every K/V row a block loads serves
// all of them). A block of kMmaWarps warps takes kMmaRows = 16 * kMmaWarps
// consecutive rows of one sequence and one KV head, and one split-K piece of
// their KV range; warp w owns rows 16w .. 16w + 15 (one m16 tile) and never
// shares its scores, softmax or output. Per kMmaCols-position KV tile:
//   1. all threads load K and V rows through the page table into shared
//      memory as bf16 (16-byte loads; F32 and F16 pages are converted),
//      positions past the piece as zeros; double-buffered, the next tile
//      loading while this one is computed (bf16 pages by cp.async; F16
//      and F32 through registers, so only bf16 overlaps);
//   2. each warp computes S = Q K^T (16 x kMmaCols) from its Q fragments,
//      held in registers as bf16 for the whole loop, and K's fragments by
//      ldmatrix from shared memory (row stride kHd + 8 elements: the 8 rows
//      of a matrix hit 8 different 16-byte bank groups);
//   3. online softmax in the exp2 domain (scores scaled by scale * log2 e),
//      each lane holding two rows (g and g + 8) of the fragment, row maxima
//      over the lane quad by two shuffles; the masks (causal, window, past
//      the piece) are skipped for tiles wholly visible to the warp;
//   4. O += P V with P's accumulator fragment reused as the A operand
//      (rounded to bf16) and V fragments by ldmatrix.trans.
// A warp skips tiles none of its rows can see (causal: the first warps of a
// prefill tile stop early). A block of at most 16 rows (a decode token's
// GQA group) has one m16 tile: there every warp computes it over its own
// quarter of each KV tile's positions (its own m, l, O), and the four are
// merged through shared memory at the end, so a decode block's compute is
// spread over the SM's four schedulers instead of waiting on warp 0's
// (measured: docs/perf.md). One piece: O / l is written;
// more: (max in the natural-log domain, sum, unnormalised O) go to the workspace exactly as
// FlashAttentionKernel writes them, and AttentionReduceKernel merges them.

namespace {

constexpr int kMmaWarps = 4;
constexpr int kMmaRows = 16 * kMmaWarps;  // query rows of a block
constexpr int kMmaCols = 64;              // KV positions of a tile
constexpr int kMmaThreads = 32 * kMmaWarps;

__device__ inline uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the low half
  return *reinterpret_cast<const uint32_t*>(&v);
}

// d += a . b for one m16n8k16 tile (fragment layouts of the PTX ISA).
__device__ inline void MmaBf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 bf16 matrices, transposed: lane l gives the address of row l % 8
// of matrix l / 8.
__device__ inline void LdMatrixX4Trans(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3,
                                       const void* smem) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// Four 8x8 bf16 matrices: lane l gives the address of row l % 8 of matrix
// l / 8 and receives, of matrix i in register i, row l / 4's elements
// 2 (l % 4) and 2 (l % 4) + 1: a K tile's B fragments for two n-tiles.
__device__ inline void LdMatrixX4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3,
                                  const void* smem) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// 16 bytes global -> shared without passing through registers (sm_80+);
// valid false: the 16 bytes are zero-filled and nothing is read.
__device__ inline void CpAsync16(void* smem, const void* gmem, bool valid) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(gmem),
               "r"(valid ? 16 : 0));
}
__device__ inline void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are in flight.
template <int N>
__device__ inline void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Eight elements at p (16-byte aligned) as bf16.
__device__ inline uint4 Load8Bf16(const __nv_bfloat16* p) {
  return *reinterpret_cast<const uint4*>(p);
}
__device__ inline uint4 Load8Bf16(const __half* p) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const __half2* h = reinterpret_cast<const __half2*>(&raw);
  uint4 r;
  r.x = PackBf16(__low2float(h[0]), __high2float(h[0]));
  r.y = PackBf16(__low2float(h[1]), __high2float(h[1]));
  r.z = PackBf16(__low2float(h[2]), __high2float(h[2]));
  r.w = PackBf16(__low2float(h[3]), __high2float(h[3]));
  return r;
}
__device__ inline uint4 Load8Bf16(const float* p) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  return make_uint4(PackBf16(a.x, a.y), PackBf16(a.z, a.w), PackBf16(b.x, b.y), PackBf16(b.z, b.w));
}

// K and V rows of positions p0 .. p0 + kMmaCols - 1 into ks / vs (row
// stride kHd + 8), zeros past p_end. Thread i takes 8-element chunks i,
// i + kMmaThreads, ...: consecutive threads read consecutive 16 bytes of a row.
template <typename T, int kHd>
__device__ void MmaLoadKv(const T* kbase, const T* vbase, const int32_t* page_table, int ps,
                          int64_t token_elems, int p0, int p_end, __nv_bfloat16* ks,
                          __nv_bfloat16* vs) {
  constexpr int kChunks = kHd / 8, kS = kHd + 8;
#pragma unroll 4
  for (int c = threadIdx.x; c < kMmaCols * kChunks; c += kMmaThreads) {
    const int j = c / kChunks, d = (c % kChunks) * 8;
    const int p = p0 + j;
    uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
    if (p <= p_end) {
      const int64_t slot = int64_t{page_table[p / ps]} * ps + p % ps;
      kv = Load8Bf16(kbase + slot * token_elems + d);
      vv = Load8Bf16(vbase + slot * token_elems + d);
    }
    *reinterpret_cast<uint4*>(ks + j * kS + d) = kv;
    *reinterpret_cast<uint4*>(vs + j * kS + d) = vv;
  }
}

// MmaLoadKv of bf16 pages by cp.async: the copies are only issued here;
// they land after the caller's CpAsyncCommit and CpAsyncWait.
template <int kHd>
__device__ void MmaLoadKvAsync(const __nv_bfloat16* kbase, const __nv_bfloat16* vbase,
                               const int32_t* page_table, int ps, int64_t token_elems, int p0,
                               int p_end, __nv_bfloat16* ks, __nv_bfloat16* vs) {
  constexpr int kChunks = kHd / 8, kS = kHd + 8;
#pragma unroll 4
  for (int c = threadIdx.x; c < kMmaCols * kChunks; c += kMmaThreads) {
    const int j = c / kChunks, d = (c % kChunks) * 8;
    const int p = p0 + j;
    const bool in = p <= p_end;
    const int64_t slot = in ? int64_t{page_table[p / ps]} * ps + p % ps : 0;
    CpAsync16(ks + j * kS + d, kbase + slot * token_elems + d, in);
    CpAsync16(vs + j * kS + d, vbase + slot * token_elems + d, in);
  }
}

// One warp's part of a KV tile: S = Q K^T over kNTw * 8 positions from
// position c0 (shared-memory row c_row of ks / vs), the online softmax of
// the lane's rows g and g + 8 (pos, first: what each sees; all masks
// skipped when `full`), O += P V. m is in the exp2 domain; l is this lane's
// share of its rows' sums (the quad's is summed at the end).
template <int kHd, int kNTw>
__device__ __forceinline__ void MmaTileStep(const __nv_bfloat16* ks, const __nv_bfloat16* vs,
                                            int c_row, int c0, int z_hi, bool full,
                                            const int (&pos)[2], const int (&first)[2],
                                            const uint32_t (&qa)[kHd / 16][4], float scale2,
                                            float (&o)[kHd / 8][4], float (&m)[2], float (&l)[2]) {
  constexpr int kS = kHd + 8;
  constexpr int kOT = kHd / 8;
  const int lane = threadIdx.x & 31, t = lane & 3;
  float s[kNTw][4];
#pragma unroll
  for (int n = 0; n < kNTw; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
  // K's B fragments of n-tiles n and n + 1 by one ldmatrix.x4: lanes
  // 8i .. 8i + 7 address rows of matrix i = (n-tile n + i / 2, dims
  // 16kk + 8 (i % 2) ..).
  const __nv_bfloat16* krow =
      ks + (c_row + (lane >> 4) * 8 + (lane & 7)) * kS + ((lane >> 3) & 1) * 8;
  if constexpr (kNTw <= 2) {
    // A decode warp's 16 positions: two n-tiles, so each MMA would wait for
    // the one before it over all kHd / 16 steps. Odd steps accumulate
    // apart (four chains, not two), summed at the end.
    float s1[kNTw][4];
#pragma unroll
    for (int n = 0; n < kNTw; ++n) s1[n][0] = s1[n][1] = s1[n][2] = s1[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kHd / 16; kk += 2) {
#pragma unroll
      for (int n = 0; n < kNTw; n += 2) {
        uint32_t b0, b1, b2, b3, c0, c1, c2, c3;
        LdMatrixX4(b0, b1, b2, b3, krow + n * 8 * kS + kk * 16);
        LdMatrixX4(c0, c1, c2, c3, krow + n * 8 * kS + (kk + 1) * 16);
        MmaBf16(s[n], qa[kk], b0, b1);
        MmaBf16(s[n + 1], qa[kk], b2, b3);
        MmaBf16(s1[n], qa[kk + 1], c0, c1);
        MmaBf16(s1[n + 1], qa[kk + 1], c2, c3);
      }
    }
#pragma unroll
    for (int n = 0; n < kNTw; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) s[n][c] += s1[n][c];
  } else {
#pragma unroll
    for (int kk = 0; kk < kHd / 16; ++kk) {
#pragma unroll
      for (int n = 0; n < kNTw; n += 2) {
        uint32_t b0, b1, b2, b3;
        LdMatrixX4(b0, b1, b2, b3, krow + n * 8 * kS + kk * 16);
        MmaBf16(s[n], qa[kk], b0, b1);
        MmaBf16(s[n + 1], qa[kk], b2, b3);
      }
    }
  }
  // Online softmax; lane holds row g (s[.][0..1]) and row g + 8 (s[.][2..3]).
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < kNTw; ++n) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int p = c0 + n * 8 + 2 * t + c;
        float v = s[n][2 * i + c] * scale2;
        if (!full && !(p <= z_hi && p >= first[i] && p <= pos[i])) v = -INFINITY;
        s[n][2 * i + c] = v;
        mx = fmaxf(mx, v);
      }
    }
    mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 2));
    const float mn = fmaxf(m[i], mx);
    // mn == -inf: nothing visible to this row yet (o and l are 0).
    const float corr = mn == -INFINITY ? 1.f : exp2f(m[i] - mn);
    m[i] = mn;
    float rs = 0.f;
#pragma unroll
    for (int n = 0; n < kNTw; ++n) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float e = mn == -INFINITY ? 0.f : exp2f(s[n][2 * i + c] - mn);
        s[n][2 * i + c] = e;
        rs += e;
      }
    }
    l[i] = l[i] * corr + rs;
#pragma unroll
    for (int n = 0; n < kOT; ++n) {
      o[n][2 * i] *= corr;
      o[n][2 * i + 1] *= corr;
    }
  }
  // O += P V: P's fragments of positions 16kk .. 16kk + 15 as the A operand.
#pragma unroll
  for (int kk = 0; kk < kNTw / 2; ++kk) {
    const uint32_t pa[4] = {PackBf16(s[2 * kk][0], s[2 * kk][1]),
                            PackBf16(s[2 * kk][2], s[2 * kk][3]),
                            PackBf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                            PackBf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
    const __nv_bfloat16* vrow = vs + (c_row + kk * 16 + (lane & 15)) * kS + (lane >> 4) * 8;
#pragma unroll
    for (int n = 0; n < kOT; n += 2) {
      uint32_t b0, b1, b2, b3;
      LdMatrixX4Trans(b0, b1, b2, b3, vrow + n * 8);
      MmaBf16(o[n], pa, b0, b1);
      MmaBf16(o[n + 1], pa, b2, b3);
    }
  }
}

// Dynamic shared memory of MmaAttentionKernel: two K/V tile pairs (the
// tile computed and the one loading).
constexpr size_t MmaSmemBytes(int hd) {
  return size_t{2} * 2 * kMmaCols * (hd + 8) * sizeof(__nv_bfloat16);
}
// The kv_split merge (MmaAttentionKernel) reuses them for 4 warps' F32 O and (m, l).
static_assert(size_t{kMmaWarps} * 16 * (64 + 2) * sizeof(float) <= MmaSmemBytes(64) &&
                  size_t{kMmaWarps} * 16 * (128 + 2) * sizeof(float) <= MmaSmemBytes(128),
              "the warps' merge fits in the tile buffers");

// kDecode: every block holds at most 16 rows (a decode batch: one token per
// sequence, a GQA group of <= 16 heads), so only the kv_split path is
// compiled, without the prefill path's 8-n-tile scores (fewer registers;
// at head dim 128 it still needs 191 to run without spilling: MmaMinBlocks).
// Blocks per SM the registers are allotted for: 3, except the head-dim-128
// decode kernel, which at 3 (168 registers) spills 80 bytes a thread and at
// 2 (191) spills none. Measured on an H100 (docs/perf.md, 2026-12-08): the
// 8B shape's decode 1.02-1.03x at batch 1, 1.02x at 16, 1.01x at 64, with
// the attention kernel itself at batch 64 unchanged (137 -> 140 us).
template <int kHd, bool kDecode>
constexpr int MmaMinBlocks() {
  return kDecode && kHd == 128 ? 2 : 3;
}

template <int kHd, bool kDecode>
__global__ void __launch_bounds__(kMmaThreads, (MmaMinBlocks<kHd, kDecode>()))
    MmaAttentionKernel(View q, KvLayer layer, const Seq* seqs, int32_t num_seqs, AttentionArgs a,
                       View out, float* ml_part, float* acc_part, int splits) {
  STRATA_GRID_DEPENDENCY();
  constexpr int kS = kHd + 8;
  constexpr int kNT = kMmaCols / 8;  // score n-tiles of a KV tile
  constexpr int kOT = kHd / 8;       // output n-tiles
  extern __shared__ __align__(16) unsigned char mma_smem[];
  // Tile buffer b: K at tiles + 2b * kMmaCols * kS, V right after it.
  __nv_bfloat16* const tiles = reinterpret_cast<__nv_bfloat16*>(mma_smem);
  __shared__ int seq_s;
  __shared__ int64_t tile_s;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int group = a.num_heads / a.num_kv_heads;
  const int kh = blockIdx.y, z = blockIdx.z;
  if (warp == 0) {
    int s = -1;
    int64_t tile = 0;
    // Slots in reverse: a causal prefill's last tiles see the most KV, so
    // they start first and the short ones fill the tail (the slack slots,
    // last in FindTile's order, leave at once).
    const bool found =
        FindTile(seqs, num_seqs, group, gridDim.x - 1 - blockIdx.x, kMmaRows, &s, &tile);
    if (lane == 0) {
      seq_s = found ? s : -1;
      tile_s = tile;
    }
  }
  __syncthreads();
  if (seq_s < 0) return;  // a slack slot: the whole block leaves
  const Seq sq = seqs[seq_s];
  const int64_t r0 = tile_s * kMmaRows;
  const int rows = static_cast<int>(min(int64_t{kMmaRows}, int64_t{sq.q_len} * group - r0));
  const int ctx0 = sq.kv_len - sq.q_len;
  const int window = a.sliding_window;
  auto pos_of = [&](int r) { return ctx0 + static_cast<int>((r0 + r) / group); };
  auto first_of = [&](int pos) { return window > 0 ? max(0, pos - window + 1) : 0; };

  // A block of at most 16 rows (a decode token's GQA group, a prefill's
  // last few): one m16 tile, every warp on it, each over a quarter of every
  // KV tile's positions, merged at the end. Else warp w owns rows 16w ..
  const bool kv_split = kDecode || rows <= 16;
  const int wq = kv_split ? 0 : warp;  // the warp's m16 tile of rows
  // This lane's rows g and g + 8 of the warp's tile.
  int pos[2], first[2];
  bool live[2];
  int64_t orow[2];
  int ohead[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = wq * 16 + g + 8 * i;
    const int64_t qr = r0 + r;
    orow[i] = sq.q_start + qr / group;
    ohead[i] = kh * group + static_cast<int>(qr % group);
    live[i] = r < rows && orow[i] < q.rows;
    pos[i] = live[i] ? pos_of(r) : -1;  // -1: sees nothing
    first[i] = first_of(pos[i]);
  }
  // The warp's reach (warp-uniform): its last live row's position, its first
  // row's first visible one; "all16": every row live, for the mask-free test.
  const int wr0 = wq * 16, wlast = min(wr0 + 15, rows - 1);
  const bool wlive = wr0 < rows;
  const int w_hi = wlive ? pos_of(wlast) : -1;
  const int w_lo = wlive ? first_of(pos_of(wr0)) : 0;
  const bool all16 = wr0 + 15 < rows;
  const int w_min_pos = wlive ? pos_of(wr0) : -1,
            w_max_first = all16 ? first_of(pos_of(wr0 + 15)) : 0;

  // The block's KV range and this split's piece of it.
  const int t_lo = static_cast<int>(r0 / group), t_hi = static_cast<int>((r0 + rows - 1) / group);
  const int hi = ctx0 + t_hi;
  const int lo = window > 0 ? max(0, ctx0 + t_lo - window + 1) : 0;
  int chunk = (hi - lo + 1 + splits - 1) / splits;
  chunk = max(kMmaCols, (chunk + kMmaCols - 1) / kMmaCols * kMmaCols);
  const int z_lo = lo + z * chunk;
  const int z_hi = min(hi, z_lo + chunk - 1);
  if (z_hi < z_lo) {  // an empty piece: say so to the reduce (see FlashAttentionKernel)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (live[i] && t == 0 && splits > 1) {
        const int64_t pi = (static_cast<int64_t>(z) * q.rows + orow[i]) * a.num_heads + ohead[i];
        ml_part[2 * pi] = -INFINITY;
        ml_part[2 * pi + 1] = 0.f;
      }
    }
    return;
  }

  // Q fragments (A operand, row-major 16 x kHd), rounded to bf16 once.
  uint32_t qa[kHd / 16][4];
  {
    const float* qrow[2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
      qrow[i] = live[i] ? RowF(q, orow[i]) + static_cast<int64_t>(ohead[i]) * kHd : nullptr;
#pragma unroll
    for (int kk = 0; kk < kHd / 16; ++kk) {
#pragma unroll
      for (int reg = 0; reg < 4; ++reg) {
        const int i = reg & 1, col = kk * 16 + 2 * t + (reg >> 1) * 8;
        qa[kk][reg] = qrow[i] != nullptr ? PackBf16(qrow[i][col], qrow[i][col + 1]) : 0u;
      }
    }
  }
  const float scale2 = a.scale * 1.4426950408889634f;  // log2(e)

  float o[kOT][4];
#pragma unroll
  for (int n = 0; n < kOT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  const int64_t token_elems = static_cast<int64_t>(layer.num_kv_heads) * kHd;
  const int64_t head_off = static_cast<int64_t>(kh) * kHd;
  // Tile p0 into buffer b: bf16 pages by cp.async (in flight until
  // waited for), F16 and F32 converted through registers (landed on return).
  auto load = [&](int p0, int b) {
    __nv_bfloat16* ks = tiles + 2 * b * kMmaCols * kS;
    __nv_bfloat16* vs = ks + kMmaCols * kS;
    switch (layer.dtype) {
      case DType::kBF16: {
        const auto* k = static_cast<const __nv_bfloat16*>(layer.k) + head_off;
        const auto* v = static_cast<const __nv_bfloat16*>(layer.v) + head_off;
        MmaLoadKvAsync<kHd>(k, v, sq.page_table, layer.page_size, token_elems, p0, z_hi, ks, vs);
        break;
      }
      case DType::kF16: {
        const auto* k = static_cast<const __half*>(layer.k) + head_off;
        const auto* v = static_cast<const __half*>(layer.v) + head_off;
        MmaLoadKv<__half, kHd>(k, v, sq.page_table, layer.page_size, token_elems, p0, z_hi, ks, vs);
        break;
      }
      default: {
        const auto* k = static_cast<const float*>(layer.k) + head_off;
        const auto* v = static_cast<const float*>(layer.v) + head_off;
        MmaLoadKv<float, kHd>(k, v, sq.page_table, layer.page_size, token_elems, p0, z_hi, ks, vs);
        break;
      }
    }
    CpAsyncCommit();
  };
  // Double-buffered: tile i + 1 loads while tile i is computed.
  load(z_lo, 0);
  int cur = 0;
  for (int p0 = z_lo; p0 <= z_hi; p0 += kMmaCols, cur ^= 1) {
    // Every warp is done with tile i - 1, whose buffer tile i + 1 takes.
    __syncthreads();
    if (p0 + kMmaCols <= z_hi) {
      load(p0 + kMmaCols, cur ^ 1);
      CpAsyncWait<1>();  // tile i's copies (this thread's) have landed
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();  // and everyone's
    const __nv_bfloat16* ks = tiles + 2 * cur * kMmaCols * kS;
    const __nv_bfloat16* vs = ks + kMmaCols * kS;
    if (kv_split) {
      // Warp w takes the tile's positions 16w .. 16w + 15 for the block's
      // one m16 tile of rows.
      const int c0 = p0 + 16 * warp, c_last = c0 + 15;
      if (c0 > z_hi || c0 > w_hi || c_last < w_lo) continue;
      const bool full = all16 && c_last <= z_hi && c_last <= w_min_pos && c0 >= w_max_first;
      MmaTileStep<kHd, 2>(ks, vs, 16 * warp, c0, z_hi, full, pos, first, qa, scale2, o, m, l);
    } else if constexpr (!kDecode) {
      const int p_last = p0 + kMmaCols - 1;
      if (p0 > w_hi || p_last < w_lo) continue;  // no row of this warp sees the tile
      const bool full = all16 && p_last <= z_hi && p_last <= w_min_pos && p0 >= w_max_first;
      MmaTileStep<kHd, kNT>(ks, vs, 0, p0, z_hi, full, pos, first, qa, scale2, o, m, l);
    }
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(kFull, l[i], 1);
    l[i] += __shfl_xor_sync(kFull, l[i], 2);
  }
  if (kv_split) {
    // Merge the warps' (m, l, O) of the same rows, in the tile buffers
    // (every warp is past its last tile): warps 1.. write theirs, warp 0
    // folds them into its registers and writes the result.
    __syncthreads();
    float* const red_o = reinterpret_cast<float*>(mma_smem);  // [warp][16][kHd]
    float* const red_ml = red_o + kMmaWarps * 16 * kHd;       // [warp][16][2]
    if (warp > 0) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = g + 8 * i;
        float* op = red_o + (warp * 16 + r) * kHd + 2 * t;
#pragma unroll
        for (int n = 0; n < kOT; ++n) {
          op[n * 8] = o[n][2 * i];
          op[n * 8 + 1] = o[n][2 * i + 1];
        }
        if (t == 0) {
          red_ml[(warp * 16 + r) * 2] = m[i];
          red_ml[(warp * 16 + r) * 2 + 1] = l[i];
        }
      }
    }
    __syncthreads();
    if (warp > 0) return;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = g + 8 * i;
      float mn = m[i];
#pragma unroll
      for (int w = 1; w < kMmaWarps; ++w) mn = fmaxf(mn, red_ml[(w * 16 + r) * 2]);
      if (mn == -INFINITY) continue;  // no warp saw anything: o and l are 0
      const float c_own = exp2f(m[i] - mn);
      l[i] *= c_own;
#pragma unroll
      for (int n = 0; n < kOT; ++n) {
        o[n][2 * i] *= c_own;
        o[n][2 * i + 1] *= c_own;
      }
#pragma unroll
      for (int w = 1; w < kMmaWarps; ++w) {
        const float mw = red_ml[(w * 16 + r) * 2];
        if (mw == -INFINITY) continue;
        const float c = exp2f(mw - mn);
        l[i] += c * red_ml[(w * 16 + r) * 2 + 1];
        const float* op = red_o + (w * 16 + r) * kHd + 2 * t;
#pragma unroll
        for (int n = 0; n < kOT; ++n) {
          o[n][2 * i] += c * op[n * 8];
          o[n][2 * i + 1] += c * op[n * 8 + 1];
        }
      }
      m[i] = mn;
    }
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (!live[i]) continue;
    if (splits == 1) {
      const float inv = 1.f / l[i];
      float* orow_p = RowF(out, orow[i]) + static_cast<int64_t>(ohead[i]) * kHd + 2 * t;
#pragma unroll
      for (int n = 0; n < kOT; ++n) {
        orow_p[n * 8] = o[n][2 * i] * inv;
        orow_p[n * 8 + 1] = o[n][2 * i + 1] * inv;
      }
    } else {
      const int64_t pi = (static_cast<int64_t>(z) * q.rows + orow[i]) * a.num_heads + ohead[i];
      if (t == 0) {
        ml_part[2 * pi] = m[i] == -INFINITY ? -INFINITY : m[i] * 0.6931471805599453f;  // ln 2
        ml_part[2 * pi + 1] = l[i];
      }
      if (m[i] != -INFINITY) {  // else o is all zeros and the reduce skips it
        float* ap = acc_part + pi * kHd + 2 * t;
#pragma unroll
        for (int n = 0; n < kOT; ++n) {
          ap[n * 8] = o[n][2 * i];
          ap[n * 8 + 1] = o[n][2 * i + 1];
        }
      }
    }
  }
}

int MmaAttentionSplits(int64_t q_rows, int32_t num_seqs, const AttentionArgs& a, int num_sms) {
  return SplitsFor(q_rows, num_seqs, a, num_sms, kMmaRows, kMmaCols);
}

void MmaAttention(const View& q, const KvLayer& layer, const Seq* seqs, int32_t num_seqs,
                  const AttentionArgs& args, const View& out, void* workspace, int num_sms,
                  cudaStream_t stream) {
  const int splits = MmaAttentionSplits(q.rows, num_seqs, args, num_sms);
  const int64_t group = args.num_heads / args.num_kv_heads;
  const int64_t per_row = (group + kMmaRows - 1) / kMmaRows;
  const int64_t slots =
      std::min((q.rows * group + kMmaRows - 1) / kMmaRows + num_seqs, q.rows * per_row);
  float* ml = nullptr;
  float* acc = nullptr;
  if (splits > 1) {
    ml = static_cast<float*>(workspace);
    acc = ml + static_cast<size_t>(splits) * q.rows * args.num_heads * 2;
  }
  const dim3 grid(static_cast<unsigned>(slots), static_cast<unsigned>(args.num_kv_heads),
                  static_cast<unsigned>(splits));
  // One token per sequence and a group of at most 16 heads: every block is
  // one m16 tile (MmaAttentionKernel's kDecode).
  const bool decode = q.rows == num_seqs && group <= 16;
  auto launch = [&](auto kernel, size_t smem) {
    STRATA_LAUNCH(kernel, grid, kMmaThreads, smem, stream, q, layer, seqs, num_seqs, args, out, ml,
                  acc, splits);
  };
  if (args.head_dim == 64) {
    static_assert(MmaSmemBytes(64) <= 48 * 1024, "no opt-in needed");
    if (decode)
      launch(MmaAttentionKernel<64, true>, MmaSmemBytes(64));
    else
      launch(MmaAttentionKernel<64, false>, MmaSmemBytes(64));
  } else {
    // Above the default 48 KiB: opted in once per kernel (per process; one
    // device each). A failure shows as the launch's error.
    static const bool opted_in =
        cudaFuncSetAttribute(MmaAttentionKernel<128, false>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(MmaSmemBytes(128))) == cudaSuccess &&
        cudaFuncSetAttribute(MmaAttentionKernel<128, true>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(MmaSmemBytes(128))) == cudaSuccess;
    (void)opted_in;
    if (decode)
      launch(MmaAttentionKernel<128, true>, MmaSmemBytes(128));
    else
      launch(MmaAttentionKernel<128, false>, MmaSmemBytes(128));
  }
  if (splits > 1) {
    const dim3 rgrid(static_cast<unsigned>(q.rows), static_cast<unsigned>(args.num_heads));
    STRATA_LAUNCH(AttentionReduceKernel, rgrid, kAttnThreads, 0, stream, seqs, num_seqs, args, out,
                  ml, acc, splits);
  }
}

}  // namespace

bool PagedAttentionUsesTensorCores(int64_t q_rows, int32_t num_seqs, const AttentionArgs& args,
                                   const KvLayer& layer) {
  const bool v_alias = layer.v == nullptr || layer.v == layer.k;
  constexpr uintptr_t align = 16;  // Load8Bf16's vector loads
  return args.tensor_cores && !v_alias && (args.head_dim == 64 || args.head_dim == 128) &&
         reinterpret_cast<uintptr_t>(layer.k) % align == 0 &&
         reinterpret_cast<uintptr_t>(layer.v) % align == 0;
}
