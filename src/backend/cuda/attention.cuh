// PagedAttention's kernels and launcher (kernels.h has the contract). Kept
// apart from kernels.cu so that tools/cuda_emu/attention_emu.cc can run
// this exact code on the host (each block as 128 std::threads with real
// barriers and warp exchanges) under AddressSanitizer and ThreadSanitizer:
// CI and the dev machine have no GPU.
//
// The includer has opened namespace strata::cuda and defines, first:
//   float ToFloat(T) for T in float, __nv_bfloat16, __half;
//   float* RowF(const View&, int64_t row);
//   STRATA_SHARED                      block-shared variable (__shared__)
//   STRATA_DYNAMIC_SMEM(name)          float name[] of dynamic shared memory
//   STRATA_LAUNCH(kernel, grid, block, smem_bytes, stream, args...)
//   STRATA_GRID_DEPENDENCY()           a kernel's first statement: kernels.cu's
//                                      GridDependency (PDL), the emulator's nothing
//   (kernels.cu: the CUDA spellings; the emulator: its own), and has
//   included <algorithm>, <cmath>, cuda_bf16.h, cuda_fp16.h, kernels.h.
// kernels.cu also defines STRATA_ATTENTION_MMA and includes
// attention_mma.cuh after this file: PagedAttention then hands the calls
// PagedAttentionUsesTensorCores accepts to the tensor-core kernel there
// (declared below; the emulator has neither).

#ifndef STRATA_GRID_DEPENDENCY
#define STRATA_GRID_DEPENDENCY()
#endif

#ifdef STRATA_ATTENTION_MMA
namespace {
int MmaAttentionSplits(int64_t q_rows, int32_t num_seqs, const AttentionArgs& a, int num_sms);
void MmaAttention(const View& q, const KvLayer& layer, const Seq* seqs, int32_t num_seqs,
                  const AttentionArgs& args, const View& out, void* workspace, int num_sms,
                  cudaStream_t stream);
}  // namespace
#endif

namespace {

// ---- Paged attention: flash-style tiles, split-K over the KV range ----
//
// A query row here is one (token t, head h of the GQA group) pair of a
// sequence, numbered t * group + h, so a decode token's whole group sits in
// one tile and every K/V row loaded serves all of them. A block takes a
// tile of kAttnRows query rows of one sequence and one KV head, and one of
// `splits` contiguous pieces of the tile's KV range [lo, hi] (lo: the first
// position its first token sees, hi: its last token's own position). It
// walks its piece kAttnCols positions at a time: K and V rows of those
// positions are read through the page table into shared memory (F32),
// lane j of each warp scores position j against the warp's query rows
// (warp w owns rows w, w + 4, w + 8, w + 12: scores, softmax and output of
// a row never leave its warp), and an online softmax folds them into
// per-row accumulators, lane l holding dims l, l + 32, ... With one split
// it writes the normalised output; with more it writes (max, sum,
// unnormalised acc) per row and head to the workspace, and
// AttentionReduceKernel merges the splits. grid = (tile slots, KV heads,
// splits); tile slots are numbered sequence by sequence (FindTile), with
// slack for each sequence's last partial tile (those blocks exit).
constexpr int kAttnRows = 16;
constexpr int kAttnCols = 32;  // = warp width: one lane per position
constexpr int kAttnWarps = 4;
constexpr int kAttnThreads = kAttnWarps * 32;
constexpr int kRowsPerWarp = kAttnRows / kAttnWarps;
constexpr int kMaxSplits = 64;
constexpr unsigned kFull = 0xffffffffu;

// Warp-cooperative (all 32 lanes, same arguments): the sequence holding
// query row `row` of q, or -1.
__device__ int FindSeqOfRow(const Seq* seqs, int n, int64_t row) {
  const int lane = threadIdx.x & 31;
  for (int base = 0; base < n; base += 32) {
    const int s = base + lane;
    bool hit = false;
    if (s < n) hit = row >= seqs[s].q_start && row < int64_t{seqs[s].q_start} + seqs[s].q_len;
    const unsigned b = __ballot_sync(kFull, hit);
    if (b != 0) return base + __ffs(b) - 1;
  }
  return -1;
}

// Warp-cooperative: sequence `*seq` and tile `*tile` within it of tile slot
// `slot`, sequence s owning ceil(q_len * group / tile_rows) consecutive
// slots. False when `slot` is past the last tile.
__device__ bool FindTile(const Seq* seqs, int n, int group, int64_t slot, int tile_rows, int* seq,
                         int64_t* tile) {
  const int lane = threadIdx.x & 31;
  int64_t before = 0;  // tiles of the sequences before this chunk of 32
  for (int base = 0; base < n; base += 32) {
    const int s = base + lane;
    int64_t cnt = 0;
    if (s < n) cnt = (int64_t{max(seqs[s].q_len, 0)} * group + tile_rows - 1) / tile_rows;
    int64_t incl = cnt;  // inclusive prefix sum over the chunk's lanes
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int64_t v = __shfl_up_sync(kFull, incl, o);
      if (lane >= o) incl += v;
    }
    const unsigned b = __ballot_sync(kFull, slot < before + incl);
    if (b != 0) {
      const int l = __ffs(b) - 1;
      const int64_t incl_l = __shfl_sync(kFull, incl, l), cnt_l = __shfl_sync(kFull, cnt, l);
      *seq = base + l;
      *tile = slot - (before + incl_l - cnt_l);
      return true;
    }
    before += __shfl_sync(kFull, incl, 31);
  }
  return false;
}

