// Chat templates: turn role/content messages into a prompt string, in one of the fixed formats
// of llama.cpp's llama_chat_apply_template, under llama.cpp's names and with its output byte for
// byte (tests/unit/test_chat_template.cpp checks against llama.cpp's own renderings). No Jinja is
// run: the format is recognised from the model's `tokenizer.chat_template` source by the
// substring rules of llama.cpp's llm_chat_detect_template, in the same order, or given by name.
//
// Where this differs from llama.cpp, on purpose:
//  * ChatML keeps the template's default system prompt: a fixed system message the source writes
//    as one string literal when the conversation has none (SmolLM2, Qwen2.5) goes in front of the
//    conversation. llama.cpp's ChatML ignores it.
//  * A source that llama.cpp reads as a format Switchyard does not render (glmedge, smolvlm, ...),
//    or as none, is not an error: the template is `unsupported`, with the reason. A model loads
//    and serves completions; apply() throws, and callers refuse chat requests for it up front.
//  * A template that drops the thinking of past turns (its source splits assistant content at
//    `</think>`: Qwen3, QwQ, the DeepSeek-R1 distills) has it dropped here too
//    (drops_past_thinking), and a DeepSeek-R1 template whose generation prompt opens the thinking
//    (`<｜Assistant｜><think>\n`) has it opened here too (opens_thinking). DeepSeek-V3.1's template
//    (a deepseek3 source that reads `thinking`) closes the thinking of past turns and, by its
//    switch, opens or closes it after the generation prompt (thinking_switch,
//    closes_past_thinking). llama.cpp's built-in formats do none of these; given by name, ours do
//    none either.
//  * No template at all (an empty source) is ChatML, which is what llama.cpp falls back to when
//    a model has none — except a Gemma 3 file without one (the common conversions carry none),
//    which gets Gemma's turns, the format the model was trained on (source_of).
// The prompt never starts with BOS: the tokenizer adds it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sy::gguf {
class file;
}

namespace sy {

// A call an assistant message made, as the client sends the conversation back.
struct chat_tool_call {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text (the router normalises the client's string)
};

struct chat_message {
  chat_message() = default;
  // {role, content} as before tools (no missing-initializer warnings at the many such sites).
  chat_message(std::string r, std::string c, std::vector<chat_tool_call> calls = {}, std::string call_id = {})
      : role(std::move(r)), content(std::move(c)), tool_calls(std::move(calls)), tool_call_id(std::move(call_id)) {}

