// Read-only access to a checkpoint's tensors: model.safetensors, or shards
// listed by model.safetensors.index.json. Files are memory-mapped; tensors
// are used in place (bf16 stays bf16).
//
// Every structural problem is caught at Open(): bad header length, invalid
// JSON, unknown dtype, offsets outside the data area or overlapping, shape
// not matching the byte size, index naming a missing shard or a tensor not
// in its shard. Errors name the file and tensor: DataLoss for a corrupt or
// truncated file or an index that disagrees with its shards, Unimplemented
// for a dtype other than F32/F16/BF16/I32/I64 (e.g. F8_E4M3), NotFound for
// missing files.
//
// Values are not read at Open(); CheckWeightsFinite() samples every float
// tensor for NaN/Inf (LoadModelDir runs it unless --skip-weight-check).
// Thread-safety: const methods are safe from many threads; Get() records use
// and is not.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "util/status.h"

namespace strata {

struct WeightInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // inside the mapping
  size_t nbytes = 0;
  std::string file;  // shard file name, for messages
};

class MappedFile;  // weights.cc

class WeightStore {
 public:
  // `dir` holds model.safetensors or model.safetensors.index.json (+ shards).
  static StatusOr<WeightStore> Open(const std::string& dir);
  // One file, for tests and tools.
  static StatusOr<WeightStore> OpenFile(const std::string& path);

  WeightStore();
  WeightStore(WeightStore&&) noexcept;
  WeightStore& operator=(WeightStore&&) noexcept;
  ~WeightStore();

  const WeightInfo* Find(const std::string& name) const;
  // The tensor `name` as a Tensor view (1-D shapes become 1 x n), after
  // checking it exists, has a float dtype (F32/F16/BF16) and exactly
  // `expected_shape`. Marks it used. Errors:
  //   NotFound  "model.safetensors: missing tensor 'model.norm.weight'"
  //   InvalidArgument "...: tensor 'x' has shape [4, 8], expected [4, 16]"
  StatusOr<Tensor> Get(const std::string& name, const std::vector<int64_t>& expected_shape);
  // Names never passed to Get(), sorted; used to reject unexpected tensors.
  std::vector<std::string> Unused() const;
  size_t total_bytes() const;  // sum of tensor bytes
  size_t size() const { return tensors_.size(); }
  const std::map<std::string, WeightInfo>& tensors() const { return tensors_; }

 private:
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::map<std::string, WeightInfo> tensors_;
  std::map<std::string, bool> used_;
};

// What Open() does with one file's bytes and with the index, on memory
// (for the fuzzers and tools). The WeightInfos point into `data`, which must
// outlive them; the index parse returns shard file -> its tensors and checks
// only the index itself (shard names are plain file names), not the shards.
StatusOr<std::vector<WeightInfo>> ParseSafetensorsBytes(const uint8_t* data, size_t size,
                                                        const std::string& name);
StatusOr<std::map<std::string, std::vector<std::string>>> ParseShardIndex(
    std::string_view text, const std::string& index_path);

// What a sample of one tensor's values holds (F32/F16/BF16 only).
struct FiniteSample {
  size_t sampled = 0;  // values read
  size_t nan = 0;
  size_t inf = 0;
  bool finite() const { return nan == 0 && inf == 0; }
};
// Every value of a tensor with at most kFiniteSampleCount + 2 elements;
// otherwise its first and last values and kFiniteSampleCount evenly spaced
// ones. Reads at most that many values (a few pages), so checking a 100 GB
// checkpoint costs milliseconds once its pages are resident. Integer tensors
// give an empty sample.
inline constexpr size_t kFiniteSampleCount = 4096;
FiniteSample SampleFinite(const WeightInfo& w);
// Samples every tensor; DataLoss naming the first (by name) with a NaN or
// Inf, its file, the counts, and how many other tensors failed:
//   "/m/model.safetensors: tensor 'model.norm.weight' has non-finite values:
//    64 of 64 sampled values are NaN, 0 are Inf (and 20 more tensors ...)"
Status CheckWeightsFinite(const WeightStore& store);

// Writes tensors as one safetensors file (for the demo model and tests).
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

}  // namespace strata