// Loads the K (and, unless V aliases K, V) rows of positions p0 .. p0 +
// kAttnCols - 1 into shared memory as F32; rows past p_end are zeros (a
// zero probability times a zero V row: no NaN from stale memory). Warp w
// loads rows w, w + 4, ...; lane l dims l, l + 32, ...
template <typename T, int kPL>
__device__ void LoadKvTile(const T* kbase, const T* vbase, bool load_v, const int32_t* page_table,
                           int ps, int64_t token_elems, int p0, int p_end, int hd, int ks, int vs,
                           float* kst, float* vst) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int jj = 0; jj < kAttnCols / kAttnWarps; ++jj) {
    const int j = warp + kAttnWarps * jj;
    const int p = p0 + j;
    float* kr = kst + j * ks;
    float* vr = vst + j * vs;
    if (p <= p_end) {
      const int64_t slot = int64_t{page_table[p / ps]} * ps + p % ps;
      const T* kg = kbase + slot * token_elems;
      const T* vg = vbase + slot * token_elems;
#pragma unroll
      for (int k = 0; k < kPL; ++k) {
        const int d = lane + 32 * k;
        if (d < hd) {
          kr[d] = ToFloat(kg[d]);
          if (load_v) vr[d] = ToFloat(vg[d]);
        }
      }
    } else {
#pragma unroll
      for (int k = 0; k < kPL; ++k) {
        const int d = lane + 32 * k;
        if (d < hd) {
          kr[d] = 0.f;
          if (load_v) vr[d] = 0.f;
        }
      }
    }
  }
}