  std::string role;  // "system", "user", "assistant", "tool"
  std::string content;
  std::vector<chat_tool_call> tool_calls;  // assistant: the calls it made
  std::string tool_call_id;                // tool: the call this result answers
};

// A function the model may call (OpenAI `tools`, type function).
struct chat_tool {
  std::string name;
  std::string definition;  // {"type":"function","function":{"name",...}} as JSON text
  std::string parameters;  // the function's JSON Schema as JSON text ("" when it has none)
};

// How a family writes tool calls in its output (common/tokenizer/chat_tools.cpp renders tools and past calls
// that way; the router parses generated text back by the same markers):
//   hermes       <tool_call>\n{"name": N, "arguments": {...}}\n</tool_call> (Qwen2.5, SmolLM2 and
//                every format without a convention of its own)
//   llama3_json  {"name": N, "parameters": {...}}, optionally after <|python_tag|> (Llama 3.1+)
//   mistral      [TOOL_CALLS] [{"name": N, "arguments": {...}}, ...]
//   deepseek     <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>N<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...
//                <｜tool▁calls▁end｜> (DeepSeek-V3.1's tokens, the deepseek3 format; the router also
//                reads V3's and R1's call body, function<｜tool▁sep｜>N\n```json\n{...}\n```)
enum class tool_call_style : uint8_t { hermes, llama3_json, mistral, deepseek };
// DeepSeek's tokens around one call and between its name and arguments (the block of calls is
// tool_call_open / tool_call_close).
inline constexpr std::string_view k_deepseek_call_begin = "<｜tool▁call▁begin｜>";
inline constexpr std::string_view k_deepseek_call_end = "<｜tool▁call▁end｜>";
inline constexpr std::string_view k_deepseek_tool_sep = "<｜tool▁sep｜>";

// What each format writes per message (llama.cpp's rendering; `trim` strips ASCII whitespace
// " \t\n\v\f\r" at both ends; "gen" is the generation prompt, written only when asked for):
//   chatml             <|im_start|>ROLE\nCONTENT<|im_end|>\n          gen <|im_start|>assistant\n
//   llama3             <|start_header_id|>ROLE<|end_header_id|>\n\ntrim(CONTENT)<|eot_id|>
//                                                      gen <|start_header_id|>assistant<|end_header_id|>\n\n
//   phi3               <|ROLE|>\nCONTENT<|end|>\n                      gen <|assistant|>\n
//   phi4               <|im_start|>ROLE<|im_sep|>CONTENT<|im_end|> (no newlines; Phi-4 14B)
//                                                                    gen <|im_start|>assistant<|im_sep|>
//   zephyr             <|ROLE|>\nCONTENT<|endoftext|>\n                gen <|assistant|>\n
//   gemma              <start_of_turn>ROLE\ntrim(CONTENT)<end_of_turn>\n, ROLE "model" for the
//                      assistant; system messages are trimmed, joined and put in front of the next
//                      non-assistant message's content with "\n\n"          gen <start_of_turn>model\n
//   mistral-v7         [SYSTEM_PROMPT] S[/SYSTEM_PROMPT], [INST] U[/INST], " A</s>"; -tekken: no
//                      spaces; no generation prompt (the prompt ends in [/INST])
//   mistral-v1/v3/v3-tekken  turns open with " [INST] " / "[INST] " / "[INST]"; system "S\n\n",
//                      user "U [/INST]" / "U[/INST]", assistant " A</s>" / " trim(A)</s>" / "A</s>"
//                      closes the turn; no generation prompt
//   llama2 (and -sys, -sys-bos, -sys-strip)  "[INST] " first; user "U [/INST]", assistant "A</s>"
//                      closes the turn, the next opens with "[INST] " (-sys-bos: "<s>[INST] ");
//                      system "S\n" (llama2) or "<<SYS>>\nS\n<</SYS>>\n\n"; -sys-strip trims
//                      every content; no generation prompt
//   deepseek3          system "S\n\n", user <｜User｜>U, assistant <｜Assistant｜>A<｜end▁of▁sentence｜>
//                      (other roles are not written)                  gen <｜Assistant｜>
//                      (DeepSeek-V3.1: assistant <｜Assistant｜></think>A..., gen <｜Assistant｜></think>
//                      or, thinking, <｜Assistant｜><think>; see closes_past_thinking)
enum class chat_format {
  unsupported,  // recognised as none of the formats below (see chat_template::unsupported_reason)
  chatml,
  llama3,
  llama2,
  llama2_sys,
  llama2_sys_bos,
  llama2_sys_strip,
  mistral_v1,
  mistral_v3,
  mistral_v3_tekken,
  mistral_v7,
  mistral_v7_tekken,
  phi3,
  phi4,
  zephyr,
  gemma,
  deepseek3,
};

// llama.cpp's name of a format ("chatml", "mistral-v3-tekken", ...); "" for unsupported.
std::string_view chat_format_name(chat_format f);
// The format of a name; nullopt for any other string.
std::optional<chat_format> chat_format_from_name(std::string_view name);
// Every name, comma-separated, for messages that tell an operator what to pass.
std::string chat_format_names();

tool_call_style tool_style(chat_format f);
// What opens a call in the style's output: "<tool_call>", "<|python_tag|>", "[TOOL_CALLS]",
// "<｜tool▁calls▁begin｜>".
std::string_view tool_call_open(tool_call_style s);
// What closes one ("</tool_call>", "<｜tool▁calls▁end｜>"; "" where a call runs to the end of the
// text).
std::string_view tool_call_close(tool_call_style s);

// The conversation with `tools`, tool results (role "tool") and past calls (assistant tool_calls)
// written as the format's convention has them, into messages the plain renderers take: for
// hermes, the tool list in the system message, calls in the assistant's text and results in a
// user turn; for llama3, the list in the first user message and results as role "ipython"; for
// mistral, [AVAILABLE_TOOLS] before the last user turn and [TOOL_RESULTS] blocks; for deepseek,
// the list in the system message, calls in DeepSeek's tokens after the assistant's text and
// results as <｜tool▁output▁begin｜>...<｜tool▁output▁end｜> right after the calling turn. An
// empty role marks text written verbatim (the mistral and deepseek3 renderers only; clients
// cannot send an empty role).
std::vector<chat_message> with_tools(chat_format f, std::string_view default_system,
                                     const std::vector<chat_message>& messages, const std::vector<chat_tool>& tools);

struct chat_template {
  chat_format format = chat_format::chatml;
  // ChatML only: inserted as the first message when the conversation does not start with a
  // system message (SmolLM2's template does this); empty for none.
  std::string default_system;
  // Why the template cannot be applied, when format is unsupported; else empty.
  std::string unsupported_reason;
  // The source switches thinking by a template variable (apply's `thinking`):
  //  * ChatML: it reads `enable_thinking` (Qwen3). With the switch off, the generation prompt
  //    ends in an empty thinking block, "<think>\n\n</think>\n\n", as Qwen3's template writes it;
  //    on (its default), nothing is added and the model thinks first.
  //  * deepseek3: it reads `thinking` (DeepSeek-V3.1, recognised by the line llama.cpp's chat
  //    handlers pick it by: `message['prefix'] is defined and message['prefix'] and thinking`).
  //    The generation prompt is `<｜Assistant｜><think>` with the switch on and
  //    `<｜Assistant｜></think>` with it off (its default).
  bool thinking_switch = false;
  // ChatML and deepseek3: the source splits assistant content at `</think>` and keeps what
  // follows, `split('</think>')` (Qwen3, QwQ, the DeepSeek-R1 distills). In ChatML assistant turns
  // are then written as Qwen3's template writes them: up to the last user query (a user turn that
  // is not only a <tool_response>) the answer after the last `</think>` alone, leading newlines
  // dropped; later, "<think>\nREASONING\n</think>\n\nANSWER" for the last message or a turn with
  // reasoning, the answer alone otherwise (docs/worker.md). In deepseek3 every assistant turn
  // loses everything up to its last `</think>`, the rest as it is (R1's
  // `content.split('</think>')[-1]`). Reasoning a client sends in a separate field
  // (`reasoning_content`) is never rendered.
  bool drops_past_thinking = false;
  // deepseek3 only: the source's generation prompt is `<｜Assistant｜><think>\n` (the R1
  // distills' newer template): the prompt ends in an open thinking block, and the output holds
  // only its `</think>`.
  bool opens_thinking = false;
  // deepseek3 only (DeepSeek-V3.1, with thinking_switch): every past assistant turn is written
  // `<｜Assistant｜></think>` + its content after the first `</think>` (the whole content where
  // it has none; the template's `content.split('</think>', 1)[1]`) + `<｜end▁of▁sentence｜>`.
  bool closes_past_thinking = false;

