#include "model/weights.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "util/json_snippet.h"

namespace strata {

namespace {

using Json = nlohmann::json;

// The reference implementation (safetensors, Rust) refuses headers above
// 100 MB; a real header for a 1T-parameter model is a few MB.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

std::string Basename(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// Multiplies a * b into *out; false on uint64 overflow.
bool MulOverflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

}  // namespace

// A read-only, private memory mapping of a whole file. Empty files are held
// without a mapping (mmap of length 0 is an error).
class MappedFile {
 public:
  static StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return NotFound(path + ": no such file");
      return IoError(path + ": cannot open");
    }
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      Status s = IoError(path + ": cannot stat");
      ::close(fd);
      return s;
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      return InvalidArgument(path + ": not a regular file");
    }
    auto f = std::unique_ptr<MappedFile>(new MappedFile());
    f->path_ = path;
    f->size_ = static_cast<size_t>(st.st_size);
    if (f->size_ > 0) {
      void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        Status s = IoError(path + ": mmap of " + std::to_string(f->size_) + " bytes failed");
        ::close(fd);
        return s;
      }
      f->data_ = static_cast<const uint8_t*>(p);
    }
    ::close(fd);  // the mapping keeps the file alive
    return f;
  }

  ~MappedFile() {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

namespace {

// Parses and validates the header of a safetensors file held in memory and
// appends its tensors to *out. `name` is how the file is named in messages.
Status ParseSafetensors(const uint8_t* file_data, uint64_t size, const std::string& name,
                        std::vector<WeightInfo>* out) {
  if (size < 8) {
    return DataLoss(name + ": not a safetensors file: " + std::to_string(size) +
                    " bytes, shorter than the 8-byte header length (file is truncated or empty)");
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | file_data[i];
  if (header_len > kMaxHeaderBytes) {
    return DataLoss(name + ": header length " + std::to_string(header_len) +
                    " bytes is absurd (limit " + std::to_string(kMaxHeaderBytes) +
                    "); this is not a safetensors file or its first 8 bytes are corrupt");
  }
  if (header_len > size - 8) {
    return DataLoss(name + ": header length " + std::to_string(header_len) +
                    " bytes runs past the end of the " + std::to_string(size) +
                    "-byte file (file is truncated)");
  }
  const char* header_begin = reinterpret_cast<const char*>(file_data + 8);
  Json header;
  try {
    header = Json::parse(header_begin, header_begin + header_len);
  } catch (const Json::exception& e) {  // parse_error, or out_of_range for 1e400
    return DataLoss(name + ": header is not valid JSON (" + e.what() +
                    "); the file is corrupt or not safetensors");
  }
  if (!header.is_object()) {
    return DataLoss(name + ": header must be a JSON object of tensors, got " +
                    std::string(header.type_name()));
  }

  const uint64_t data_start = 8 + header_len;
  const uint64_t data_len = size - data_start;
  const uint8_t* data = file_data + data_start;

  struct Range {
    uint64_t begin, end;
    std::string tensor;
  };
  std::vector<Range> ranges;
  std::vector<WeightInfo> found;
  for (const auto& [tname, t] : header.items()) {
    if (tname == "__metadata__") {
      if (!t.is_object()) {
        return DataLoss(name + ": __metadata__ must be an object of strings, got " +
                        std::string(t.type_name()));
      }
      continue;
    }
    const std::string where = name + ": tensor '" + tname + "'";
    if (!t.is_object()) {
      return DataLoss(where + ": entry must be an object with dtype, shape, data_offsets; got " +
                      std::string(t.type_name()));
    }
    auto dtype_it = t.find("dtype");
    if (dtype_it == t.end() || !dtype_it->is_string()) {
      return DataLoss(where + ": missing or non-string \"dtype\"");
    }
    WeightInfo info;
    info.name = tname;
    info.file = name;
    const std::string dtype_name = dtype_it->get<std::string>();
    if (!ParseDType(dtype_name, &info.dtype)) {
      return Unimplemented(where + ": dtype " + dtype_name +
                           " is not supported (supported: F32, F16, BF16, I32, I64); "
                           "convert the checkpoint to BF16");
    }
    auto shape_it = t.find("shape");
    if (shape_it == t.end() || !shape_it->is_array()) {
      return DataLoss(where + ": missing \"shape\" or it is not a list");
    }
    uint64_t elems = 1;
    for (const auto& d : *shape_it) {
      if (!d.is_number_unsigned()) {
        return DataLoss(where + ": shape " + JsonSnippet(*shape_it) +
                        " must be a list of non-negative integers");
      }
      uint64_t v = d.get<uint64_t>();
      if (v > static_cast<uint64_t>(INT64_MAX) || MulOverflows(elems, v, &elems)) {
        return DataLoss(where + ": shape " + JsonSnippet(*shape_it) + " is too large");
      }
      info.shape.push_back(static_cast<int64_t>(v));
    }
    auto off_it = t.find("data_offsets");
    if (off_it == t.end() || !off_it->is_array() || off_it->size() != 2 ||
        !(*off_it)[0].is_number_unsigned() || !(*off_it)[1].is_number_unsigned()) {
      return DataLoss(
          where + ": \"data_offsets\" must be [begin, end] with non-negative integers" +
          (off_it == t.end() ? std::string(", it is missing") : ", got " + JsonSnippet(*off_it)));
    }
    const uint64_t begin = (*off_it)[0].get<uint64_t>();
    const uint64_t end = (*off_it)[1].get<uint64_t>();
    if (begin > end) {
      return DataLoss(where + ": data_offsets [" + std::to_string(begin) + ", " +
                      std::to_string(end) + "] has begin > end");
    }
    if (end > data_len) {
      return DataLoss(where + ": file is truncated: tensor " + tname + " needs bytes up to " +
                      std::to_string(end) + ", data area has " + std::to_string(data_len));
    }
    uint64_t expected_bytes = 0;
    if (MulOverflows(elems, DTypeSize(info.dtype), &expected_bytes) ||
        expected_bytes != end - begin) {
      return DataLoss(where + ": " + std::to_string(end - begin) +
                      " bytes in data_offsets but shape " + ShapeString(info.shape) + " of " +
                      dtype_name + " needs " + std::to_string(expected_bytes));
    }
    info.data = data + begin;
    info.nbytes = end - begin;
    if (end > begin) ranges.push_back({begin, end, tname});
    found.push_back(std::move(info));
  }

  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].begin < ranges[i - 1].end) {
      return DataLoss(name + ": tensors '" + ranges[i - 1].tensor + "' [" +
                      std::to_string(ranges[i - 1].begin) + ", " +
                      std::to_string(ranges[i - 1].end) + ") and '" + ranges[i].tensor + "' [" +
                      std::to_string(ranges[i].begin) + ", " + std::to_string(ranges[i].end) +
                      ") overlap; the file is corrupt");
    }
  }
  for (auto& w : found) out->push_back(std::move(w));
  return OkStatus();
}

}  // namespace

