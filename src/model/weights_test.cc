#include "model/weights.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

namespace strata {
namespace {

using ::testing::HasSubstr;

class WeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/weights_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  void WriteRaw(const std::string& name, const std::string& bytes) {
    std::ofstream f(Path(name), std::ios::binary);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }

  // A file with the given header text (unpadded) and `data_bytes` zero bytes.
  void WriteWithHeader(const std::string& name, const std::string& header, size_t data_bytes) {
    std::string out(8, '\0');
    uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
    out += header;
    out.append(data_bytes, '\0');
    WriteRaw(name, out);
  }

  // Opens a one-tensor-header file and returns the error.
  Status OpenBad(const std::string& header, size_t data_bytes) {
    WriteWithHeader("bad.safetensors", header, data_bytes);
    auto s = WeightStore::OpenFile(Path("bad.safetensors"));
    EXPECT_FALSE(s.ok()) << header;
    return s.ok() ? OkStatus() : s.status();
  }

  std::string dir_;
};

std::vector<uint8_t> Bytes(size_t n, uint8_t start) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(start + i);
  return v;
}

TEST_F(WeightsTest, RoundTrip) {
  std::vector<TensorToWrite> ts = {
      {"model.embed_tokens.weight", DType::kBF16, {2, 3}, Bytes(12, 1)},
      {"model.norm.weight", DType::kF32, {4}, Bytes(16, 50)},
      {"step", DType::kI64, {}, Bytes(8, 100)},
      {"empty", DType::kF16, {0, 5}, {}},
  };
  ASSERT_TRUE(WriteSafetensors(Path("model.safetensors"), ts, {{"format", "pt"}}).ok());

  // Header is padded so the data area is 8-byte aligned.
  std::ifstream f(Path("model.safetensors"), std::ios::binary);
  uint8_t len[8];
  f.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  EXPECT_EQ(n % 8, 0u);

  auto store = WeightStore::Open(dir_);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ(store->size(), 4u);
  EXPECT_EQ(store->total_bytes(), 12u + 16u + 8u);
  for (const auto& t : ts) {
    const WeightInfo* w = store->Find(t.name);
    ASSERT_NE(w, nullptr) << t.name;
    EXPECT_EQ(w->dtype, t.dtype);
    EXPECT_EQ(w->shape, t.shape);
    ASSERT_EQ(w->nbytes, t.bytes.size());
    if (w->nbytes) EXPECT_EQ(std::memcmp(w->data, t.bytes.data(), w->nbytes), 0) << t.name;
    EXPECT_THAT(w->file, HasSubstr("model.safetensors"));
  }

  auto emb = store->Get("model.embed_tokens.weight", {2, 3});
  ASSERT_TRUE(emb.ok()) << emb.status().ToString();
  EXPECT_EQ(emb->rows, 2);
  EXPECT_EQ(emb->cols, 3);
  EXPECT_EQ(emb->dtype, DType::kBF16);
  EXPECT_EQ(static_cast<const uint8_t*>(emb->data)[0], 1);
  auto norm = store->Get("model.norm.weight", {4});
  ASSERT_TRUE(norm.ok());
  EXPECT_EQ(norm->rows, 1);
  EXPECT_EQ(norm->cols, 4);
  EXPECT_EQ(store->Unused(), (std::vector<std::string>{"empty", "step"}));
}

TEST_F(WeightsTest, DeterministicBytes) {
  std::vector<TensorToWrite> ts = {{"b", DType::kF32, {2}, Bytes(8, 3)},
                                   {"a", DType::kBF16, {1}, Bytes(2, 9)}};
  ASSERT_TRUE(WriteSafetensors(Path("x.safetensors"), ts).ok());
  ASSERT_TRUE(WriteSafetensors(Path("y.safetensors"), ts).ok());
  std::ifstream x(Path("x.safetensors"), std::ios::binary),
      y(Path("y.safetensors"), std::ios::binary);
  std::string xs((std::istreambuf_iterator<char>(x)), {}),
      ys((std::istreambuf_iterator<char>(y)), {});
  EXPECT_EQ(xs, ys);
  EXPECT_FALSE(std::filesystem::exists(Path("x.safetensors.tmp")));
}

