#include "model/demo_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "model/jinja/chat_template.h"
#include "model/hf_config.h"
#include "model/tokenizer/tokenizer.h"
#include "model/weights.h"

namespace strata {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The demo model, written once per test process (it takes a moment, so the
// checks below are grouped into a few tests).
std::string g_root, g_dir;

class DemoModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string tmpl = ::testing::TempDir() + "/demo_model_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    g_root = tmpl;
    g_dir = g_root + "/a/demo";  // parent directories are created too
    Status s = WriteDemoModel(g_dir);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(g_root); }
};

void CheckConfigParses() {
  auto c = LoadModelConfig(g_dir + "/config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->architecture, "LlamaForCausalLM");
  EXPECT_EQ(c->model_type, "llama");
  EXPECT_EQ(c->hidden_size, 256);
  EXPECT_EQ(c->intermediate_size, 768);
  EXPECT_EQ(c->num_hidden_layers, 4);
  EXPECT_EQ(c->num_attention_heads, 8);
  EXPECT_EQ(c->num_key_value_heads, 4);
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_EQ(c->vocab_size, 1024);
  EXPECT_EQ(c->max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(c->rope.theta, 500000.0);
  EXPECT_EQ(c->rope.type, "default");
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->dtype, "bfloat16");
  EXPECT_EQ(c->bos_token_id, 1019);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(1020, 1023));

  auto g =
      ParseGenerationConfig(ReadAll(g_dir + "/generation_config.json"), "generation_config.json");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_THAT(g->eos_token_ids, ElementsAre(1020, 1023));
  EXPECT_EQ(g->bos_token_id, 1019);
}

void CheckWeightsAreExactlyLlamaForCausalLM() {
  auto c = LoadModelConfig(g_dir + "/config.json");
  ASSERT_TRUE(c.ok());
  auto w = WeightStore::Open(g_dir);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const int64_t H = c->hidden_size, I = c->intermediate_size, V = c->vocab_size;
  const int64_t q = c->num_attention_heads * c->head_dim, kv = c->num_key_value_heads * c->head_dim;
  auto get = [&](const std::string& name, std::vector<int64_t> shape) {
    auto t = w->Get(name, shape);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    if (t.ok()) EXPECT_EQ(t->dtype, DType::kBF16) << name;
  };
  get("model.embed_tokens.weight", {V, H});
  for (int i = 0; i < c->num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    get(p + "self_attn.q_proj.weight", {q, H});
    get(p + "self_attn.k_proj.weight", {kv, H});
    get(p + "self_attn.v_proj.weight", {kv, H});
    get(p + "self_attn.o_proj.weight", {H, q});
    get(p + "mlp.gate_proj.weight", {I, H});
    get(p + "mlp.up_proj.weight", {I, H});
    get(p + "mlp.down_proj.weight", {H, I});
    get(p + "input_layernorm.weight", {H});
    get(p + "post_attention_layernorm.weight", {H});
  }
  get("model.norm.weight", {H});
  get("lm_head.weight", {V, H});
  EXPECT_TRUE(w->Unused().empty()) << w->Unused().front();
  EXPECT_EQ(w->size(), 3u + 9u * c->num_hidden_layers);
}

// Mean and standard deviation of a bf16 tensor.
std::pair<double, double> Stats(const WeightInfo& w) {
  const uint16_t* p = static_cast<const uint16_t*>(w.data);
  size_t n = w.nbytes / 2;
  double sum = 0, sq = 0;
  for (size_t i = 0; i < n; ++i) {
    double v = Bf16ToFloat(p[i]);
    sum += v;
    sq += v * v;
  }
  double mean = sum / n;
  return {mean, std::sqrt(sq / n - mean * mean)};
}

