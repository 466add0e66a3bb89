// strata generate: offline generation on the backend --device names (CPU by default).
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "engine/engine.h"

namespace strata::cli {
namespace {

StatusOr<std::vector<int32_t>> ParseIds(const std::string& s, const std::string& flag) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b == std::string::npos) continue;
    item = item.substr(b, e - b + 1);
    char* end = nullptr;
    long v = std::strtol(item.c_str(), &end, 10);
    if (*end != '\0' || v < 0 || v > INT32_MAX)
      return InvalidArgument("--" + flag + ": '" + item + "' is not a token id (non-negative integer)");
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

}  // namespace

int GenerateCommand(const Args& args) {
  const std::string cmd = "generate";
  ModelFlags mf;
  std::string prompt, prompt_ids, chat, system, stop_ids, kv_dtype = "auto", thinking;
  int64_t max_tokens = 64, top_k = -1, logprobs = -1, seed = -1, page_size = 16,
          max_total_tokens = 0;
  double temperature = 0, top_p = 1, min_p = 0, rep = 1, freq = 0, pres = 0;
  bool ignore_eos = false, json = false, skip_special = true;
  FlagSet f(cmd,
            "Generates a continuation of one prompt: text (--prompt), token ids (--prompt-ids) "
            "or a chat message rendered through the model's chat template (--chat). Text streams "
            "to stdout; timings go to stderr. Greedy unless --temperature > 0.");
  mf.Register(f);
  f.String("prompt", &prompt, "prompt text (tokenized with the model's special tokens, e.g. BOS)");
  f.String("prompt-ids", &prompt_ids, "prompt as comma-separated token ids, e.g. 1,2,3");
  f.String("chat", &chat, "a user message, rendered with the model's chat template");
  f.String("system", &system, "system message for --chat");
  f.String("enable-thinking", &thinking, "true/false: chat_template_kwargs.enable_thinking for --chat");
  f.Int("max-tokens", &max_tokens, "tokens to generate at most", 0, 1 << 24);
  f.Double("temperature", &temperature, "sampling temperature; 0 = greedy", 0, 100);
  f.Double("top-p", &top_p, "nucleus sampling mass", 1e-9, 1);
  f.Int("top-k", &top_k, "keep the k most likely tokens (-1: off)", -1, 1 << 30);
  f.Double("min-p", &min_p, "drop tokens below min_p x the top probability", 0, 1);
  f.Double("repetition-penalty", &rep, "HF repetition penalty over prompt and output (1: off)", 1e-6, 100);
  f.Double("frequency-penalty", &freq, "OpenAI frequency penalty", -2, 2);
  f.Double("presence-penalty", &pres, "OpenAI presence penalty", -2, 2);
  f.Int("seed", &seed, "random seed (-1: random)", -1, INT64_MAX);
  f.String("stop-token-ids", &stop_ids, "comma-separated token ids that end generation");
  f.Bool("ignore-eos", &ignore_eos, "keep generating past end-of-sequence tokens");
  f.Int("logprobs", &logprobs, "report the sampled token's logprob and this many alternatives (-1: off)", -1, kMaxLogprobs);
  f.Bool("json", &json, "print one JSON object with ids, text, logprobs and usage instead of streaming text");
  f.Bool("skip-special-tokens", &skip_special, "leave special tokens out of the text");
  f.Int("page-size", &page_size, "tokens per KV page", 1, 4096);
  f.Int("max-total-tokens", &max_total_tokens, "KV pool size in tokens (0: automatic)", 0, INT64_MAX);
  f.String("kv-cache-dtype", &kv_dtype,
           "KV page element type: f32, bf16, f16 or auto (bf16 on a GPU under bf16 matmul, f32 on "
           "the CPU)");
  Status st = f.Parse(args);
  if (!st.ok()) return UsageError(cmd, st);
  if (f.help_requested()) {
    std::printf("%s", f.Help().c_str());
    return kExitOk;
  }
  const int given = !prompt.empty() + !prompt_ids.empty() + !chat.empty();
  if (given != 1)
    return UsageError(cmd, InvalidArgument("give exactly one of --prompt, --prompt-ids, --chat"));
  auto kv_or = ParseKvCacheDtype(kv_dtype, mf);
  if (!kv_or.ok()) return UsageError(cmd, kv_or.status());
  const DType kv = *kv_or;

  SamplingParams sp;
  sp.temperature = static_cast<float>(temperature);
  sp.top_p = static_cast<float>(top_p);
  sp.top_k = static_cast<int>(top_k);
  sp.min_p = static_cast<float>(min_p);
  sp.repetition_penalty = static_cast<float>(rep);
  sp.frequency_penalty = static_cast<float>(freq);
  sp.presence_penalty = static_cast<float>(pres);
  if (seed >= 0) sp.seed = static_cast<uint64_t>(seed);
  sp.ignore_eos = ignore_eos;
  sp.logprobs = static_cast<int>(logprobs);
  sp.max_tokens = static_cast<int>(max_tokens);
  if (!stop_ids.empty()) {
    auto ids = ParseIds(stop_ids, "stop-token-ids");
    if (!ids.ok()) return UsageError(cmd, ids.status());
    sp.stop_token_ids = *ids;
  }
  if (Status v = sp.Validate(); !v.ok()) return UsageError(cmd, v);

  auto stack = LoadForCli(cmd, mf);
  if (!stack.ok()) return Fail(cmd, stack.status());
  LoadedModel& m = *stack->model;

  GenerationRequest req;
  req.params = sp;
  if (!prompt_ids.empty()) {
    auto ids = ParseIds(prompt_ids, "prompt-ids");
    if (!ids.ok()) return UsageError(cmd, ids.status());
    req.prompt = *ids;
  } else if (!prompt.empty()) {
    req.prompt = m.tokenizer->Encode(prompt, /*add_special_tokens=*/true);
  } else {
    if (!m.chat_template)
      return Fail(cmd, FailedPrecondition(m.dir + " has no chat template (chat_template.jinja or "
                                                  "tokenizer_config.json chat_template); use --prompt"));
    ChatTemplateInputs in;
    if (!system.empty()) in.messages.push_back({{"role", "system"}, {"content", system}});
    in.messages.push_back({{"role", "user"}, {"content", chat}});
    in.add_generation_prompt = true;
    in.bos_token = m.tokenizer->bos_token();
    in.eos_token = m.tokenizer->eos_token();
    if (!thinking.empty()) in.extra["enable_thinking"] = thinking == "true" || thinking == "1";
    auto text = m.chat_template->Render(in);
    if (!text.ok()) return Fail(cmd, text.status());
    // As transformers' apply_chat_template(tokenize=True): the template
    // already wrote the special tokens.
    req.prompt = m.tokenizer->Encode(*text, /*add_special_tokens=*/false);
  }

  IncrementalDecoder detok(m.tokenizer, skip_special);
  if (!json) {
    req.on_token = [&](const StepOutput& o) {
      std::string piece = detok.Add(o.token);
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    };
  }
  EngineOptions eo;
  eo.page_size = static_cast<int32_t>(page_size);
  eo.max_total_tokens = max_total_tokens;
  eo.max_running_requests = 1;
  eo.chunked_prefill_size = static_cast<int32_t>(mf.max_batch_tokens);
  eo.step_recording.enabled = mf.decode_graphs;
  eo.kv_dtype = kv;
  auto engine = Engine::Create(m, *stack->backend, eo);
  if (!engine.ok()) return Fail(cmd, engine.status());
  std::vector<GenerationRequest> reqs;
  const std::vector<int32_t> prompt_copy = req.prompt;
  reqs.push_back(std::move(req));
  auto results = (*engine)->Generate(std::move(reqs));
  if (!results.ok()) return Fail(cmd, results.status());
  const GenerationResult& r = (*results)[0];
  if (!json) {
    std::string rest = detok.Flush();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
    std::printf("\n");
  } else {
    nlohmann::json j;
    j["prompt_ids"] = prompt_copy;
    j["output_ids"] = r.output;
    j["text"] = m.tokenizer->Decode(r.output, skip_special);
    j["finish_reason"] = FinishReasonName(r.finish_reason);
    if (logprobs >= 0) {
      nlohmann::json lps = nlohmann::json::array();
      for (const StepOutput& s : r.steps) {
        nlohmann::json top = nlohmann::json::array();
        for (const TokenLogprob& t : s.top_logprobs) top.push_back({t.token_id, t.logprob});
        lps.push_back({{"token", s.token}, {"logprob", s.logprob}, {"top", top}});
      }
      j["logprobs"] = lps;
    }
    j["usage"] = {{"prompt_tokens", r.prompt_tokens},
                  {"completion_tokens", r.output.size()},
                  {"total_tokens", r.prompt_tokens + static_cast<int64_t>(r.output.size())}};
    std::printf("%s\n", j.dump().c_str());
  }
  const EngineStats& es = (*engine)->stats();
  std::fprintf(stderr,
               "strata generate: prompt %ld tokens (prefill %.1f tok/s), generated %zu tokens "
               "(decode %.1f tok/s), finish_reason %s\n",
               static_cast<long>(r.prompt_tokens),
               es.prefill_seconds > 0 ? es.prefill_tokens / es.prefill_seconds : 0.0, r.output.size(),
               es.decode_seconds > 0 ? es.decode_tokens / es.decode_seconds : 0.0,
               FinishReasonName(r.finish_reason));
  return kExitOk;
}

}  // namespace strata::cli