TEST_F(WeightsTest, WriterRejectsWrongByteCount) {
  Status s = WriteSafetensors(Path("w.safetensors"), {{"w", DType::kF32, {3}, Bytes(8, 0)}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'w'"));
  s = WriteSafetensors(Path("w.safetensors"), {{"w", DType::kF32, {1}, Bytes(4, 0)},
                                               {"w", DType::kF32, {1}, Bytes(4, 0)}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

TEST_F(WeightsTest, GetErrors) {
  ASSERT_TRUE(
      WriteSafetensors(Path("model.safetensors"), {{"w", DType::kBF16, {4, 8}, Bytes(64, 0)},
                                                   {"ids", DType::kI32, {2}, Bytes(8, 0)}})
          .ok());
  auto store = WeightStore::Open(dir_);
  ASSERT_TRUE(store.ok());
  auto missing = store->Get("model.norm.weight", {8});
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("model.safetensors: missing tensor 'model.norm.weight'"));
  auto shape = store->Get("w", {4, 16});
  EXPECT_EQ(shape.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(shape.status().message(), HasSubstr("tensor 'w' has shape [4, 8], expected [4, 16]"));
  auto dtype = store->Get("ids", {2});
  EXPECT_EQ(dtype.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(dtype.status().message(), HasSubstr("I32"));
  // Failed Gets do not count as use.
  EXPECT_EQ(store->Unused(), (std::vector<std::string>{"ids", "w"}));
}

TEST_F(WeightsTest, FileShorterThanEightBytes) {
  WriteRaw("short.safetensors", "abc");
  auto s = WeightStore::OpenFile(Path("short.safetensors"));
  EXPECT_EQ(s.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.status().message(), HasSubstr("short.safetensors"));
  EXPECT_THAT(s.status().message(), HasSubstr("shorter than the 8-byte header"));
  WriteRaw("empty.safetensors", "");
  EXPECT_EQ(WeightStore::OpenFile(Path("empty.safetensors")).status().code(),
            StatusCode::kDataLoss);
}

TEST_F(WeightsTest, HeaderLengthPastEndOfFile) {
  std::string bytes(8, '\0');
  bytes[0] = 100;  // claims 100 header bytes, file has 10
  bytes += "{}";
  WriteRaw("h.safetensors", bytes);
  auto s = WeightStore::OpenFile(Path("h.safetensors"));
  EXPECT_EQ(s.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.status().message(), HasSubstr("runs past the end"));
}

TEST_F(WeightsTest, AbsurdHeaderLength) {
  std::string bytes(8, '\0');
  bytes[5] = 1;  // 2^40
  bytes += "{}";
  WriteRaw("h.safetensors", bytes);
  auto s = WeightStore::OpenFile(Path("h.safetensors"));
  EXPECT_EQ(s.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.status().message(), HasSubstr("absurd"));
}

TEST_F(WeightsTest, InvalidJson) {
  Status s = OpenBad("{\"w\": {\"dtype\": ", 0);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("not valid JSON"));
  EXPECT_THAT(s.message(), HasSubstr("bad.safetensors"));
}

TEST_F(WeightsTest, HeaderNotAnObject) {
  Status s = OpenBad("[1, 2]", 0);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("must be a JSON object"));
  s = OpenBad(R"({"w": [1]})", 0);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("'w'"));
}

TEST_F(WeightsTest, UnknownDtypeIsUnimplemented) {
  Status s = OpenBad(R"({"w": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}})", 2);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("F8_E4M3"));
  EXPECT_THAT(s.message(), HasSubstr("tensor 'w'"));
  s = OpenBad(R"({"w": {"shape": [2], "data_offsets": [0, 2]}})", 2);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("dtype"));
}

TEST_F(WeightsTest, BadShapes) {
  for (const char* shape : {"3", "[-1]", "[1.5]", "[\"2\"]", "null"}) {
    Status s = OpenBad(std::string(R"({"w": {"dtype": "F32", "shape": )") + shape +
                           R"(, "data_offsets": [0, 4]}})",
                       4);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << shape;
    EXPECT_THAT(s.message(), HasSubstr("shape")) << shape;
    EXPECT_THAT(s.message(), HasSubstr("'w'")) << shape;
  }
}

// The message quotes the bad value; dumping a 200,000-deep [[[...]]] whole
// used to recurse once per level and overflow the stack.
TEST_F(WeightsTest, DeeplyNestedValuesInErrorsAreNotDumpedWhole) {
  const std::string deep = std::string(200'000, '[') + std::string(200'000, ']');
  Status s =
      OpenBad(R"({"w": {"dtype": "F32", "shape": )" + deep + R"(, "data_offsets": [0, 4]}})", 4);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("shape a deeply nested array must be"));
  s = OpenBad(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": )" + deep + "}}", 4);
  EXPECT_THAT(s.message(), HasSubstr("got a deeply nested array"));
  auto index = ParseShardIndex(R"({"weight_map": {"a": )" + deep + "}}", "i.json");
  EXPECT_THAT(index.status().message(), HasSubstr("got a deeply nested array"));
}

// nlohmann reports a number too large for a double (1e400) as out_of_range,
// not parse_error; it used to escape Open() as an exception.
TEST_F(WeightsTest, NumberOverflowInHeaderOrIndexIsDataLoss) {
  Status s = OpenBad(R"({"w": {"dtype": "F32", "shape": [1e400], "data_offsets": [0, 4]}})", 4);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("header is not valid JSON"));
  auto index =
      ParseShardIndex(R"({"metadata": {"total_size": 1e400}, "weight_map": {}})", "i.json");
  EXPECT_EQ(index.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(index.status().message(), HasSubstr("i.json: not valid JSON"));
}

TEST_F(WeightsTest, BadDataOffsets) {
  for (const char* off : {"[0]", "[0, 4, 8]", "\"0-4\"", "[0, -4]", "[0.0, 4]"}) {
    Status s = OpenBad(
        std::string(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": )") + off + "}}", 8);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << off;
    EXPECT_THAT(s.message(), HasSubstr("data_offsets")) << off;
  }
  Status s = OpenBad(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", 8);
  EXPECT_THAT(s.message(), HasSubstr("begin > end"));
  s = OpenBad(R"({"w": {"dtype": "F32", "shape": [1]}})", 8);
  EXPECT_THAT(s.message(), HasSubstr("missing"));
}

TEST_F(WeightsTest, TruncatedFile) {
  Status s = OpenBad(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(),
              HasSubstr("file is truncated: tensor w needs bytes up to 16, data area has 8"));
}

TEST_F(WeightsTest, TruncatedRealFile) {
  ASSERT_TRUE(WriteSafetensors(Path("model.safetensors"), {{"a", DType::kF32, {4}, Bytes(16, 0)},
                                                           {"b", DType::kF32, {4}, Bytes(16, 0)}})
                  .ok());
  std::filesystem::resize_file(Path("model.safetensors"),
                               std::filesystem::file_size(Path("model.safetensors")) - 1);
  auto s = WeightStore::Open(dir_);
  EXPECT_EQ(s.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.status().message(), HasSubstr("file is truncated: tensor b needs bytes up to 32"));
}

TEST_F(WeightsTest, OverlappingTensors) {
  Status s = OpenBad(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                         "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                     12);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("overlap"));
  EXPECT_THAT(s.message(), HasSubstr("'a'"));
  EXPECT_THAT(s.message(), HasSubstr("'b'"));
  // Touching ranges and empty tensors are fine.
  WriteWithHeader("ok.safetensors", R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                         "e": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},
                         "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
                  16);
  EXPECT_TRUE(WeightStore::OpenFile(Path("ok.safetensors")).ok());
}

TEST_F(WeightsTest, ByteSizeMismatch) {
  Status s = OpenBad(R"({"w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 8]}})", 8);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("tensor 'w'"));
  EXPECT_THAT(s.message(), HasSubstr("needs 12"));
}