void CheckWeightScales() {
  auto w = WeightStore::Open(g_dir);
  ASSERT_TRUE(w.ok());
  auto [m, s] = Stats(*w->Find("model.layers.2.mlp.up_proj.weight"));
  EXPECT_NEAR(m, 0.0, 0.002);
  EXPECT_NEAR(s, 0.1, 0.002);
  std::tie(m, s) = Stats(*w->Find("model.norm.weight"));
  EXPECT_NEAR(m, 1.0, 0.03);
  EXPECT_NEAR(s, 0.1, 0.02);
  // Different tensors get different values.
  EXPECT_NE(std::memcmp(w->Find("model.layers.0.self_attn.k_proj.weight")->data,
                        w->Find("model.layers.0.self_attn.v_proj.weight")->data, 1024),
            0);
}

void CheckTokenizerIsByteLevelBpeLikeLlama3() {
  Json t = Json::parse(ReadAll(g_dir + "/tokenizer.json"));
  ASSERT_EQ(t["model"]["type"], "BPE");
  const Json& vocab = t["model"]["vocab"];
  ASSERT_EQ(vocab.size(), 1019u);
  std::set<int> ids;
  for (const auto& [tok, id] : vocab.items()) ids.insert(id.get<int>());
  EXPECT_EQ(ids.size(), 1019u);
  EXPECT_EQ(*ids.begin(), 0);
  EXPECT_EQ(*ids.rbegin(), 1018);
  // GPT-2 byte alphabet order: '!' first; space is 'Ġ' (U+0120), newline 'Ċ'.
  EXPECT_EQ(vocab["!"], 0);
  EXPECT_TRUE(vocab.contains("\xC4\xA0"));
  EXPECT_TRUE(vocab.contains("\xC4\x8A"));
  // Every merge joins two tokens into a third, all in the vocabulary.
  const Json& merges = t["model"]["merges"];
  ASSERT_GE(merges.size(), 1019u - 256u);
  for (const auto& m : merges) {
    std::string s = m.get<std::string>();
    size_t sp = s.find(' ');
    ASSERT_NE(sp, std::string::npos) << s;
    std::string a = s.substr(0, sp), b = s.substr(sp + 1);
    EXPECT_TRUE(vocab.contains(a)) << s;
    EXPECT_TRUE(vocab.contains(b)) << s;
    EXPECT_TRUE(vocab.contains(a + b)) << s;
  }
  // Frequent words of the training text became single tokens.
  EXPECT_TRUE(vocab.contains("\xC4\xA0the"));
  EXPECT_TRUE(vocab.contains("\xC4\xA0lighthouse"));

  ASSERT_EQ(t["added_tokens"].size(), 5u);
  EXPECT_EQ(t["added_tokens"][0]["content"], "<|begin_of_text|>");
  EXPECT_EQ(t["added_tokens"][0]["id"], 1019);
  EXPECT_EQ(t["added_tokens"][4]["content"], "<|eot_id|>");
  EXPECT_EQ(t["added_tokens"][4]["id"], 1023);
  for (const auto& a : t["added_tokens"]) EXPECT_TRUE(a["special"].get<bool>());

  const Json& pre = t["pre_tokenizer"];
  EXPECT_EQ(pre["type"], "Sequence");
  EXPECT_EQ(pre["pretokenizers"][0]["type"], "Split");
  EXPECT_EQ(pre["pretokenizers"][0]["behavior"], "Isolated");
  EXPECT_THAT(pre["pretokenizers"][0]["pattern"]["Regex"].get<std::string>(),
              HasSubstr("\\p{N}{1,3}"));
  EXPECT_EQ(pre["pretokenizers"][1]["type"], "ByteLevel");
  EXPECT_EQ(pre["pretokenizers"][1]["use_regex"], false);
  EXPECT_EQ(t["decoder"]["type"], "ByteLevel");
  const Json& post = t["post_processor"]["processors"][1];
  EXPECT_EQ(post["type"], "TemplateProcessing");
  EXPECT_EQ(post["special_tokens"]["<|begin_of_text|>"]["ids"][0], 1019);
}

