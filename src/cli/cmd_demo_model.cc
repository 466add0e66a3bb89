// strata demo-model: write the embedded demo model to a directory.
#include <cstdio>

#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "model/demo_model.h"

namespace strata::cli {

int DemoModelCommand(const Args& args) {
  const std::string cmd = "demo-model";
  std::string out;
  FlagSet f(cmd,
            "Writes the embedded demo model — a small LlamaForCausalLM with deterministic random "
            "bf16 weights and a byte-level BPE tokenizer — as a Hugging Face model directory "
            "(config.json, model.safetensors, tokenizer.json, tokenizer_config.json, "
            "generation_config.json) that transformers can load too.");
  f.String("out", &out, "directory to write (created if missing)");
  Status st = f.Parse(args);
  if (!st.ok()) return UsageError(cmd, st);
  if (f.help_requested()) {
    std::printf("%s", f.Help().c_str());
    return kExitOk;
  }
  if (out.empty()) return UsageError(cmd, InvalidArgument("--out DIR is required"));
  st = WriteDemoModel(out);
  if (!st.ok()) return Fail(cmd, st);
  std::fprintf(stderr, "strata demo-model: wrote %s\n", out.c_str());
  return kExitOk;
}

}  // namespace strata::cli