WeightStore::WeightStore() = default;
WeightStore::WeightStore(WeightStore&&) noexcept = default;
WeightStore& WeightStore::operator=(WeightStore&&) noexcept = default;
WeightStore::~WeightStore() = default;

StatusOr<WeightStore> WeightStore::OpenFile(const std::string& path) {
  ASSIGN_OR_RETURN(auto file, MappedFile::Open(path));
  std::vector<WeightInfo> infos;
  RETURN_IF_ERROR(ParseSafetensors(file->data(), file->size(), path, &infos));
  WeightStore store;
  for (auto& w : infos) {
    store.used_[w.name] = false;
    store.tensors_[w.name] = std::move(w);
  }
  store.files_.push_back(std::move(file));
  return store;
}

StatusOr<std::map<std::string, std::vector<std::string>>> ParseShardIndex(
    std::string_view text, const std::string& index_path) {
  Json index;
  try {
    index = Json::parse(text.begin(), text.end());
  } catch (const Json::exception& e) {  // parse_error, or out_of_range for 1e400
    return DataLoss(index_path + ": not valid JSON (" + e.what() + ")");
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    return DataLoss(index_path +
                    ": must be an object with a \"weight_map\" object "
                    "{tensor name: shard file}");
  }
  std::map<std::string, std::vector<std::string>> shards;  // shard -> tensors
  for (const auto& [tname, shard] : index["weight_map"].items()) {
    if (!shard.is_string()) {
      return DataLoss(index_path + ": weight_map entry for '" + tname +
                      "' must be a shard file name, got " + JsonSnippet(shard));
    }
    const std::string s = shard.get<std::string>();
    if (s.empty() || s.find('/') != std::string::npos || s == "." || s == "..") {
      return DataLoss(index_path + ": weight_map entry for '" + tname + "' names shard '" + s +
                      "'; shards must be plain file names in the model directory");
    }
    shards[s].push_back(tname);
  }
  if (shards.empty()) return DataLoss(index_path + ": weight_map is empty");
  return shards;
}

StatusOr<std::vector<WeightInfo>> ParseSafetensorsBytes(const uint8_t* data, size_t size,
                                                        const std::string& name) {
  std::vector<WeightInfo> infos;
  RETURN_IF_ERROR(ParseSafetensors(data, size, name, &infos));
  return infos;
}