  bool supported() const { return format != chat_format::unsupported; }

  // A format name ("llama3") or a Jinja source (recognised by content); "" is ChatML. Never
  // throws: a source that is not recognised gives an unsupported template. Routers parse what a
  // worker's welcome carries with this, workers the model's metadata.
  static chat_template parse(std::string_view name_or_jinja);
  // What parse() takes for a model file: its `tokenizer.chat_template`; without one, "gemma" for
  // a Gemma 3 file, else "" (ChatML). Workers send routers this.
  static std::string source_of(const gguf::file& f);
  // parse(source_of(f)).
  static chat_template from_gguf(const gguf::file& f);

  // The operator's --chat-template value: a format name, or the path of a Jinja file. Returns
  // what parse() takes to rebuild that template (the name, or the file's text), which is also
  // what a worker sends routers. Throws std::invalid_argument, with a message listing the names,
  // for anything else: an unknown name that is no readable file, an empty file, a file whose
  // template is unsupported.
  static std::string read_option(const std::string& name_or_path);

  // The prompt, ending with the assistant header when `add_generation_prompt` and the format has
  // one. Throws std::runtime_error (with the reason) when the template is unsupported.
  // `tools`: the functions the model may call, rendered per with_tools (also used whenever a
  // message carries tool calls or is a tool result).
  // `thinking`: the request's thinking switch (chat_template_kwargs `thinking` or
  // `enable_thinking`), honoured where thinking_switch; nullopt: not given, the template's own
  // default (Qwen3 on, DeepSeek-V3.1 off).
  std::string apply(const std::vector<chat_message>& messages, bool add_generation_prompt = true,
                    const std::vector<chat_tool>& tools = {}, std::optional<bool> thinking = std::nullopt) const;

  // A Jinja template that renders exactly what apply() renders (for a Hugging Face tokenizer
  // folder: switchyard-worker export-tokenizer), starting with `{{ bos_token }}` when `with_bos`
  // (the tokenizer adds BOS in front of apply()'s text; Hugging Face's apply_chat_template does
  // not). Throws std::runtime_error when the template is unsupported.
  std::string to_jinja(bool with_bos) const;
};

}  // namespace sy