TEST_F(WeightsTest, HugeShapeOverflowIsRejected) {
  Status s = OpenBad(
      R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 4]}})",
      4);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
}

TEST_F(WeightsTest, NoWeightsInDir) {
  auto s = WeightStore::Open(dir_);
  EXPECT_EQ(s.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(s.status().message(), HasSubstr("model.safetensors"));
  EXPECT_THAT(s.status().message(), HasSubstr("model.safetensors.index.json"));
}

// Corrupting bytes of a valid file (or cutting it short) gives OK or an
// error, never a crash or a tensor reaching outside the mapping.
TEST_F(WeightsTest, MutatedFilesNeverCrash) {
  ASSERT_TRUE(WriteSafetensors(Path("good.safetensors"),
                               {{"model.a", DType::kBF16, {3, 4}, Bytes(24, 0)},
                                {"model.b", DType::kF32, {5}, Bytes(20, 0)},
                                {"c", DType::kI64, {1}, Bytes(8, 0)}},
                               {{"format", "pt"}})
                  .ok());
  std::ifstream in(Path("good.safetensors"), std::ios::binary);
  const std::string good((std::istreambuf_iterator<char>(in)), {});
  std::mt19937_64 rng(42);  // fixed sequence: the test is deterministic
  const char kInteresting[] = {'0', '9', '[', ']', '{', '}', ',', '"', '-', ' ', '\0', '\xff'};
  for (int iter = 0; iter < 150; ++iter) {
    std::string bad = good;
    for (int k = 0, n = 1 + static_cast<int>(rng() % 3); k < n; ++k) {
      size_t pos = rng() % bad.size();
      bad[pos] = (rng() % 2) ? kInteresting[rng() % sizeof(kInteresting)]
                             : static_cast<char>(rng() & 0xff);
    }
    if (rng() % 8 == 0) bad.resize(rng() % bad.size());
    WriteRaw("m.safetensors", bad);
    auto store = WeightStore::OpenFile(Path("m.safetensors"));
    if (!store.ok()) continue;
    for (const auto& [name, w] : store->tensors()) {
      const char* begin = static_cast<const char*>(w.data);
      ASSERT_LE(w.nbytes, bad.size()) << iter;
      volatile char sink = 0;
      for (size_t i = 0; i < w.nbytes; ++i)
        sink = sink + begin[i];  // faults if outside the mapping
    }
  }
}

class ShardedTest : public WeightsTest {
 protected:
  void WriteShards() {
    ASSERT_TRUE(WriteSafetensors(
                    Path("model-00001-of-00002.safetensors"),
                    {{"a", DType::kBF16, {2}, Bytes(4, 0)}, {"b", DType::kBF16, {2}, Bytes(4, 10)}})
                    .ok());
    ASSERT_TRUE(WriteSafetensors(Path("model-00002-of-00002.safetensors"),
                                 {{"c", DType::kF32, {1}, Bytes(4, 20)}})
                    .ok());
  }
  void WriteIndex(const std::string& weight_map) {
    WriteRaw("model.safetensors.index.json",
             R"({"metadata": {"total_size": 12}, "weight_map": )" + weight_map + "}");
  }
};

TEST_F(ShardedTest, OpensAllShards) {
  WriteShards();
  WriteIndex(R"({"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
                 "c": "model-00002-of-00002.safetensors"})");
  auto store = WeightStore::Open(dir_);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ(store->size(), 3u);
  ASSERT_NE(store->Find("c"), nullptr);
  EXPECT_THAT(store->Find("c")->file, HasSubstr("model-00002-of-00002.safetensors"));
  EXPECT_EQ(static_cast<const uint8_t*>(store->Find("b")->data)[0], 10);
  EXPECT_EQ(static_cast<const uint8_t*>(store->Find("c")->data)[0], 20);
  EXPECT_TRUE(store->Get("c", {1}).ok());
  EXPECT_EQ(store->Unused(), (std::vector<std::string>{"a", "b"}));
  auto missing = store->Get("d", {1});
  EXPECT_THAT(missing.status().message(),
              HasSubstr("model.safetensors.index.json: missing tensor 'd'"));
}