StatusOr<WeightStore> WeightStore::Open(const std::string& dir) {
  const std::string single = JoinPath(dir, kSingleFile);
  const std::string index_path = JoinPath(dir, kIndexFile);
  if (FileExists(single)) return OpenFile(single);
  if (!FileExists(index_path)) {
    return NotFound(dir + ": no weights found: looked for " + kSingleFile + " and " + kIndexFile +
                    " (only safetensors checkpoints are supported; convert .bin/.pth/.gguf "
                    "weights to safetensors)");
  }

  // Sharded checkpoint: {"weight_map": {tensor: shard_file}}.
  ASSIGN_OR_RETURN(auto index_file, MappedFile::Open(index_path));
  ASSIGN_OR_RETURN(
      auto shards,
      ParseShardIndex(
          std::string_view(reinterpret_cast<const char*>(index_file->data()), index_file->size()),
          index_path));

  WeightStore store;
  for (const auto& [shard, names] : shards) {
    const std::string shard_path = JoinPath(dir, shard);
    if (!FileExists(shard_path)) {
      return NotFound(
          index_path + ": shard " + shard + " (holding '" + names.front() + "'" +
          (names.size() > 1 ? " and " + std::to_string(names.size() - 1) + " more" : "") +
          ") does not exist at " + shard_path + "; download the missing shard");
    }
    ASSIGN_OR_RETURN(auto file, MappedFile::Open(shard_path));
    std::vector<WeightInfo> infos;
    RETURN_IF_ERROR(ParseSafetensors(file->data(), file->size(), shard_path, &infos));
    for (auto& w : infos) {
      auto prev = store.tensors_.find(w.name);
      if (prev != store.tensors_.end()) {
        return DataLoss(index_path + ": tensor '" + w.name + "' appears in two shards: " +
                        Basename(prev->second.file) + " and " + shard);
      }
      store.used_[w.name] = false;
      store.tensors_[w.name] = std::move(w);
    }
    for (const auto& tname : names) {
      auto it = store.tensors_.find(tname);
      if (it == store.tensors_.end() || Basename(it->second.file) != shard) {
        return DataLoss(index_path + ": tensor '" + tname + "' is listed in shard " + shard +
                        " but that shard does not contain it; the index and shards do not match");
      }
    }
    store.files_.push_back(std::move(file));
  }
  return store;
}

const WeightInfo* WeightStore::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

StatusOr<Tensor> WeightStore::Get(const std::string& name,
                                  const std::vector<int64_t>& expected_shape) {
  const WeightInfo* w = Find(name);
  if (w == nullptr) {
    std::string where = files_.size() == 1 ? Basename(files_[0]->path()) : std::string(kIndexFile);
    return NotFound(where + ": missing tensor '" + name + "'; the checkpoint does not match " +
                    "the architecture in config.json");
  }
  if (w->dtype != DType::kF32 && w->dtype != DType::kF16 && w->dtype != DType::kBF16) {
    return InvalidArgument(Basename(w->file) + ": tensor '" + name + "' has dtype " +
                           DTypeName(w->dtype) + ", expected a float type (F32, F16, BF16)");
  }
  if (w->shape != expected_shape) {
    return InvalidArgument(Basename(w->file) + ": tensor '" + name + "' has shape " +
                           ShapeString(w->shape) + ", expected " + ShapeString(expected_shape));
  }
  used_[name] = true;
  Tensor t;
  t.data = const_cast<void*>(w->data);  // mapped PROT_READ: kernels only read weights
  t.dtype = w->dtype;
  if (w->shape.empty()) {
    t.rows = t.cols = 1;
  } else if (w->shape.size() == 1) {
    t.rows = 1;
    t.cols = w->shape[0];
  } else {
    t.cols = w->shape.back();
    t.rows = 1;
    for (size_t i = 0; i + 1 < w->shape.size(); ++i) t.rows *= w->shape[i];
  }
  return t;
}

std::vector<std::string> WeightStore::Unused() const {
  std::vector<std::string> names;
  for (const auto& [name, used] : used_) {
    if (!used) names.push_back(name);
  }
  return names;
}

size_t WeightStore::total_bytes() const {
  size_t n = 0;
  for (const auto& [name, w] : tensors_) n += w.nbytes;
  return n;
}