// kPL: dims per lane, head_dim <= 32 * kPL.
template <int kPL>
__global__ void __launch_bounds__(kAttnThreads)
    FlashAttentionKernel(View q, KvLayer layer, const Seq* seqs, int32_t num_seqs, AttentionArgs a,
                         View out, float* ml_part, float* acc_part, int splits) {
  STRATA_GRID_DEPENDENCY();
  STRATA_DYNAMIC_SMEM(smem);
  STRATA_SHARED int seq_s;
  STRATA_SHARED int64_t tile_s;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int hd = a.head_dim;
  const int group = a.num_heads / a.num_kv_heads;
  const int kh = blockIdx.y, z = blockIdx.z;
  if (warp == 0) {
    int s = -1;
    int64_t t = 0;
    const bool found = FindTile(seqs, num_seqs, group, blockIdx.x, kAttnRows, &s, &t);
    if (lane == 0) {
      seq_s = found ? s : -1;
      tile_s = t;
    }
  }
  __syncthreads();
  if (seq_s < 0) return;  // a slack slot: the whole block leaves
  const Seq sq = seqs[seq_s];
  const int64_t r0 = tile_s * kAttnRows;  // the tile's first query row (t * group + h)
  const int rows = static_cast<int>(min(int64_t{kAttnRows}, int64_t{sq.q_len} * group - r0));
  const int ctx0 = sq.kv_len - sq.q_len;  // position of the sequence's token 0
  const int window = a.sliding_window;

  // This warp's rows: position, first visible position, live (real and in q).
  int pos[kRowsPerWarp], first[kRowsPerWarp];
  int nlive = 0;  // live rows are a prefix of i (rows w + 4i < rows)
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp + kAttnWarps * i;
    const int64_t t = (r0 + r) / group;
    pos[i] = ctx0 + static_cast<int>(t);
    first[i] = window > 0 ? max(0, pos[i] - window + 1) : 0;
    if (r < rows && sq.q_start + t < q.rows) nlive = i + 1;
  }
  // The tile's KV range and this split's piece of it.
  const int t_lo = static_cast<int>(r0 / group), t_hi = static_cast<int>((r0 + rows - 1) / group);
  const int hi = ctx0 + t_hi;
  const int lo = window > 0 ? max(0, ctx0 + t_lo - window + 1) : 0;
  int chunk = (hi - lo + 1 + splits - 1) / splits;
  chunk = max(kAttnCols, (chunk + kAttnCols - 1) / kAttnCols * kAttnCols);
  const int z_lo = lo + z * chunk;
  const int z_hi = min(hi, z_lo + chunk - 1);  // < z_lo: an empty piece
  if (z_hi < z_lo) {
    // Nothing to attend to (a short context leaves the last pieces empty):
    // say so to the reduce (max -inf, sum 0) and leave. Piece 0 starts at
    // lo <= hi, so splits > 1 here unless q_len > kv_len (a caller bug the
    // CPU backend rejects; the rows are left alone).
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      if (i < nlive && lane == 0 && splits > 1) {
        const int64_t qr = r0 + warp + kAttnWarps * i, row = sq.q_start + qr / group;
        const int head = kh * group + static_cast<int>(qr % group);
        const int64_t pi = (static_cast<int64_t>(z) * q.rows + row) * a.num_heads + head;
        ml_part[2 * pi] = -INFINITY;
        ml_part[2 * pi + 1] = 0.f;
      }
    }
    return;
  }

  const bool v_alias = layer.v == nullptr || layer.v == layer.k;
  const int ks = hd | 1, vs = v_alias ? ks : hd;
  float* qs = smem;
  float* kst = qs + kAttnRows * hd;
  float* vst = v_alias ? kst : kst + kAttnCols * ks;
  for (int idx = threadIdx.x; idx < kAttnRows * hd; idx += kAttnThreads) {
    const int r = idx / hd, d = idx % hd;
    float v = 0.f;
    if (r < rows) {
      const int64_t qr = r0 + r, row = sq.q_start + qr / group;
      const int head = kh * group + static_cast<int>(qr % group);
      if (row < q.rows) v = RowF(q, row)[static_cast<int64_t>(head) * hd + d];
    }
    qs[idx] = v;
  }

  float acc[kRowsPerWarp][kPL], m[kRowsPerWarp], l[kRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int k = 0; k < kPL; ++k) acc[i][k] = 0.f;
  }
  const int64_t token_elems = static_cast<int64_t>(layer.num_kv_heads) * hd;
  const int64_t head_off = static_cast<int64_t>(kh) * hd;
  for (int p0 = z_lo; p0 <= z_hi; p0 += kAttnCols) {
    __syncthreads();  // the q tile is written / every warp is done with the last tile
    switch (layer.dtype) {
      case DType::kBF16: {
        const auto* k = static_cast<const __nv_bfloat16*>(layer.k) + head_off;
        const auto* v = v_alias ? k : static_cast<const __nv_bfloat16*>(layer.v) + head_off;
        LoadKvTile<__nv_bfloat16, kPL>(k, v, !v_alias, sq.page_table, layer.page_size, token_elems,
                                       p0, z_hi, hd, ks, vs, kst, vst);
        break;
      }
      case DType::kF16: {
        const auto* k = static_cast<const __half*>(layer.k) + head_off;
        const auto* v = v_alias ? k : static_cast<const __half*>(layer.v) + head_off;
        LoadKvTile<__half, kPL>(k, v, !v_alias, sq.page_table, layer.page_size, token_elems, p0,
                                z_hi, hd, ks, vs, kst, vst);
        break;
      }
      default: {
        const auto* k = static_cast<const float*>(layer.k) + head_off;
        const auto* v = v_alias ? k : static_cast<const float*>(layer.v) + head_off;
        LoadKvTile<float, kPL>(k, v, !v_alias, sq.page_table, layer.page_size, token_elems, p0,
                               z_hi, hd, ks, vs, kst, vst);
        break;
      }
    }
    __syncthreads();
    // Scores: lane `lane` against position p0 + lane, for each live row.
    const float* kr = kst + lane * ks;
    float dot[kRowsPerWarp];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) dot[i] = 0.f;
    if (nlive == kRowsPerWarp) {
      for (int d = 0; d < hd; ++d) {
        const float kv = kr[d];
#pragma unroll
        for (int i = 0; i < kRowsPerWarp; ++i)
          dot[i] = fmaf(qs[(warp + kAttnWarps * i) * hd + d], kv, dot[i]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) {
        if (i < nlive) {
          const float* qr = qs + (warp + kAttnWarps * i) * hd;
          float s = 0.f;
          for (int d = 0; d < hd; ++d) s = fmaf(qr[d], kr[d], s);
          dot[i] = s;
        }
      }
    }
    // Online softmax, one row at a time over the warp's 32 positions.
    const int p = p0 + lane;
    float prob[kRowsPerWarp];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      prob[i] = 0.f;
      if (i < nlive) {  // warp-uniform
        const bool valid = p <= z_hi && p >= first[i] && p <= pos[i];
        const float s = valid ? dot[i] * a.scale : -INFINITY;
        float mx = s;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, o));
        const float mn = fmaxf(m[i], mx);
        // mn == -inf: nothing visible to this row yet (acc and l are 0).
        const float corr = mn == -INFINITY ? 1.f : expf(m[i] - mn);  // 0 when m[i] == -inf
        const float e = valid ? expf(s - mn) : 0.f;
        float sum = e;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(kFull, sum, o);
        l[i] = l[i] * corr + sum;
        m[i] = mn;
