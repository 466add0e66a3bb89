// The embedded demo model: a small Llama-architecture model with
// deterministic random weights and a byte-level BPE tokenizer, written in
// real Hugging Face format so every code path that loads a downloaded model
// runs on it too.
#pragma once

#include <string>

#include "util/status.h"

namespace strata {

// Writes config.json, model.safetensors, tokenizer.json,
// tokenizer_config.json and generation_config.json into `dir` (created if
// needed). Deterministic: the same bytes on every run and machine.
Status WriteDemoModel(const std::string& dir);

}  // namespace strata
