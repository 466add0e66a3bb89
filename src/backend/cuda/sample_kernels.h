// The CUDA backend's sampling kernels (sample_kernels.cu), launched by
// CudaBackend::SampleRows (backend/sampling.h is the op's contract,
// engine/sampler.h the semantics). Two launches:
//   1. the prepare kernel, one block per kSampleChunk tokens of each row:
//      the row's adjustments into scratch (each token is its chunk's alone,
//      so the host's order per token holds), then the chunk's max and the
//      lowest id at it;
//   2. the sample kernel, one block per row: the row's max and greedy
//      token from the chunks' partials, so a greedy row never re-reads its
//      logits; the sampled paths read the (adjusted) row as before.
// One block reading a 151k-token row did ~40 us a pass (a latency-bound
// load stream on one SM); spread over the chunks it is a few us.
//
// What the kernel reproduces bit for bit, and how:
//   - the adjusted logits (mask, bans, logit_bias in order, penalties) with
//     the host's float operations, written without FMA contraction;
//   - the weights exp((x - max) / T) through the host's own polynomial exp,
//     operation for operation (__fmul_rn/__fadd_rn), so every weight is the
//     same float;
//   - the host's summation order for the masses (per 256-token block, four
//     float lanes, then doubles in block order), the dense inverse-CDF walk
//     and the top-p prefix walk (one thread, in double), so a row's uniform
//     gives the host's token;
//   - top-k's threshold (an exact radix select of the k-th largest logit),
//     greedy argmax with ties to the lowest id, NaN never winning.
// Logprobs: the log-sum-exp is summed in parallel in double (the host sums
// float lanes), so logprobs agree to ~1e-6, not bit for bit.
// The one known token difference is theoretical: under top-p the host
// collects candidates by weight bands until their mass (summed in id order)
// reaches the limit; if that sum lands within rounding of the limit while
// the sorted prefix's does not, the host keeps one token fewer than the
// prefix. The kernel keeps the true prefix.
//
// A row the kernel cannot finish is flagged (SampleRowOut::needs_host) and
// the backend hands it to the host Sampler: top-p or top-N candidate sets
// above kSampleCandidates tokens, a top-p prefix that a rounding margin did
// not cover, or a token that the mask forbids (every allowed logit is -inf
// or NaN: the host's KeepAllowed rule).
//
// Thread-safety: the launcher is stateless; the stream orders it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace strata::cuda {

inline constexpr int kSampleThreads = 1024;
// Candidates a row may sort in shared memory (top-p prefix, top-N logprobs).
inline constexpr int kSampleCandidates = 4096;
// Most top logprobs a row reports (kMaxLogprobs, static_assert'ed by the backend).
inline constexpr int kSampleMaxTop = 20;
// Tokens per mass block: the host sampler's kWeightBlock.
inline constexpr int kSampleWeightBlock = 256;
// Tokens per block of the prepare kernel (and per partial). The chunks are
// gridDim.y, so vocab must stay under 65535 * kSampleChunk (134M tokens).
inline constexpr int kSampleChunk = 2048;
inline constexpr int64_t SampleChunks(int64_t vocab) {
  return (vocab + kSampleChunk - 1) / kSampleChunk;
}

// Why a row went back to the host (0: it did not).
enum SampleHostReason : int32_t {
  kSampleDone = 0,
  kSampleTopPCandidates = 1,  // top-p needed more than kSampleCandidates tokens
  kSampleTopPMargin = 2,      // the collected set fell short of the top-p prefix
  kSampleMaskedOut = 3,       // the token is not allowed: the host's KeepAllowed rule
  kSampleTopNCandidates = 4,  // ties at the top-N boundary exceed kSampleCandidates
};

struct PenaltyEntry {  // mirrors strata::PenaltyToken
  int32_t token_id;
  int32_t output_count;
};

// One row; offsets index the arrays of SampleInputs.
struct SampleRowArgs {
  int64_t logit_row = 0;
  int64_t scratch_row = -1;  // row of the adjusted-logits scratch; -1: no adjustment
  double uniform = 0;
  float temperature = 1.f, top_p = 1.f, min_p = 0.f;
  float repetition_penalty = 1.f, frequency_penalty = 0.f, presence_penalty = 0.f;
  int32_t top_k = -1;
  int32_t logprobs = -1;
  int32_t allowed_words = 0, banned_count = 0, bias_count = 0, penalty_count = 0;
  int64_t allowed_offset = 0, banned_offset = 0, bias_offset = 0, penalty_offset = 0;
};

struct SampleInputs {
  const SampleRowArgs* rows = nullptr;
  const uint32_t* allowed = nullptr;  // bit masks
  const int32_t* banned = nullptr;    // banned ids
  const int32_t* bias_ids = nullptr;  // logit_bias, in order
  const float* bias_values = nullptr;
  const PenaltyEntry* penalties = nullptr;
};

// A chunk's largest non-NaN value (-inf when none) and the lowest id at it
// (INT32_MAX when every value is NaN).
struct SamplePartial {
  float max;
  int32_t index;
};

struct SampleRowOut {
  int32_t token_id;
  int32_t needs_host;  // a SampleHostReason
  float logprob;
  int32_t num_top;
  int64_t rank;
  int32_t top_ids[kSampleMaxTop];
  float top_logprobs[kSampleMaxTop];
};

// logits: F32 rows, row stride `stride` floats, `vocab` columns.
// scratch: (rows with scratch_row >= 0) x vocab floats. block_mass:
// num_rows * 2 * ceil(vocab / kSampleWeightBlock) doubles. partials:
// num_rows * SampleChunks(vocab).
// REQUIRES: vocab <= INT32_MAX.
void SampleRows(const float* logits, int64_t stride, int64_t vocab, const SampleInputs& in,
                int32_t num_rows, float* scratch, double* block_mass, SamplePartial* partials,
                SampleRowOut* out, cudaStream_t stream);

}  // namespace strata::cuda