#pragma unroll
        for (int k = 0; k < kPL; ++k) acc[i][k] *= corr;
        prob[i] = e;
      }
    }
    // acc += P . V over the tile's real positions.
    const int jn = min(kAttnCols, z_hi - p0 + 1);
    for (int j = 0; j < jn; ++j) {
      const float* vr = vst + j * vs;
      float vv[kPL];
#pragma unroll
      for (int k = 0; k < kPL; ++k) {
        const int d = lane + 32 * k;
        vv[k] = d < hd ? vr[d] : 0.f;
      }
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) {
        if (i < nlive) {
          const float pj = __shfl_sync(kFull, prob[i], j);
#pragma unroll
          for (int k = 0; k < kPL; ++k) acc[i][k] = fmaf(pj, vv[k], acc[i][k]);
        }
      }
    }
  }

#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    if (i >= nlive) continue;
    const int64_t qr = r0 + warp + kAttnWarps * i, row = sq.q_start + qr / group;
    const int head = kh * group + static_cast<int>(qr % group);
    if (splits == 1) {
      const float inv = 1.f / l[i];
      float* o = RowF(out, row) + static_cast<int64_t>(head) * hd;
#pragma unroll
      for (int k = 0; k < kPL; ++k) {
        const int d = lane + 32 * k;
        if (d < hd) o[d] = acc[i][k] * inv;
      }
    } else {
      const int64_t pi = (static_cast<int64_t>(z) * q.rows + row) * a.num_heads + head;
      if (lane == 0) {
        ml_part[2 * pi] = m[i];
        ml_part[2 * pi + 1] = l[i];
      }
      if (m[i] != -INFINITY) {  // else acc is all zeros and the reduce skips it
        float* ap = acc_part + pi * hd;
#pragma unroll
        for (int k = 0; k < kPL; ++k) {
          const int d = lane + 32 * k;
          if (d < hd) ap[d] = acc[i][k];
        }
      }
    }
  }
}

