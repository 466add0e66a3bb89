// End-to-end tests of the real `strata` binary: flags, help, exit codes,
// offline generation against the transformers goldens, the demo model, and
// errors for broken model directories.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

struct Result {
  int code = -1;
  std::string out, err;
};

std::string Quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/cli_e2e_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    tmp_ = tmpl;
  }
  void TearDown() override { fs::remove_all(tmp_); }

  Result Run(const std::vector<std::string>& args, const std::string& env = "") {
    std::string cmd = env + " " + Quote(STRATA_BINARY);
    for (const auto& a : args) cmd += " " + Quote(a);
    cmd += " 2>" + Quote(tmp_ + "/stderr");
    Result r;
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return r;
    std::array<char, 4096> buf;
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
    int status = pclose(p);
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::ifstream e(tmp_ + "/stderr");
    std::stringstream ss;
    ss << e.rdbuf();
    r.err = ss.str();
    return r;
  }
  static std::string Fixture(const std::string& name) {
    return std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/" + name;
  }

  std::string tmp_;
};

TEST_F(CliTest, VersionAndUsage) {
  Result r = Run({"--version"});
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("strata "));
  r = Run({});
  EXPECT_EQ(r.code, 64);
  EXPECT_THAT(r.err, HasSubstr("usage"));
  r = Run({"frobnicate"});
  EXPECT_EQ(r.code, 64);
  EXPECT_THAT(r.err, HasSubstr("unknown command"));
}

TEST_F(CliTest, EverySubcommandHasHelp) {
  for (const char* c : {"generate", "demo-model", "bench"}) {
    Result r = Run({c, "--help"});
    EXPECT_EQ(r.code, 0) << c;
    EXPECT_THAT(r.out, HasSubstr("usage: strata")) << c;
  }
  Result r = Run({"generate", "--help"});
  EXPECT_THAT(r.out, HasSubstr("--model-path"));
  EXPECT_THAT(r.out, HasSubstr("--temperature"));
}

TEST_F(CliTest, UnknownFlagSuggestsTheNearestOne) {
  Result r = Run({"generate", "--max-token", "5"});
  EXPECT_EQ(r.code, 64);
  EXPECT_THAT(r.err, HasSubstr("did you mean --max-tokens"));
  r = Run({"generate", "--prompt", "x", "--temperature", "-1"});
  EXPECT_EQ(r.code, 64);
  EXPECT_THAT(r.err, HasSubstr("--temperature"));
}

