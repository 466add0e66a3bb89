#include "model/model_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/demo_model.h"

namespace strata {
namespace fs = std::filesystem;

namespace {

bool Exists(const std::string& p) { return fs::exists(p); }

StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return IoError(path + ": read failed");
  return ss.str();
}

Status CheckDir(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return NotFound("model directory " + dir + " does not exist");
  if (!fs::is_directory(dir, ec))
    return InvalidArgument("--model-path " + dir +
                           " is not a directory (give the folder that holds config.json)");
  if (!Exists(dir + "/config.json"))
    return NotFound(dir + "/config.json is missing: not a Hugging Face model directory");
  return OkStatus();
}

// chat_template.jinja wins (transformers >= 5); else tokenizer_config.json's
// "chat_template", a string or a list of {name, template} (use "default").
StatusOr<std::string> FindChatTemplate(const std::string& dir) {
  if (Exists(dir + "/chat_template.jinja")) return ReadFile(dir + "/chat_template.jinja");
  const std::string tc = dir + "/tokenizer_config.json";
  if (!Exists(tc)) return std::string();
  ASSIGN_OR_RETURN(std::string text, ReadFile(tc));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument(tc + ": not a JSON object");
  auto it = j.find("chat_template");
  if (it == j.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (auto& e : *it)
      if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
          e["template"].is_string())
        return e["template"].get<std::string>();
    return InvalidArgument(tc + ": chat_template is a list without a 'default' entry");
  }
  return InvalidArgument(tc + ": chat_template must be a string or a list of {name, template}");
}

}  // namespace

StatusOr<ModelConfig> ReadModelConfig(const std::string& dir) {
  RETURN_IF_ERROR(CheckDir(dir));
  return LoadModelConfig(dir + "/config.json");
}

StatusOr<std::unique_ptr<LoadedModel>> LoadModelDir(const std::string& dir, Backend& backend,
                                                    const LoadOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  auto m = std::make_unique<LoadedModel>();
  m->dir = dir;
  ASSIGN_OR_RETURN(m->config, ReadModelConfig(dir));
  ModelFactory factory = FindArchitecture(m->config.architecture);
  if (!factory) {
    std::string list;
    for (auto& a : SupportedArchitectures()) list += (list.empty() ? "" : ", ") + a;
    return Unimplemented(dir + "/config.json: architecture '" + m->config.architecture +
                         "' is not supported (supported: " + list + ")");
  }
  if (!Exists(dir + "/tokenizer.json"))
    return NotFound(dir +
                    "/tokenizer.json is missing (Strata needs the fast-tokenizer file; "
                    "convert a slow tokenizer with transformers' save_pretrained)");
  ASSIGN_OR_RETURN(m->tokenizer, Tokenizer::FromDir(dir));
  if (m->tokenizer->vocab_size() > m->config.vocab_size)
    return InvalidArgument(
        dir + "/tokenizer.json: tokenizer has " + std::to_string(m->tokenizer->vocab_size()) +
        " tokens but config.json vocab_size is " + std::to_string(m->config.vocab_size) +
        ": token ids past the embedding table would be out of range "
        "(tokenizer and weights are from different models?)");
  ASSIGN_OR_RETURN(m->chat_template_source, FindChatTemplate(dir));
  if (!m->chat_template_source.empty()) {
    auto tmpl = ChatTemplate::Parse(m->chat_template_source);
    if (!tmpl.ok()) return tmpl.status().Annotate(dir + ": chat template");
    m->chat_template = *tmpl;
  }
  if (Exists(dir + "/generation_config.json")) {
    ASSIGN_OR_RETURN(std::string text, ReadFile(dir + "/generation_config.json"));
    ASSIGN_OR_RETURN(m->generation, ParseGenerationConfig(text, dir + "/generation_config.json"));
  }
  for (int64_t id : m->generation.eos_token_ids)
    m->eos_token_ids.push_back(static_cast<int32_t>(id));
  for (int64_t id : m->config.eos_token_ids) {
    bool seen = false;
    for (int32_t e : m->eos_token_ids) seen |= e == id;
    if (!seen) m->eos_token_ids.push_back(static_cast<int32_t>(id));
  }
  if (m->eos_token_ids.empty() && m->tokenizer->eos_id())
    m->eos_token_ids.push_back(*m->tokenizer->eos_id());

  ASSIGN_OR_RETURN(m->weights, WeightStore::Open(dir));
  m->weight_bytes = m->weights.total_bytes();
  ASSIGN_OR_RETURN(m->model, factory(m->config, m->weights, backend, options.model));

  if (options.prefault_weights) {
    // Touch every page now so the first request does not pay for disk reads,
    // and so the load time reported is the real one.
    size_t done = 0, total = m->weight_bytes;
    const long page = sysconf(_SC_PAGESIZE);
    unsigned char sink = 0;
    size_t next_report = 0;
    for (auto& [name, info] : m->weights.tensors()) {
      const unsigned char* p = static_cast<const unsigned char*>(info.data);
      for (size_t off = 0; off < info.nbytes; off += page) sink ^= p[off];
      done += info.nbytes;
      if (options.progress && done >= next_report) {
        options.progress(done, total);
        next_report = done + total / 100;
      }
    }
    if (options.progress) options.progress(total, total);
    // Keep the reads: the compiler may not drop loads whose result escapes.
    asm volatile("" : : "r"(sink) : "memory");
  }
  // After the prefault, so the samples read resident pages and the check
  // costs only its few thousand loads per tensor.
  if (options.check_weights) RETURN_IF_ERROR(CheckWeightsFinite(m->weights));
  m->load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return m;
}

StatusOr<std::string> EnsureDemoModel() {
  std::string base;
  if (const char* h = std::getenv("STRATA_HOME"); h && *h)
    base = h;
  else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    base = std::string(x) + "/strata";
  else if (const char* home = std::getenv("HOME"); home && *home)
    base = std::string(home) + "/.cache/strata";
  else
    base = "/tmp/strata";
  const std::string dir = base + "/demo-model-v" STRATA_VERSION;
  if (Exists(dir + "/config.json")) return dir;
  std::error_code ec;
  fs::create_directories(base, ec);
  if (ec) return IoError("cannot create " + base + ": " + ec.message());
  // Write to a temporary sibling, then rename: concurrent starts never see a
  // half-written model.
  const std::string tmp = dir + ".tmp." + std::to_string(getpid());
  fs::remove_all(tmp, ec);
  RETURN_IF_ERROR(WriteDemoModel(tmp));
  fs::rename(tmp, dir, ec);
  if (ec) {
    fs::remove_all(tmp, ec);
    if (Exists(dir + "/config.json")) return dir;  // another process won the race
    return IoError("cannot move demo model into " + dir);
  }
  return dir;
}

}  // namespace strata