TEST_F(ShardedTest, MissingShard) {
  WriteShards();
  WriteIndex(
      R"({"a": "model-00001-of-00002.safetensors", "c": "model-00003-of-00003.safetensors"})");
  auto s = WeightStore::Open(dir_);
  EXPECT_EQ(s.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(s.status().message(), HasSubstr("model-00003-of-00003.safetensors"));
  EXPECT_THAT(s.status().message(), HasSubstr("'c'"));
}

TEST_F(ShardedTest, TensorAbsentFromItsShard) {
  WriteShards();
  WriteIndex(
      R"({"a": "model-00001-of-00002.safetensors", "c": "model-00001-of-00002.safetensors"})");
  auto s = WeightStore::Open(dir_);
  EXPECT_EQ(s.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.status().message(),
              HasSubstr("tensor 'c' is listed in shard model-00001-of-00002"));
}

TEST_F(ShardedTest, TensorInTwoShards) {
  ASSERT_TRUE(
      WriteSafetensors(Path("s1.safetensors"), {{"a", DType::kF32, {1}, Bytes(4, 0)}}).ok());
  ASSERT_TRUE(WriteSafetensors(Path("s2.safetensors"), {{"a", DType::kF32, {1}, Bytes(4, 0)},
                                                        {"b", DType::kF32, {1}, Bytes(4, 0)}})
                  .ok());
  WriteIndex(R"({"a": "s1.safetensors", "b": "s2.safetensors"})");
  auto s = WeightStore::Open(dir_);
  EXPECT_EQ(s.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.status().message(), HasSubstr("'a' appears in two shards"));
}

TEST_F(ShardedTest, BadIndex) {
  WriteShards();
  WriteRaw("model.safetensors.index.json", "{\"weight_map\": ");
  EXPECT_EQ(WeightStore::Open(dir_).status().code(), StatusCode::kDataLoss);
  WriteRaw("model.safetensors.index.json", R"({"metadata": {}})");
  EXPECT_THAT(WeightStore::Open(dir_).status().message(), HasSubstr("weight_map"));
  WriteIndex(R"({"a": 3})");
  EXPECT_EQ(WeightStore::Open(dir_).status().code(), StatusCode::kDataLoss);
  WriteIndex(R"({"a": "../model-00001-of-00002.safetensors"})");
  EXPECT_THAT(WeightStore::Open(dir_).status().message(), HasSubstr("plain file names"));
}

TEST_F(ShardedTest, CorruptShardNamesTheShard) {
  WriteShards();
  WriteRaw("model-00002-of-00002.safetensors", "xyz");
  WriteIndex(
      R"({"a": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"})");
  auto s = WeightStore::Open(dir_);
  EXPECT_EQ(s.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.status().message(), HasSubstr("model-00002-of-00002.safetensors"));
}

