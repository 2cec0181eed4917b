// Chat templates: turn role/content messages into a prompt string. The format is chosen from
// the model's `tokenizer.chat_template` metadata; ChatML is the one implemented so far.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace sy::gguf {
class file;
}

namespace sy {

struct chat_message {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

enum class chat_format { chatml };

struct chat_template {
  chat_format format = chat_format::chatml;
  // Inserted as the first message when the conversation has no system message
  // (SmolLM2's template does this); empty for none.
  std::string default_system;

  // Throws std::runtime_error when the metadata names a template we cannot render.
  static chat_template from_gguf(const gguf::file& f);
  static chat_template from_jinja(std::string_view jinja_source);

  // The prompt, ending with the assistant header when `add_generation_prompt`.
  std::string apply(const std::vector<chat_message>& messages, bool add_generation_prompt = true) const;
};

}  // namespace sy