// One block of kAttnThreads per (query row, head): merges the splits'
// partial results, out = sum_z f_z acc_z / sum_z f_z l_z with f_z =
// exp(m_z - max m). Rows of q outside every sequence are left alone, as
// FlashAttentionKernel leaves them.
__global__ void __launch_bounds__(kAttnThreads)
    AttentionReduceKernel(const Seq* seqs, int32_t num_seqs, AttentionArgs a, View out,
                          const float* ml_part, const float* acc_part, int splits) {
  STRATA_GRID_DEPENDENCY();
  const int64_t row = blockIdx.x;
  const int head = blockIdx.y;
  const int hd = a.head_dim;
  STRATA_SHARED float f_s[kMaxSplits];
  STRATA_SHARED float inv_s;
  STRATA_SHARED int seq_s;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    const int s = FindSeqOfRow(seqs, num_seqs, row);
    float mz[kMaxSplits / 32], lz[kMaxSplits / 32];
    float mx = -INFINITY;
#pragma unroll
    for (int k = 0; k < kMaxSplits / 32; ++k) {
      const int zz = lane + 32 * k;
      mz[k] = -INFINITY;
      lz[k] = 0.f;
      if (s >= 0 && zz < splits) {
        const int64_t pi = (static_cast<int64_t>(zz) * out.rows + row) * a.num_heads + head;
        mz[k] = ml_part[2 * pi];
        lz[k] = ml_part[2 * pi + 1];
      }
      mx = fmaxf(mx, mz[k]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, o));
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < kMaxSplits / 32; ++k) {
      const float f = mz[k] == -INFINITY ? 0.f : expf(mz[k] - mx);
      if (lane + 32 * k < kMaxSplits) f_s[lane + 32 * k] = mz[k] == -INFINITY ? -1.f : f;
      sum += f * lz[k];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(kFull, sum, o);
    if (lane == 0) {
      seq_s = s;
      inv_s = 1.f / sum;
    }
  }
  __syncthreads();
  if (seq_s < 0) return;
  float* o = RowF(out, row) + static_cast<int64_t>(head) * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float v = 0.f;
    for (int zz = 0; zz < splits; ++zz) {
      const float f = f_s[zz];
      if (f >= 0.f)  // -1: that split saw no position of this row (its acc was not written)
        v = fmaf(
            f,
            acc_part[((static_cast<int64_t>(zz) * out.rows + row) * a.num_heads + head) * hd + d],
            v);
    }
    o[d] = v * inv_s;
  }
}

}  // namespace

// Dynamic shared memory: q tile [kAttnRows][hd], K tile [kAttnCols][ks],
// V tile [kAttnCols][hd] (none when V aliases K: it is read from the K
// tile). ks = hd rounded up to odd, so lane j reading dim d of row j hits
// bank (j * ks + d) % 32: a different bank for every lane.
size_t AttentionSmemBytes(int hd, bool v_alias) {
  const size_t ks = static_cast<size_t>(hd | 1);
  return (static_cast<size_t>(kAttnRows) * hd + kAttnCols * ks +
          (v_alias ? 0 : static_cast<size_t>(kAttnCols) * hd)) *
         sizeof(float);
}

namespace {
// Split-K pieces for tiles of tile_rows query rows walking tile_cols KV
// positions at a time (AttentionSplits for the FMA kernel's tiles; the
// tensor-core kernel's in attention_mma.cuh).
int SplitsFor(int64_t q_rows, int32_t num_seqs, const AttentionArgs& a, int num_sms, int tile_rows,
              int tile_cols) {
  const int64_t group = a.num_heads / a.num_kv_heads;
  // Tiles of the launch: at least q_rows * group / tile_rows in all, and at
  // least ceil(group / tile_rows) per sequence (a decode token fills one).
  const int64_t per_seq = (group + tile_rows - 1) / tile_rows;
  const int64_t tiles = std::max<int64_t>({1, (q_rows * group + tile_rows - 1) / tile_rows,
                                           std::min<int64_t>(num_seqs, q_rows) * per_seq}) *
                        a.num_kv_heads;
  // Enough blocks for four per SM.
  int64_t want = (4LL * std::max(num_sms, 1) + tiles - 1) / tiles;
  // A piece is never under tile_cols positions, so pieces beyond the
  // longest tile range's count of them would exit at once (a 16-token
  // context at batch 1 launched 64 pieces per KV head for one of work). A
  // tile's range is at most the longest kv_len, and under a sliding window
  // at most window + tile_rows - 1 (its tokens' windows together).
  if (a.max_kv_len > 0) {
    int64_t span = a.max_kv_len;
    if (a.sliding_window > 0) span = std::min<int64_t>(span, a.sliding_window + tile_rows - 1);
    want = std::min(want, (span + tile_cols - 1) / tile_cols);
  }
  return static_cast<int>(std::min<int64_t>(std::max<int64_t>(want, 1), kMaxSplits));
}

}  // namespace