TEST_F(ShardedTest, SingleFileWinsOverIndex) {
  ASSERT_TRUE(
      WriteSafetensors(Path("model.safetensors"), {{"x", DType::kF32, {1}, Bytes(4, 0)}}).ok());
  WriteIndex(R"({"a": "missing.safetensors"})");
  auto store = WeightStore::Open(dir_);
  ASSERT_TRUE(store.ok());
  EXPECT_NE(store->Find("x"), nullptr);
}

TEST_F(WeightsTest, MoveKeepsMappingAlive) {
  ASSERT_TRUE(
      WriteSafetensors(Path("model.safetensors"), {{"x", DType::kF32, {2}, Bytes(8, 7)}}).ok());
  WeightStore moved;
  {
    auto store = WeightStore::Open(dir_);
    ASSERT_TRUE(store.ok());
    moved = std::move(store).value();
  }
  ASSERT_NE(moved.Find("x"), nullptr);
  EXPECT_EQ(static_cast<const uint8_t*>(moved.Find("x")->data)[1], 8);
}

// --- CheckWeightsFinite ------------------------------------------------------

struct FloatBits {
  DType dtype;
  uint32_t one, nan, inf, neg_inf;
};
constexpr FloatBits kFloatBits[] = {
    {DType::kF32, 0x3f800000u, 0x7fc00000u, 0x7f800000u, 0xff800000u},
    {DType::kF16, 0x3c00, 0x7e00, 0x7c00, 0xfc00},
    {DType::kBF16, 0x3f80, 0x7fc0, 0x7f80, 0xff80},
};

// n values of 1.0 in the dtype, with `special` at the given indices.
TensorToWrite Filled(const std::string& name, const FloatBits& f, int64_t n,
                     const std::vector<std::pair<int64_t, uint32_t>>& special = {}) {
  const size_t width = DTypeSize(f.dtype);
  TensorToWrite t{name, f.dtype, {n}, std::vector<uint8_t>(n * width)};
  auto put = [&](int64_t i, uint32_t bits) { std::memcpy(&t.bytes[i * width], &bits, width); };
  for (int64_t i = 0; i < n; ++i) put(i, f.one);
  for (auto [i, bits] : special) put(i, bits);
  return t;
}

class WeightCheckTest : public WeightsTest, public ::testing::WithParamInterface<FloatBits> {
 protected:
  // Writes one tensor and samples it.
  FiniteSample Sample(const TensorToWrite& t) {
    EXPECT_TRUE(WriteSafetensors(Path("model.safetensors"), {t}).ok());
    auto store = WeightStore::Open(dir_);
    EXPECT_TRUE(store.ok());
    return store.ok() ? SampleFinite(*store->Find(t.name)) : FiniteSample{};
  }
};