void CheckTokenizerConfigHasChatTemplate() {
  Json tc = Json::parse(ReadAll(g_dir + "/tokenizer_config.json"));
  EXPECT_EQ(tc["bos_token"], "<|begin_of_text|>");
  EXPECT_EQ(tc["eos_token"], "<|eot_id|>");
  std::string tmpl = tc["chat_template"].get<std::string>();
  EXPECT_THAT(tmpl, HasSubstr("<|start_header_id|>"));
  EXPECT_THAT(tmpl, HasSubstr("add_generation_prompt"));
  EXPECT_EQ(tc["added_tokens_decoder"]["1023"]["content"], "<|eot_id|>");
}

// Strata's tokenizer and chat template on the demo model agree with HF
// transformers/tokenizers (tests/fixtures/demo_model/hf_reference.json).
void CheckTokenizerAndChatTemplateMatchHf() {
  Json ref = Json::parse(
      ReadAll(std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/demo_model/hf_reference.json"));
  auto tok = Tokenizer::FromDir(g_dir);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->vocab_size(), 1024);
  EXPECT_EQ((*tok)->bos_id(), 1019);
  for (const auto& e : ref["encodings"]) {
    const std::string text = e["text"].get<std::string>();
    auto ids = (*tok)->Encode(text, true);
    EXPECT_EQ(Json(ids), e["ids"]) << text;
    EXPECT_EQ(Json((*tok)->Encode(text, false)), e["ids_no_special"]) << text;
    std::vector<int32_t> hf_ids = e["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ((*tok)->Decode(hf_ids, false), e["decoded"].get<std::string>()) << text;
    EXPECT_EQ((*tok)->Decode(hf_ids, true), e["decoded_skip_special"].get<std::string>()) << text;
  }

  auto tmpl = ChatTemplate::Parse((*tok)->chat_template());
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().ToString();
  ChatTemplateInputs in;
  in.messages = ref["chat"]["messages"];
  in.add_generation_prompt = true;
  in.bos_token = (*tok)->bos_token();
  in.eos_token = (*tok)->eos_token();
  auto rendered = (*tmpl)->Render(in);
  ASSERT_TRUE(rendered.ok()) << rendered.status().ToString();
  EXPECT_EQ(*rendered, ref["chat"]["rendered"].get<std::string>());
  EXPECT_EQ(Json((*tok)->Encode(*rendered, false)), ref["chat"]["ids"]);
}

uint64_t Fnv1a(const std::string& bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Same bytes on every run and machine: exactly the files HF transformers was
// checked against (tests/fixtures/demo_model/hf_reference.json). If this fails on purpose (the demo
// model changed), regenerate that fixture with tools/reference/check_demo_model.py and update these
// hashes; if it fails on a new machine, generation is not portable and that is a bug.
TEST_F(DemoModelTest, ConfigAndWeights) {
  CheckConfigParses();
  CheckWeightsAreExactlyLlamaForCausalLM();
  CheckWeightScales();
}

TEST_F(DemoModelTest, Tokenizer) {
  CheckTokenizerIsByteLevelBpeLikeLlama3();
  CheckTokenizerConfigHasChatTemplate();
  CheckTokenizerAndChatTemplateMatchHf();
}

TEST_F(DemoModelTest, SameBytesAsTheFilesHfWasCheckedAgainst) {
  EXPECT_EQ(Fnv1a(ReadAll(g_dir + "/model.safetensors")), 0x87a7d6848a9e305dull);
  EXPECT_EQ(Fnv1a(ReadAll(g_dir + "/tokenizer.json")), 0xcffe75d401934737ull);
  EXPECT_EQ(Fnv1a(ReadAll(g_dir + "/config.json")), 0xd3208bad903917e7ull);
  EXPECT_EQ(Fnv1a(ReadAll(g_dir + "/tokenizer_config.json")), 0x1c5032680991346dull);
  EXPECT_EQ(Fnv1a(ReadAll(g_dir + "/generation_config.json")), 0xf6ed36ae66f1792bull);
}

TEST(DemoModelErrorTest, UnwritableDirectory) {
  Status s = WriteDemoModel("/proc/strata-demo-model-cannot-exist");
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("/proc/strata-demo-model-cannot-exist"));
}

}  // namespace
}  // namespace strata