TEST_F(CliTest, GenerateMatchesTransformersGolden) {
  std::ifstream in(Fixture("qwen3") + "/golden.json");
  auto golden = nlohmann::json::parse(in);
  const auto& c = golden["cases"][3];  // 17-token prompt
  std::string ids;
  for (int id : c["prompt_ids"]) ids += (ids.empty() ? "" : ",") + std::to_string(id);
  Result r = Run({"generate", "--model-path", Fixture("qwen3"), "--prompt-ids", ids, "--max-tokens",
                  std::to_string(c["output_ids"].size()), "--ignore-eos", "--logprobs", "5",
                  "--json", "--threads", "2"});
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["output_ids"], c["output_ids"]);
  EXPECT_EQ(j["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], c["prompt_ids"].size());
  ASSERT_EQ(j["logprobs"].size(), c["steps"].size());
  for (size_t i = 0; i < c["steps"].size(); ++i)
    EXPECT_NEAR(j["logprobs"][i]["logprob"].get<double>(), c["steps"][i]["logprob"].get<double>(),
                1e-3);
  EXPECT_THAT(r.err, HasSubstr("loaded"));
}

// --device picks the backend. Without a GPU (CI), cuda says so plainly; on
// a GPU machine the CUDA backend gives the transformers golden tokens.
TEST_F(CliTest, DeviceFlagSelectsBackendOrSaysWhyNot) {
  Result r = Run({"generate", "--device", "tpu", "--prompt", "x"});
  EXPECT_NE(r.code, 0);
  EXPECT_THAT(r.err, HasSubstr("--device tpu: expected cpu, cuda or cuda:N"));
  r = Run({"generate", "--device", "cuda:x", "--prompt", "x"});
  EXPECT_NE(r.code, 0);
  EXPECT_THAT(r.err, HasSubstr("expected cuda:N"));

  std::ifstream in(Fixture("qwen3") + "/golden.json");
  auto golden = nlohmann::json::parse(in);
  const auto& c = golden["cases"][3];
  std::string ids;
  for (int id : c["prompt_ids"]) ids += (ids.empty() ? "" : ",") + std::to_string(id);
  r = Run({"generate", "--device", "cuda", "--model-path", Fixture("qwen3"), "--prompt-ids", ids,
           "--max-tokens", std::to_string(c["output_ids"].size()), "--ignore-eos", "--json"});
  if (r.code != 0) {
    EXPECT_THAT(r.err, HasSubstr("no CUDA device"));
    return;
  }
  EXPECT_EQ(nlohmann::json::parse(r.out)["output_ids"], c["output_ids"]);
  EXPECT_THAT(r.err, HasSubstr("backend cuda"));
}

TEST_F(CliTest, GenerateTextAndChatPrompts) {
  Result r = Run({"generate", "--model-path", Fixture("llama3_rope"), "--prompt", "Hello there",
                  "--max-tokens", "8", "--ignore-eos"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("generated 8 tokens"));
  r = Run({"generate", "--model-path", Fixture("qwen3"), "--chat", "Hi!", "--system", "Be brief.",
           "--max-tokens", "4", "--temperature", "0.8", "--seed", "7", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  auto a = nlohmann::json::parse(r.out);
  r = Run({"generate", "--model-path", Fixture("qwen3"), "--chat", "Hi!", "--system", "Be brief.",
           "--max-tokens", "4", "--temperature", "0.8", "--seed", "7", "--json"});
  auto b = nlohmann::json::parse(r.out);
  EXPECT_EQ(a["output_ids"], b["output_ids"]) << "same seed, same output";
}

TEST_F(CliTest, DemoModelIsUsedWhenNoModelPathAndSaysSo) {
  const std::string env = "STRATA_HOME=" + Quote(tmp_ + "/home");
  Result r =
      Run({"generate", "--prompt", "Once upon a time", "--max-tokens", "6", "--ignore-eos"}, env);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("using the embedded demo model"));
  Result again =
      Run({"generate", "--prompt", "Once upon a time", "--max-tokens", "6", "--ignore-eos"}, env);
  EXPECT_EQ(r.out, again.out) << "greedy and deterministic";
}

TEST_F(CliTest, DemoModelCommandWritesAHuggingFaceDirectory) {
  Result r = Run({"demo-model", "--out", tmp_ + "/demo"});
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json",
                        "tokenizer_config.json", "generation_config.json"})
    EXPECT_TRUE(fs::exists(tmp_ + "/demo/" + f)) << f;
  r = Run({"generate", "--model-path", tmp_ + "/demo", "--prompt-ids", "1,2,3", "--max-tokens", "3",
           "--ignore-eos", "--json"});
  EXPECT_EQ(r.code, 0) << r.err;
}

TEST_F(CliTest, BadModelDirectoriesGiveClearErrorsAndExitCodes) {
  Result r = Run({"generate", "--model-path", tmp_ + "/nope", "--prompt", "x"});
  EXPECT_EQ(r.code, 66);
  EXPECT_THAT(r.err, HasSubstr("does not exist"));

  fs::copy(Fixture("llama_default"), tmp_ + "/m", fs::copy_options::recursive);
  fs::resize_file(tmp_ + "/m/model.safetensors", 4096);
  r = Run({"generate", "--model-path", tmp_ + "/m", "--prompt", "x"});
  EXPECT_EQ(r.code, 65);
  EXPECT_THAT(r.err, HasSubstr("truncated"));
  EXPECT_THAT(r.err, HasSubstr("model.safetensors"));
}

// A checkpoint whose weights are NaN used to load and serve "!!!!" with
// logprob -9999; now a sample of every tensor is checked at load.
TEST_F(CliTest, NanWeightsAreRefusedUnlessTheCheckIsSkipped) {
  fs::copy(Fixture("llama_default"), tmp_ + "/m", fs::copy_options::recursive);
  const std::string file = tmp_ + "/m/model.safetensors";
  const std::string tensor = "model.layers.1.mlp.up_proj.weight";
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    uint8_t len[8];
    f.read(reinterpret_cast<char*>(len), 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
    std::string header(n, '\0');
    f.read(header.data(), static_cast<std::streamsize>(n));
    auto t = nlohmann::json::parse(header).at(tensor);
    ASSERT_EQ(t["dtype"], "BF16");
    const uint64_t begin = t["data_offsets"][0], end = t["data_offsets"][1];
    std::string nans;
    for (uint64_t i = begin; i < end; i += 2) nans += std::string("\xc0\x7f", 2);  // bf16 NaN
    f.seekp(static_cast<std::streamoff>(8 + n + begin));
    f.write(nans.data(), static_cast<std::streamsize>(nans.size()));
    ASSERT_TRUE(f.good());
  }
  Result r = Run({"generate", "--model-path", tmp_ + "/m", "--prompt", "x", "--max-tokens", "2"});
  EXPECT_EQ(r.code, 65) << r.err;
  EXPECT_THAT(r.err, HasSubstr(file + ": tensor '" + tensor + "' has non-finite values: "));
  EXPECT_THAT(r.err, HasSubstr("sampled values are NaN"));
  EXPECT_THAT(r.err, HasSubstr("--skip-weight-check"));

  r = Run({"generate", "--model-path", tmp_ + "/m", "--prompt", "x", "--max-tokens", "2",
           "--ignore-eos", "--skip-weight-check"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("loaded"));

  for (const char* c : {"generate", "serve"}) {
    r = Run({c, "--help"});
    EXPECT_THAT(r.out + r.err, HasSubstr("--skip-weight-check")) << c;
  }
}

// strata check runs the GPU memory plan of a --device cuda line where a GPU
// is visible; where none is (this build machine, CI) it says so and checks
// the rest. A bad --mem-fraction-static is a problem either way.
TEST_F(CliTest, CheckPlansGpuMemoryOrSaysWhyNot) {
  const std::string model = Fixture("llama_default");
  Result r = Run({"check", "--", "--model-path", model, "--device", "cuda", "--port", "0"});
  if (r.out.find("GPU memory of") != std::string::npos) {
    EXPECT_EQ(r.code, 0) << r.out << r.err;  // a GPU is visible: the plan was printed
    EXPECT_THAT(r.out, HasSubstr("KV pool"));
  } else {
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_THAT(r.out, HasSubstr("GPU memory not checked"));
  }
  r = Run({"check", "--", "--model-path", model, "--device", "cuda", "--port", "0",
           "--mem-fraction-static", "1.5"});
  EXPECT_EQ(r.code, 78) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("--mem-fraction-static 1.5"));
  r = Run({"check", "--", "--model-path", model, "--port", "0", "--mem-fraction-static", "0.5"});
  EXPECT_EQ(r.code, 78) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("does nothing with --device cpu"));
}

}  // namespace

// bench engine --batch N decodes N sequences together: its decode rate
// counts all of them over decode-only steps, and the step time is N tokens
// per step at that rate.
TEST_F(CliTest, BenchEngineDecodesABatchTogether) {
  for (int batch : {1, 3}) {
    Result r = Run({"bench", "engine", "--model-path", Fixture("qwen3"), "--prompt-len", "6",
                    "--gen-len", "5", "--repeats", "1", "--batch", std::to_string(batch),
                    "--threads", "2", "--json"});
    ASSERT_EQ(r.code, 0) << r.err;
    auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["batch"], batch);
    const double tok_s = j["decode_tok_s"], step_ms = j["decode_step_ms"];
    ASSERT_GT(tok_s, 0) << r.out;
    EXPECT_NEAR(step_ms, 1e3 * batch / tok_s, 1e-6 * step_ms) << r.out;
    EXPECT_GT(j["prefill_tok_s"].get<double>(), 0) << r.out;
  }
  Result r = Run({"bench", "engine", "--model-path", Fixture("qwen3"), "--batch", "2",
                  "--json-object"});
  EXPECT_EQ(r.code, 64);
  EXPECT_THAT(r.err, HasSubstr("--batch"));
}