TEST_P(WeightCheckTest, FiniteTensorPasses) {
  FiniteSample s = Sample(Filled("w", GetParam(), 100'000));
  EXPECT_TRUE(s.finite());
  EXPECT_EQ(s.sampled, kFiniteSampleCount + 2);
}

TEST_P(WeightCheckTest, NanAndInfAtSampledPositionsAreCounted) {
  const FloatBits f = GetParam();
  const int64_t n = 100'000;
  const int64_t stride = (n - 1) / (kFiniteSampleCount + 1);
  // The first and last elements and two interior sample points.
  FiniteSample s = Sample(
      Filled("w", f, n, {{0, f.nan}, {n - 1, f.inf}, {stride, f.nan}, {1000 * stride, f.neg_inf}}));
  EXPECT_EQ(s.nan, 2u);
  EXPECT_EQ(s.inf, 2u);
  EXPECT_FALSE(s.finite());
}

TEST_P(WeightCheckTest, SmallTensorsAreCheckedWhole) {
  const FloatBits f = GetParam();
  FiniteSample s = Sample(Filled("w", f, 4000, {{1, f.nan}, {3999, f.inf}}));
  EXPECT_EQ(s.sampled, 4000u);
  EXPECT_EQ(s.nan, 1u);
  EXPECT_EQ(s.inf, 1u);
}

// The contract is a sample: a lone NaN between sample points is not seen.
// (A diverged or corrupt checkpoint has NaNs everywhere, not in one value.)
TEST_P(WeightCheckTest, ValuesBetweenSamplePointsAreNotRead) {
  const FloatBits f = GetParam();
  FiniteSample s = Sample(Filled("w", f, 100'000, {{1, f.nan}}));
  EXPECT_TRUE(s.finite());
}

TEST_P(WeightCheckTest, AllNanCheckpointIsRefusedNamingTensorFileAndFlag) {
  const FloatBits f = GetParam();
  std::vector<std::pair<int64_t, uint32_t>> all_nan;
  for (int64_t i = 0; i < 64; ++i) all_nan.push_back({i, f.nan});
  ASSERT_TRUE(
      WriteSafetensors(Path("model.safetensors"),
                       {Filled("model.embed_tokens.weight", f, 64, all_nan),
                        Filled("model.norm.weight", f, 64, all_nan),
                        Filled("lm_head.weight", f, 64, all_nan), Filled("model.ok.weight", f, 64)})
          .ok());
  auto store = WeightStore::Open(dir_);
  ASSERT_TRUE(store.ok());
  Status st = CheckWeightsFinite(*store);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_THAT(st.message(), HasSubstr(Path("model.safetensors") +
                                      ": tensor 'lm_head.weight' has non-finite values: 64 of 64 "
                                      "sampled values are NaN, 0 are Inf"));
  EXPECT_THAT(st.message(), HasSubstr("and 2 more tensors of 4 have NaN/Inf"));
  EXPECT_THAT(st.message(), HasSubstr("--skip-weight-check"));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, WeightCheckTest, ::testing::ValuesIn(kFloatBits),
                         [](const auto& info) { return std::string(DTypeName(info.param.dtype)); });

TEST_F(WeightsTest, WeightCheckReadsUnalignedTensorsAndIgnoresIntegers) {
  // "b" starts at byte 2 of the data area: an F32 not 4-byte aligned.
  std::vector<uint8_t> ints(8, 0xff);  // I32 -1 has the bits of a float NaN
  ASSERT_TRUE(WriteSafetensors(Path("model.safetensors"),
                               {Filled("a", kFloatBits[1], 1),
                                Filled("b", kFloatBits[0], 3, {{2, kFloatBits[0].inf}}),
                                {"ids", DType::kI32, {2}, ints}})
                  .ok());
  auto store = WeightStore::Open(dir_);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ(SampleFinite(*store->Find("ids")).sampled, 0u);
  FiniteSample b = SampleFinite(*store->Find("b"));
  EXPECT_EQ(b.sampled, 3u);
  EXPECT_EQ(b.inf, 1u);
  Status st = CheckWeightsFinite(*store);
  EXPECT_THAT(st.message(), HasSubstr("tensor 'b' has non-finite values: 0 of 3 sampled values are "
                                      "NaN, 1 are Inf;"));
}

}  // namespace
}  // namespace strata