namespace {

// NaN/Inf by bit pattern: all exponent bits set. Loads go through memcpy
// because safetensors offsets need not be aligned.
template <typename Bits, Bits kExpMask, Bits kMantMask>
void ClassifyAt(const uint8_t* base, uint64_t i, FiniteSample* s) {
  Bits b;
  std::memcpy(&b, base + i * sizeof(Bits), sizeof(Bits));
  ++s->sampled;
  if ((b & kExpMask) != kExpMask) return;
  if (b & kMantMask) {
    ++s->nan;
  } else {
    ++s->inf;
  }
}

template <typename Bits, Bits kExpMask, Bits kMantMask>
FiniteSample SampleBits(const uint8_t* base, uint64_t n) {
  FiniteSample s;
  if (n == 0) return s;
  if (n <= kFiniteSampleCount + 2) {
    for (uint64_t i = 0; i < n; ++i) ClassifyAt<Bits, kExpMask, kMantMask>(base, i, &s);
    return s;
  }
  // Element 0, then kFiniteSampleCount evenly spaced ones strictly inside,
  // then the last: the ends are where a truncated or padded write shows.
  ClassifyAt<Bits, kExpMask, kMantMask>(base, 0, &s);
  const uint64_t stride = (n - 1) / (kFiniteSampleCount + 1);
  for (uint64_t k = 1; k <= kFiniteSampleCount; ++k) {
    ClassifyAt<Bits, kExpMask, kMantMask>(base, k * stride, &s);
  }
  ClassifyAt<Bits, kExpMask, kMantMask>(base, n - 1, &s);
  return s;
}

}  // namespace

FiniteSample SampleFinite(const WeightInfo& w) {
  const auto* base = static_cast<const uint8_t*>(w.data);
  switch (w.dtype) {
    case DType::kF32:
      return SampleBits<uint32_t, 0x7f800000u, 0x007fffffu>(base, w.nbytes / 4);
    case DType::kF16:
      return SampleBits<uint16_t, 0x7c00, 0x03ff>(base, w.nbytes / 2);
    case DType::kBF16:
      return SampleBits<uint16_t, 0x7f80, 0x007f>(base, w.nbytes / 2);
    default:
      return {};
  }
}

Status CheckWeightsFinite(const WeightStore& store) {
  const WeightInfo* first = nullptr;
  FiniteSample first_sample;
  size_t others = 0;
  for (const auto& [name, w] : store.tensors()) {
    FiniteSample s = SampleFinite(w);
    if (s.finite()) continue;
    if (first == nullptr) {
      first = &w;
      first_sample = s;
    } else {
      ++others;
    }
  }
  if (first == nullptr) return OkStatus();
  return DataLoss(
      first->file + ": tensor '" + first->name + "' has non-finite values: " +
      std::to_string(first_sample.nan) + " of " + std::to_string(first_sample.sampled) +
      " sampled values are NaN, " + std::to_string(first_sample.inf) + " are Inf" +
      (others ? " (and " + std::to_string(others) + " more tensor" + (others > 1 ? "s" : "") +
                    " of " + std::to_string(store.size()) + " have NaN/Inf)"
              : std::string()) +
      "; the checkpoint is corrupt or was saved after training diverged: re-download or "
      "re-convert it (--skip-weight-check loads it anyway)");
}

Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  std::set<std::string> seen;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__" || !seen.insert(t.name).second) {
      return InvalidArgument(path + ": tensor name '" + t.name +
                             "' is empty, reserved or repeated");
    }
    uint64_t elems = 1;
    for (int64_t d : t.shape) {
      if (d < 0)
        return InvalidArgument(path + ": tensor '" + t.name + "' has a negative dimension");
      elems *= static_cast<uint64_t>(d);
    }
    if (elems * DTypeSize(t.dtype) != t.bytes.size()) {
      return InvalidArgument(path + ": tensor '" + t.name + "' has " +
                             std::to_string(t.bytes.size()) + " bytes but shape " +
                             ShapeString(t.shape) + " of " + DTypeName(t.dtype) + " needs " +
                             std::to_string(elems * DTypeSize(t.dtype)));
    }
    header[t.name] = {{"dtype", DTypeName(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  // Like the reference writer: pad with spaces so the data area starts at a
  // multiple of 8 bytes.
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<uint8_t>(uint64_t{text.size()} >> (8 * i));

  // Write to a temporary name and rename, so a crash never leaves a
  // half-written file under the real name.
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return IoError(tmp + ": cannot create");
  bool ok = std::fwrite(len_bytes, 1, 8, f) == 8 &&
            std::fwrite(text.data(), 1, text.size(), f) == text.size();
  for (const auto& t : tensors) {
    if (!ok) break;
    ok = t.bytes.empty() || std::fwrite(t.bytes.data(), 1, t.bytes.size(), f) == t.bytes.size();
  }
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    Status s = IoError(tmp + ": write failed");
    std::remove(tmp.c_str());
    return s;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    Status s = IoError(path + ": cannot rename " + tmp + " into place");
    std::remove(tmp.c_str());
    return s;
  }
  return OkStatus();
}

}  // namespace strata