int AttentionSplits(int64_t q_rows, int32_t num_seqs, const AttentionArgs& a, int num_sms) {
  return SplitsFor(q_rows, num_seqs, a, num_sms, kAttnRows, kAttnCols);
}

size_t PagedAttentionWorkspaceBytes(int64_t q_rows, int32_t num_seqs, const AttentionArgs& args,
                                    int num_sms) {
  AttentionArgs a = args;
  a.max_kv_len = 0;  // the most splits any max_kv_len allows
  int splits = AttentionSplits(q_rows, num_seqs, a, num_sms);
#ifdef STRATA_ATTENTION_MMA
  if (a.tensor_cores) splits = std::max(splits, MmaAttentionSplits(q_rows, num_seqs, a, num_sms));
#endif
  if (splits == 1) return 0;
  return static_cast<size_t>(splits) * q_rows * a.num_heads * (a.head_dim + 2) * sizeof(float);
}

void PagedAttention(const View& q, const KvLayer& layer, const Seq* seqs, int32_t num_seqs,
                    const AttentionArgs& args, const View& out, void* workspace,
                    size_t workspace_bytes, int num_sms, cudaStream_t stream) {
  if (q.rows == 0 || num_seqs == 0) return;
#ifdef STRATA_ATTENTION_MMA
  if (PagedAttentionUsesTensorCores(q.rows, num_seqs, args, layer)) {
    MmaAttention(q, layer, seqs, num_seqs, args, out, workspace, num_sms, stream);
    return;
  }
#endif
  const int splits = AttentionSplits(q.rows, num_seqs, args, num_sms);
  const int64_t group = args.num_heads / args.num_kv_heads;
  // Tile slots: an upper bound on sum_s ceil(q_len_s * group / kAttnRows),
  // which is at most both of these (a decode batch: exactly the second).
  const int64_t per_row = (group + kAttnRows - 1) / kAttnRows;
  const int64_t slots =
      std::min((q.rows * group + kAttnRows - 1) / kAttnRows + num_seqs, q.rows * per_row);
  float* ml = nullptr;
  float* acc = nullptr;
  if (splits > 1) {
    ml = static_cast<float*>(workspace);
    acc = ml + static_cast<size_t>(splits) * q.rows * args.num_heads * 2;
  }
  const bool v_alias = layer.v == nullptr || layer.v == layer.k;
  const size_t smem = AttentionSmemBytes(args.head_dim, v_alias);
  const dim3 grid(static_cast<unsigned>(slots), static_cast<unsigned>(args.num_kv_heads),
                  static_cast<unsigned>(splits));
  auto launch = [&](auto kernel) {
    if (smem > 48 * 1024)
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem));
    STRATA_LAUNCH(kernel, grid, kAttnThreads, smem, stream, q, layer, seqs, num_seqs, args, out, ml,
                  acc, splits);
  };
  const int hd = args.head_dim;
  if (hd <= 64) {
    launch(FlashAttentionKernel<2>);
  } else if (hd <= 128) {
    launch(FlashAttentionKernel<4>);
  } else if (hd <= 256) {
    launch(FlashAttentionKernel<8>);
  } else {
    launch(FlashAttentionKernel<kMaxHeadDim / 32>);
  }
  if (splits > 1) {
    const dim3 rgrid(static_cast<unsigned>(q.rows), static_cast<unsigned>(args.num_heads));
    STRATA_LAUNCH(AttentionReduceKernel, rgrid, kAttnThreads, 0, stream, seqs, num_seqs, args, out,
                  ml, acc, splits);
  }
}
