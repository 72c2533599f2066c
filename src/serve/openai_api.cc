#include "serve/openai_api.h"

#include <fmt/chrono.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "structured/compiler.h"

namespace sy::serve {
namespace {

using json = nlohmann::ordered_json;

std::string ErrorType(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 404:
      return "not_found_error";
    case 413:
      return "invalid_request_error";
    case 429:
      return "rate_limit_error";
    case 503:
      return "service_unavailable";
    default:
      return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

ApiError Invalid(const std::string& param, const std::string& message) {
  return InvalidField(param, message);
}

// Typed field readers: absent (or null) keeps the default; a wrong type or range is an error
// naming the field.
struct Reader {
  const json& body;
  std::optional<ApiError> error;

  const json* Get(const char* key) {
    auto it = body.find(key);
    return it == body.end() || it->is_null() ? nullptr : &*it;
  }
  void Fail(const char* key, const std::string& message) {
    if (!error) error = Invalid(key, message);
  }
  void Number(const char* key, double* out, double lo, double hi) {
    const json* v = Get(key);
    if (!v) return;
    if (!v->is_number()) return Fail(key, "must be a number");
    const double x = v->get<double>();
    if (!(x >= lo && x <= hi))
      return Fail(key, fmt::format("must be in [{}, {}], got {}", lo, hi, x));
    *out = x;
  }
  void Integer(const char* key, int64_t* out, int64_t lo, int64_t hi) {
    const json* v = Get(key);
    if (!v) return;
    if (!v->is_number_integer()) return Fail(key, "must be an integer");
    const int64_t x = v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX)
                          ? INT64_MAX
                          : v->get<int64_t>();
    if (x < lo || x > hi) return Fail(key, fmt::format("must be in [{}, {}], got {}", lo, hi, x));
    *out = x;
  }
  void Bool(const char* key, bool* out) {
    const json* v = Get(key);
    if (!v) return;
    if (!v->is_boolean()) return Fail(key, "must be true or false");
    *out = v->get<bool>();
  }
  void TokenList(const char* key, std::vector<int32_t>* out, int64_t vocab) {
    const json* v = Get(key);
    if (!v) return;
    if (!v->is_array()) return Fail(key, "must be a list of token ids");
    for (size_t i = 0; i < v->size(); ++i) {
      const json& t = (*v)[i];
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab)
        return Fail(key, fmt::format("[{}] is not a token id in [0, {})", i, vocab));
      out->push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
  }
};

// Parameters vLLM knows that would change the output and that this server does not implement:
// refused by name rather than ignored (names nobody knows are ignored, as vLLM does).
void RefuseUnimplemented(Reader& r, Endpoint endpoint) {
  for (const char* name : {"guided_whitespace_pattern", "logits_processors"})
    if (r.Get(name)) r.Fail(name, "is not supported");
  if (endpoint != Endpoint::kChat) {
    for (const char* name : {"tools", "tool_choice"})
      if (r.Get(name)) r.Fail(name, "is for chat completions");
    return;
  }
  if (const json* echo = r.Get("echo"); echo && *echo != false)
    r.Fail("echo", "is not supported for chat");
}

// Structured output: OpenAI's response_format (json_object, json_schema), vLLM's
// structured_outputs (json, regex, choice, grammar) and its older guided_json, guided_regex,
// guided_choice and guided_grammar — at most one of them. The grammar is compiled here (without
// a vocabulary) so a bad schema, regex or grammar is a 400 naming the problem; the engine compiles
// it again against its vocabulary (cached by text) and enforces it.
void ReadStructuredOutput(Reader& r, GenerationPlan& plan) {
  using Kind = structured::GrammarSpec::Kind;
  std::optional<structured::GrammarSpec> spec;
  std::string field;
  auto take = [&](const std::string& name, Kind kind, const json& value) {
    if (spec) {
      r.Fail(name.c_str(), fmt::format("only one structured output constraint may be given "
                                       "(also {})",
                                       field));
      return;
    }
    field = name;
    spec = structured::GrammarSpec{kind, "", {}, ""};
    if (kind == Kind::kJsonSchema) {
      if (!value.is_object() && !value.is_boolean() && !value.is_string())
        return r.Fail(name.c_str(), "must be a JSON schema (an object)");
      spec->text = value.is_string() ? value.get<std::string>() : DumpJson(value);
    } else if (kind == Kind::kChoice) {
      if (!value.is_array() || value.empty())
        return r.Fail(name.c_str(), "must be a non-empty list of strings");
      for (const auto& c : value) {
        if (!c.is_string()) return r.Fail(name.c_str(), "must be a non-empty list of strings");
        spec->choices.push_back(c.get<std::string>());
      }
    } else if (kind != Kind::kJsonObject) {
      if (!value.is_string()) return r.Fail(name.c_str(), "must be a string");
      spec->text = value.get<std::string>();
    }
  };
  if (const json* format = r.Get("response_format")) {
    const json type = format->is_object() ? format->value("type", json()) : json();
    if (type == "json_object") {
      take("response_format", Kind::kJsonObject, json());
    } else if (type == "json_schema") {
      const json* schema = nullptr;
      if (auto it = format->find("json_schema"); it != format->end() && it->is_object())
        if (auto s = it->find("schema"); s != it->end()) schema = &*s;
      if (!schema) {
        r.Fail("response_format",
               "json_schema needs {\"json_schema\": {\"name\": ..., "
               "\"schema\": {...}}}");
      } else {
        take("response_format", Kind::kJsonSchema, *schema);
      }
    } else if (type != "text") {
      r.Fail("response_format", "type must be \"text\", \"json_object\" or \"json_schema\"");
    }
  }
  if (const json* so = r.Get("structured_outputs")) {
    if (!so->is_object()) return r.Fail("structured_outputs", "must be an object");
    for (const auto& [key, value] : so->items()) {
      if (value.is_null()) continue;
      if (key == "json") {
        take("structured_outputs.json", Kind::kJsonSchema, value);
      } else if (key == "regex") {
        take("structured_outputs.regex", Kind::kRegex, value);
      } else if (key == "choice") {
        take("structured_outputs.choice", Kind::kChoice, value);
      } else if (key == "grammar") {
        take("structured_outputs.grammar", Kind::kGbnf, value);
      } else if (key == "json_object") {
        if (value != true) return r.Fail("structured_outputs", "json_object must be true");
        take("structured_outputs.json_object", Kind::kJsonObject, value);
      } else if (key == "disable_fallback") {
        // a backend hint; there is one backend
      } else if ((key == "disable_any_whitespace" || key == "disable_additional_properties") &&
                 value == false) {
        // the defaults
      } else {
        return r.Fail("structured_outputs", fmt::format("'{}' is not supported", key));
      }
    }
  }
  const std::pair<const char*, Kind> guided[] = {{"guided_json", Kind::kJsonSchema},
                                                 {"guided_regex", Kind::kRegex},
                                                 {"guided_choice", Kind::kChoice},
                                                 {"guided_grammar", Kind::kGbnf}};
  for (const auto& [name, kind] : guided)
    if (const json* v = r.Get(name)) take(name, kind, *v);
  if (!spec || r.error) return;
  if (plan.params.ignore_eos)
    return r.Fail("ignore_eos", "cannot be combined with structured output");
  if (Status s = structured::CheckCompiles(*spec); !s.ok())
    return r.Fail(field.c_str(), s.message());
  plan.params.grammar = std::move(spec);
}

// Chat: tools, tool_choice and parallel_tool_calls (chat_output/tool_choice.h). A forced call
// (required, named) becomes the request's grammar; the tools are rendered into the prompt.
// `rendered_tools` holds what options.tools points to.
bool ReadTools(Reader& r, GenerationPlan& plan, const ServingLimits& limits, ChatOptions& options,
               json& rendered_tools, ApiError* error) {
  const json* tools = r.Get("tools");
  const json* choice = r.Get("tool_choice");
  if (!tools && !choice) return true;
  if (!limits.tool_format) {
    *error = Invalid(tools ? "tools" : "tool_choice",
                     "tool calling needs a chat template with a tool-call format");
    return false;
  }
  auto read = chat_output::ReadToolRequest(tools, choice, r.Get("parallel_tool_calls"),
                                           *limits.tool_format, limits.auto_tool_choice);
  if (read.error) {
    *error = Invalid(read.error->param, read.error->message);
    return false;
  }
  plan.tools = std::move(read.request);
  if (!plan.tools) return true;
  if (plan.tools->grammar) {
    // A forced call leaves no answer for a structured output constraint to shape: the call's
    // grammar applies (vLLM's precedence too). Agent frameworks send both — a typed final output
    // with tool_choice "required" on the turns that must call.
    plan.params.grammar = plan.tools->grammar;
  } else if (plan.params.grammar) {
    if (auto either =
            chat_output::AnswerOrCalls(*limits.tool_format, *plan.tools, *plan.params.grammar))
      plan.params.grammar = std::move(either);
  }
  const bool excluded = plan.tools->choice == chat_output::ToolChoice::kNone &&
                        limits.exclude_tools_when_tool_choice_none;
  if (!plan.tools->functions.empty() && !excluded) {
    rendered_tools = chat_output::ToolsForTemplate(*tools, limits.sort_tool_keys);
    options.tools = &rendered_tools;
  }
  if (plan.tools->parse()) {
    plan.output.tool_format = limits.tool_format;
    plan.output.max_calls = plan.tools->max_calls();
  }
  return true;
}

// The chat-template fields a chat request and /tokenize share: add_generation_prompt,
// continue_final_message and chat_template_kwargs (each key a variable of an interpreted
// template; `thinking` or `enable_thinking` for the native ones).
void ReadChatTemplateOptions(Reader& r, ChatOptions& options) {
  r.Bool("add_generation_prompt", &options.add_generation_prompt);
  r.Bool("continue_final_message", &options.continue_final_message);
  if (options.continue_final_message && options.add_generation_prompt)
    r.Fail("continue_final_message",
           "cannot be combined with add_generation_prompt (send add_generation_prompt: false)");
  if (const json* kwargs = r.Get("chat_template_kwargs")) {
    if (!kwargs->is_object()) return r.Fail("chat_template_kwargs", "must be an object");
    options.template_kwargs = kwargs;
    for (const char* key : {"thinking", "enable_thinking"}) {
      auto it = kwargs->find(key);
      if (it != kwargs->end() && it->is_boolean()) options.thinking = it->get<bool>();
    }
  }
}

// The template a chat request renders with: its own chat_template (vLLM's, only when the server
// trusts requests with templates: a template is code the server runs), else the model's (its
// "tool_use" one when the request gives tools and the checkpoint has one). Null with `error` set
// when there is none or the request's does not parse.
const ChatTemplate* ChooseChatTemplate(Reader& r, const TextCodec& codec,
                                       const ServingLimits& limits,
                                       std::optional<ChatTemplate>* own, ApiError* error) {
  if (const json* text = r.Get("chat_template")) {
    if (!text->is_string() || text->get_ref<const std::string&>().empty()) {
      *error = Invalid("chat_template", "must be a non-empty string (a Jinja template)");
      return nullptr;
    }
    if (!limits.trust_request_chat_template) {
      *error = Invalid("chat_template",
                       "a request's own chat template runs only on a server started with "
                       "--trust-request-chat-template");
      return nullptr;
    }
    static ChatTemplateCache parsed(16);  // a client tends to send the same template each time
    auto chat = parsed.Interpret(text->get<std::string>(), codec.special_tokens());
    if (!chat.ok()) {
      *error = Invalid("chat_template", chat.status().message());
      return nullptr;
    }
    *own = std::move(chat).value();
    return &**own;
  }
  // transformers' choice among a checkpoint's named templates: "tool_use" when tools are given.
  if (const json* tools = r.Get("tools");
      codec.tool_use_chat && tools && tools->is_array() && !tools->empty())
    return &*codec.tool_use_chat;
  if (!codec.chat) {
    *error = Invalid("messages", codec.chat_status.message());
    return nullptr;
  }
  return &*codec.chat;
}

// vLLM's preparation of messages for a Jinja template (chat_utils' _postprocess_messages):
// tool-call arguments become objects, as tool-use templates expect (null or "" → {}); an empty
// tool_calls list goes. The native DeepSeek renderings take the arguments as the client sent
// them.
bool PrepareForInterpretedTemplate(json& flat, ApiError* error) {
  for (size_t i = 0; i < flat.size(); ++i) {
    json& m = flat[i];
    auto calls = m.find("tool_calls");
    if (m["role"] != "assistant" || calls == m.end() || !calls->is_array()) continue;
    if (calls->empty()) {
      m.erase("tool_calls");
      continue;
    }
    for (size_t j = 0; j < calls->size(); ++j) {
      json& call = (*calls)[j];
      if (!call.is_object() || !call.contains("function") || !call["function"].is_object())
        continue;
      json& function = call["function"];
      auto arguments = function.find("arguments");
      if (arguments == function.end() || arguments->is_null() ||
          (arguments->is_string() && arguments->get_ref<const std::string&>().empty())) {
        function["arguments"] = json::object();
      } else if (arguments->is_string()) {
        json parsed = json::parse(arguments->get<std::string>(), nullptr, false);
        if (parsed.is_discarded()) {
          *error = Invalid(fmt::format("messages[{}].tool_calls[{}].function.arguments", i, j),
                           "must be JSON (the chat template takes the arguments as an object)");
          return false;
        }
        *arguments = std::move(parsed);
      }
    }
  }
  return true;
}

// A request's messages as the template takes them: roles checked, developer as system (but where
// `keep_developer`), content
// as one string (text parts joined: the DeepSeek templates take strings) or, for a template that
// loops over content (`content_as_parts`, vLLM's "openai" content format), as a list of text
// parts, a string becoming one part.
bool FlattenMessages(const json* messages, json& flat, ApiError* error,
                     bool content_as_parts = false, bool keep_developer = false) {
  if (!messages || !messages->is_array() || messages->empty()) {
    *error = Invalid("messages", "must be a non-empty list");
    return false;
  }
  flat = json::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      *error = Invalid(where, "must be an object with a string \"role\"");
      return false;
    }
    const std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "tool" &&
        role != "developer") {
      *error = Invalid(where + ".role", fmt::format("unknown role '{}'", role));
      return false;
    }
    json copy = m;
    if (role == "developer" && !keep_developer) copy["role"] = "system";
    // OpenAI lets an assistant message with tool calls leave out its content: null, as the
    // templates' `content is none` branch expects.
    if (role == "assistant" && m.contains("tool_calls") && !m.contains("content"))
      copy["content"] = nullptr;
    auto content = m.find("content");
    if (content != m.end() && content->is_array()) {
      // Parts joined by newlines, as vLLM joins them for templates that take a string.
      std::string text;
      json parts = json::array();
      for (const auto& part : *content) {
        if (!part.is_object() || !part.contains("type") || part["type"] != "text" ||
            !part.contains("text") || !part["text"].is_string()) {
          *error = Invalid(where + ".content", "only text parts are supported");
          return false;
        }
        if (&part != &content->front()) text += '\n';
        text += part["text"].get<std::string>();
        parts.push_back({{"type", "text"}, {"text", part["text"]}});
      }
      copy["content"] = content_as_parts ? parts : json(text);
    } else if (content != m.end() && content->is_string() && content_as_parts) {
      copy["content"] = json::array({{{"type", "text"}, {"text", *content}}});
    } else if (content != m.end() && !content->is_string() && !content->is_null()) {
      *error = Invalid(where + ".content", "must be a string or a list of text parts");
      return false;
    } else if ((content == m.end() || content->is_null()) &&
               !(role == "assistant" && m.contains("tool_calls"))) {
      *error = Invalid(where + ".content", "is required");
      return false;
    }
    flat.push_back(std::move(copy));
  }
  return true;
}

// The request's messages ready for `chat`: flattened, and prepared as vLLM prepares them for an
// interpreted template.
bool RenderableMessages(const json* messages, const ChatTemplate& chat, const ServingLimits& limits,
                        json& flat, ApiError* error) {
  const bool interpreted = chat.kind() == ChatTemplateKind::kJinja;
  const bool parts =
      interpreted &&
      (limits.content_format == ContentFormat::kOpenAI ||
       (limits.content_format == ContentFormat::kAuto && chat.takes_content_parts()));
  // DeepSeek-V3.2's encoding has a developer turn of its own (vLLM passes the role through).
  if (!FlattenMessages(messages, flat, error, parts,
                       chat.kind() == ChatTemplateKind::kDeepSeekV3_2))
    return false;
  return !interpreted || PrepareForInterpretedTemplate(flat, error);
}

// Chat: whether the output is split into reasoning, content and tool calls. With a reasoning
// parser, the output starts inside the reasoning when the rendered prompt opened the think block
// (R1's "<think>\n", V3.1's thinking "<think>") or — deepseek_r1, as vLLM's — whenever the prompt
// did not close it (V3.1 without thinking ends in "</think>"). A grammar (structured output or a
// forced tool call) then applies only after "</think>".
void ChooseOutputParsing(const std::string& prompt, const ChatOptions& options,
                         const ServingLimits& limits, GenerationPlan& plan) {
  if (limits.reasoning) {
    plan.output.reasoning = true;
    plan.output.reasoning_format = *limits.reasoning;
    if (options.continue_final_message) {
      // The output continues the final message: it is inside the reasoning when that turn
      // (from the last assistant tag, DeepSeek's or Kimi's) opened a think block and did not
      // close it.
      size_t turn = prompt.rfind("<｜Assistant｜>");
      const size_t kimi_turn = prompt.rfind("<|im_assistant|>");
      if (kimi_turn != std::string::npos && (turn == std::string::npos || kimi_turn > turn))
        turn = kimi_turn;
      const std::string_view tail =
          std::string_view(prompt).substr(turn == std::string::npos ? 0 : turn);
      const size_t open = tail.rfind("<think>"), close = tail.rfind("</think>");
      plan.output.starts_in_reasoning =
          open != std::string_view::npos && (close == std::string_view::npos || open > close);
    } else if (*limits.reasoning == chat_output::ReasoningFormat::kKimiK2) {
      // K2-Thinking writes its own "<think>" after the generation prompt; thinking: false in
      // chat_template_kwargs turns the reasoning parser off (vLLM's).
      bool thinking = true;
      if (const auto* kwargs = options.template_kwargs; kwargs && kwargs->is_object()) {
        auto it = kwargs->find("thinking");
        if (it != kwargs->end() && it->is_boolean()) thinking = it->get<bool>();
      }
      plan.output.starts_in_reasoning = thinking && !prompt.ends_with("</think>");
    } else {
      const bool opened = prompt.ends_with("<think>") || prompt.ends_with("<think>\n");
      const bool closed = prompt.ends_with("</think>");
      plan.output.starts_in_reasoning =
          opened || (*limits.reasoning == chat_output::ReasoningFormat::kDeepSeekR1 && !closed);
    }
    if (plan.params.grammar && plan.output.starts_in_reasoning)
      plan.params.grammar->begin_after = std::string(chat_output::kThinkEnd);
    // The reasoning budget counts from where the output starts, "<think>" in the prompt or not.
    plan.params.starts_in_thinking = plan.output.starts_in_reasoning;
  }
  plan.parse_output = plan.output.tool_format.has_value() || plan.output.reasoning;
  // The format's tokens must reach the parser as text (they are special in some tokenizers).
  if (plan.parse_output) plan.params.skip_special_tokens = false;
}

// vLLM's allowed_token_ids (a non-empty list of ids) and bad_words (strings, each tokenized as it
// would start a text and after a space, at most 128 sequences in all). The spaced form is kept
// unless it is the plain one or ends with it (a space token before the word, which the plain
// form's ban already covers). vLLM keeps it only where it has as many tokens as the plain form,
// which with a byte-level BPE tokenizer such as DeepSeek's often drops it (" soon" one token,
// "soon" two) and lets the word through anywhere but at the start of the text.
void ReadTokenConstraints(Reader& r, GenerationPlan& plan, const TextCodec& codec, int64_t vocab) {
  SamplingParams& p = plan.params;
  r.TokenList("allowed_token_ids", &p.allowed_token_ids, vocab);
  if (const json* allowed = r.Get("allowed_token_ids");
      allowed && allowed->is_array() && allowed->empty())
    r.Fail("allowed_token_ids", "must not be empty");
  const json* words = r.Get("bad_words");
  if (!words) return;
  if (!words->is_array()) return r.Fail("bad_words", "must be a list of strings");
  std::vector<std::string> seen;
  for (size_t i = 0; i < words->size(); ++i) {
    const json& word = (*words)[i];
    if (!word.is_string() || word.get<std::string>().empty())
      return r.Fail("bad_words", fmt::format("[{}] must be a non-empty string", i));
    std::string text = word.get<std::string>();
    if (std::find(seen.begin(), seen.end(), text) != seen.end()) continue;
    seen.push_back(text);
    text.erase(0, std::min(text.find_first_not_of(" \t\n\r\f\v"), text.size()));
    for (bool spaced : {false, true}) {
      auto ids = codec.tokenizer->Encode(spaced ? " " + text : text);
      if (!ids.ok()) return r.Fail("bad_words", fmt::format("[{}]: {}", i, ids.status().message()));
      if (ids->empty()) {
        if (!spaced) return r.Fail("bad_words", fmt::format("[{}] has no tokens", i));
        continue;
      }
      const auto& plain = p.bad_words_token_ids.back();
      if (!spaced || !(ids->size() >= plain.size() &&
                       std::equal(plain.begin(), plain.end(), ids->end() - plain.size())))
        p.bad_words_token_ids.push_back(std::move(ids).value());
    }
  }
  if (p.bad_words_token_ids.size() > 128)
    r.Fail("bad_words",
           fmt::format("{} token sequences; at most 128", p.bad_words_token_ids.size()));
}

// OpenAI's service_tier: where the engine schedules by priority, "priority" runs before the
// default tier and "flex" after it (priority -1 and 1, unless the request gives its own); else
// every tier is served as the default one, and the response says so, as OpenAI's does.
void ReadServiceTier(Reader& r, GenerationPlan& plan, const ServingLimits& limits) {
  const json* tier = r.Get("service_tier");
  if (!tier) return;
  static const std::map<std::string, int64_t> kTiers = {
      {"auto", 0}, {"default", 0}, {"scale", 0}, {"flex", 1}, {"priority", -1}};
  auto it = tier->is_string() ? kTiers.find(tier->get<std::string>()) : kTiers.end();
  if (it == kTiers.end())
    return r.Fail("service_tier",
                  "must be \"auto\", \"default\", \"flex\", \"scale\" or \"priority\"");
  plan.service_tier = "default";
  if (!limits.priority_scheduling || it->second == 0) return;
  plan.service_tier = it->first;
  if (!r.Get("priority")) plan.priority = it->second;
}

// Fields both endpoints share: sampling and streaming.
void ReadSampling(Reader& r, GenerationPlan& plan, int64_t vocab) {
  SamplingParams& p = plan.params;
  r.Number("temperature", &p.temperature, 0, 1e4);
  r.Number("top_p", &p.top_p, 0, 1);
  if (r.Get("top_p") && p.top_p == 0) r.Fail("top_p", "must be greater than 0");
  r.Integer("top_k", &p.top_k, -1, vocab);
  r.Number("min_p", &p.min_p, 0, 1);
  r.Number("presence_penalty", &p.presence_penalty, -2, 2);
  r.Number("frequency_penalty", &p.frequency_penalty, -2, 2);
  r.Number("repetition_penalty", &p.repetition_penalty, 1e-6, 10);
  int64_t seed = 0;
  if (r.Get("seed")) {
    r.Integer("seed", &seed, std::numeric_limits<int64_t>::min(),
              std::numeric_limits<int64_t>::max());
    p.seed = static_cast<uint64_t>(seed);
  }
  r.Bool("ignore_eos", &p.ignore_eos);
  r.Integer("min_tokens", &p.min_tokens, 0, 1 << 30);
  r.Bool("skip_special_tokens", &p.skip_special_tokens);
  r.Bool("include_stop_str_in_output", &p.include_stop_str_in_output);
  // vLLM's reasoning budget: tokens inside each thinking section (-1: none).
  int64_t budget = -1;
  r.Integer("thinking_token_budget", &budget, -1, int64_t{1} << 30);
  if (budget >= 0) p.thinking_token_budget = budget;
  r.TokenList("stop_token_ids", &p.stop_token_ids, vocab);
  if (const json* stop = r.Get("stop")) {
    if (stop->is_string()) {
      p.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const auto& s : *stop) {
        if (!s.is_string()) return r.Fail("stop", "must be a string or a list of strings");
        p.stop.push_back(s.get<std::string>());
      }
    } else {
      r.Fail("stop", "must be a string or a list of strings");
    }
    if (p.stop.size() > 16) r.Fail("stop", "at most 16 stop strings");
    for (const auto& s : p.stop)
      if (s.empty()) r.Fail("stop", "stop strings must not be empty");
  }
  if (const json* bias = r.Get("logit_bias")) {
    if (!bias->is_object()) return r.Fail("logit_bias", "must be an object of token id → bias");
    for (auto it = bias->begin(); it != bias->end(); ++it) {
      int64_t id = -1;
      try {
        size_t used = 0;
        id = std::stoll(it.key(), &used);
        if (used != it.key().size()) id = -1;
      } catch (...) {
        id = -1;
      }
      if (id < 0 || id >= vocab)
        return r.Fail("logit_bias",
                      fmt::format("\"{}\" is not a token id in [0, {})", it.key(), vocab));
      if (!it.value().is_number() || !(std::abs(it.value().get<double>()) <= 100))
        return r.Fail("logit_bias", fmt::format("bias for {} must be a number in [-100, 100]", id));
      p.logit_bias[static_cast<int32_t>(id)] = it.value().get<double>();
    }
  }
  r.Integer("n", &plan.n, 1, 16);
  r.Integer("priority", &plan.priority, std::numeric_limits<int32_t>::min(),
            std::numeric_limits<int32_t>::max());
  if (const json* best_of = r.Get("best_of")) {
    if (!best_of->is_number_integer() || best_of->get<int64_t>() != plan.n)
      r.Fail("best_of", "only best_of equal to n is supported");
  }
  // vLLM's beam search: n is the width; length_penalty ranks beams of different lengths.
  bool beam_search = false;
  r.Bool("use_beam_search", &beam_search);
  r.Number("length_penalty", &p.length_penalty, -100, 100);
  if (beam_search) p.beam_width = plan.n;
  r.Bool("stream", &plan.stream);
  if (const json* options = r.Get("stream_options")) {
    if (!options->is_object()) return r.Fail("stream_options", "must be an object");
    if (!plan.stream) return r.Fail("stream_options", "is only allowed with stream: true");
    auto usage = options->find("include_usage");
    if (usage != options->end() && !usage->is_null()) {
      if (!usage->is_boolean()) return r.Fail("stream_options", "include_usage must be a boolean");
      plan.include_usage = usage->get<bool>();
    }
    auto continuous = options->find("continuous_usage_stats");
    if (continuous != options->end() && !continuous->is_null()) {
      if (!continuous->is_boolean())
        return r.Fail("stream_options", "continuous_usage_stats must be a boolean");
      plan.continuous_usage = plan.include_usage && continuous->get<bool>();
    }
  }
}

}  // namespace

std::string DumpJson(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::vector<EngineRequest> ChoiceRequests(const GenerationPlan& plan, const std::string& id) {
  std::vector<EngineRequest> requests;
  for (int64_t i = 0; i < plan.choices(); ++i) {
    EngineRequest request;
    request.id = fmt::format("{}-{}", id, i);
    request.prompt = plan.prompts[i / plan.n];
    request.params = plan.params;
    request.priority = plan.priority;
    if (request.params.seed && i % plan.n > 0) *request.params.seed += i % plan.n;
    requests.push_back(std::move(request));
  }
  return requests;
}

bool AddChoiceEvent(ChoiceResult& r, const RequestEvent& e) {
  r.tokens.insert(r.tokens.end(), e.token_ids.begin(), e.token_ids.end());
  r.text += e.text;
  for (const auto& lp : e.logprobs)
    r.logprobs.push_back(lp);
  if (e.first) {
    r.prompt_tokens = e.prompt_tokens;
    r.cached_tokens = e.cached_tokens;
    r.prompt_logprobs = e.prompt_logprobs;
  }
  if (!e.finish_reason) return false;
  r.finish_reason = *e.finish_reason;
  r.error = e.error;
  r.stop_string = e.stop_string;
  r.stop_token = e.stop_token;
  return true;
}

std::string ErrorBody(const ApiError& error) {
  return DumpJson(json{{"error",
                        {{"message", error.message},
                         {"type", ErrorType(error.status)},
                         {"param", error.param.empty() ? json(nullptr) : json(error.param)},
                         {"code", error.code.empty() ? json(nullptr) : json(error.code)}}}});
}

namespace {
ParsedRequest PlanChecked(Endpoint endpoint, const json& root, const TextCodec& codec,
                          const ServingLimits& limits);
}  // namespace

// A value of an unexpected type deep in a request (a number where a part's "type" string
// belongs) throws from the JSON library: it is a malformed request like any other.
ParsedRequest ParseGenerationRequest(Endpoint endpoint, const std::string& body,
                                     const TextCodec& codec, const ServingLimits& limits) {
  json root = json::parse(body, nullptr, false);
  if (root.is_discarded()) {
    ParsedRequest out;
    out.error = Invalid("", "the body is not valid JSON");
    return out;
  }
  return PlanGenerationRequest(endpoint, root, codec, limits);
}

ParsedRequest PlanGenerationRequest(Endpoint endpoint, const json& root, const TextCodec& codec,
                                    const ServingLimits& limits) {
  try {
    return PlanChecked(endpoint, root, codec, limits);
  } catch (const json::exception& e) {
    ParsedRequest out;
    out.error = Invalid("", fmt::format("malformed request: {}", e.what()));
    return out;
  }
}

namespace {
ParsedRequest PlanChecked(Endpoint endpoint, const json& root, const TextCodec& codec,
                          const ServingLimits& limits) {
  ParsedRequest out;
  if (!root.is_object()) {
    out.error = Invalid("", "the body must be a JSON object");
    return out;
  }
  Reader r{root, std::nullopt};
  GenerationPlan plan;
  plan.endpoint = endpoint;
  const int64_t vocab = codec.tokenizer->vocab_size();
  if (const json* model = r.Get("model")) {
    if (!model->is_string()) {
      out.error = Invalid("model", "must be a string");
      return out;
    }
    if (model->get<std::string>() != limits.model_name) {
      out.error = {404,
                   fmt::format("the model '{}' does not exist (this server serves '{}')",
                               model->get<std::string>(), limits.model_name),
                   "model", "model_not_found"};
      return out;
    }
  }
  RefuseUnimplemented(r, endpoint);
  ReadSampling(r, plan, vocab);
  ReadTokenConstraints(r, plan, codec, vocab);
  ReadServiceTier(r, plan, limits);
  // vLLM's prompt_logprobs (not streamed: the prompt's come with the whole answer) and
  // return_token_ids.
  int64_t prompt_top = -1;
  r.Integer("prompt_logprobs", &prompt_top, 0, 20);
  if (prompt_top >= 0) {
    if (plan.stream) r.Fail("prompt_logprobs", "is not available with stream: true");
    plan.prompt_logprobs = prompt_top;
    plan.params.prompt_logprobs = prompt_top;
  }
  r.Bool("return_token_ids", &plan.return_token_ids);
  r.Bool("return_tokens_as_token_ids", &plan.tokens_as_ids);
  ReadStructuredOutput(r, plan);
  // vLLM's truncate_prompt_tokens: keep each prompt's last k tokens (-1: the context length).
  int64_t truncate = 0;
  r.Integer("truncate_prompt_tokens", &truncate, -1, limits.max_model_len);
  if (r.Get("truncate_prompt_tokens") && truncate == 0)
    r.Fail("truncate_prompt_tokens", "must be -1 or at least 1");
  if (truncate == -1) truncate = limits.max_model_len;
  bool max_given = false;
  if (endpoint == Endpoint::kCompletions) {
    plan.params.max_tokens = 16;
    if (r.Get("max_tokens")) max_given = true;
    r.Integer("max_tokens", &plan.params.max_tokens, 0, limits.max_model_len);
    r.Bool("echo", &plan.echo);
    int64_t logprobs = -1;
    r.Integer("logprobs", &logprobs, 0, 20);
    if (logprobs >= 0) plan.params.logprobs = logprobs;
    // Fill in the middle: each text prompt is the prefix (TextCodec::EncodeFim).
    std::optional<std::string> suffix;
    if (const json* s = r.Get("suffix")) {
      if (!s->is_string()) {
        r.Fail("suffix", "must be a string");
      } else {
        suffix = s->get<std::string>();
        if (plan.echo) r.Fail("suffix", "cannot be combined with echo");
      }
    }
    if (r.error) {
      out.error = *r.error;
      return out;
    }
    const json* prompt = r.Get("prompt");
    if (!prompt) {
      out.error = Invalid("prompt", "is required");
      return out;
    }
    auto add_text = [&](const std::string& text) -> bool {
      auto ids = suffix ? codec.EncodeFim(text, *suffix) : codec.EncodePrompt(text);
      if (!ids.ok()) {
        out.error = Invalid(suffix ? "suffix" : "prompt", ids.status().message());
        return false;
      }
      plan.prompts.push_back(std::move(ids).value());
      plan.prompt_texts.push_back(text);
      return true;
    };
    auto add_ids = [&](const json& list, const std::string& where) -> bool {
      if (suffix) {
        out.error = Invalid("suffix", "needs a text prompt (the prefix), not token ids");
        return false;
      }
      std::vector<int32_t> ids;
      for (size_t i = 0; i < list.size(); ++i) {
        const json& t = list[i];
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab) {
          out.error = Invalid("prompt",
                              fmt::format("{}[{}] is not a token id in [0, {})", where, i, vocab));
          return false;
        }
        ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
      }
      auto text = codec.tokenizer->Decode(ids);
      plan.prompt_texts.push_back(text.ok() ? text.value() : "");
      plan.prompts.push_back(std::move(ids));
      return true;
    };
    if (prompt->is_string()) {
      if (!add_text(prompt->get<std::string>())) return out;
    } else if (prompt->is_array() && !prompt->empty()) {
      const json& first = (*prompt)[0];
      if (first.is_number_integer()) {
        if (!add_ids(*prompt, "")) return out;
      } else {
        for (size_t i = 0; i < prompt->size(); ++i) {
          const json& item = (*prompt)[i];
          if (item.is_string()) {
            if (!add_text(item.get<std::string>())) return out;
          } else if (item.is_array()) {
            if (!add_ids(item, fmt::format("[{}]", i))) return out;
          } else {
            out.error = Invalid("prompt",
                                "must be a string, a list of strings, a list of token "
                                "ids, or a list of lists of token ids");
            return out;
          }
        }
      }
    } else {
      out.error = Invalid("prompt", "must be a non-empty string or list");
      return out;
    }
    if (plan.echo && plan.params.logprobs)
      plan.params.prompt_logprobs =
          std::max(*plan.params.logprobs, plan.prompt_logprobs.value_or(0));
  } else {
    if (r.Get("max_tokens") || r.Get("max_completion_tokens")) max_given = true;
    r.Integer("max_tokens", &plan.params.max_tokens, 0, limits.max_model_len);
    r.Integer("max_completion_tokens", &plan.params.max_tokens, 0, limits.max_model_len);
    r.Bool("logprobs", &plan.chat_logprobs);
    int64_t top = 0;
    r.Integer("top_logprobs", &top, 0, 20);
    if (r.Get("top_logprobs") && !plan.chat_logprobs)
      r.Fail("top_logprobs", "needs logprobs: true");
    if (plan.chat_logprobs) plan.params.logprobs = top;
    // reasoning_effort as the level's thinking budget; thinking_token_budget, if given, rules.
    if (const json* effort = r.Get("reasoning_effort")) {
      auto level = effort->is_string() ? limits.effort_budgets.find(effort->get<std::string>())
                                       : limits.effort_budgets.end();
      if (level == limits.effort_budgets.end()) {
        std::string names;
        for (const auto& [name, tokens] : limits.effort_budgets)
          names += (names.empty() ? "" : ", ") + name;
        r.Fail("reasoning_effort", fmt::format("must be one of: {}", names));
      } else if (level->second >= 0 && !r.Get("thinking_token_budget")) {
        plan.params.thinking_token_budget = level->second;
      }
    }
    ChatOptions options;
    ReadChatTemplateOptions(r, options);
    if (r.error) {
      out.error = *r.error;
      return out;
    }
    std::optional<ChatTemplate> own_template;
    const ChatTemplate* chat = ChooseChatTemplate(r, codec, limits, &own_template, &out.error);
    if (!chat) return out;
    json flat;
    if (!RenderableMessages(r.Get("messages"), *chat, limits, flat, &out.error)) return out;
    json rendered_tools;
    if (!ReadTools(r, plan, limits, options, rendered_tools, &out.error)) return out;
    auto rendered = chat->Render(flat, options);
    if (!rendered.ok()) {
      out.error = Invalid("messages", rendered.status().message());
      return out;
    }
    ChooseOutputParsing(*rendered, options, limits, plan);
    auto ids = codec.tokenizer->Encode(*rendered);
    if (!ids.ok()) {
      out.error = Invalid("messages", ids.status().message());
      return out;
    }
    plan.prompts.push_back(std::move(ids).value());
    plan.prompt_texts.push_back("");
  }
  if (r.error) {
    out.error = *r.error;
    return out;
  }
  for (size_t i = 0; i < plan.prompts.size(); ++i) {
    std::vector<int32_t>& prompt = plan.prompts[i];
    if (truncate <= 0 || static_cast<int64_t>(prompt.size()) <= truncate) continue;
    prompt.erase(prompt.begin(), prompt.end() - truncate);
    if (endpoint == Endpoint::kCompletions) {  // what echo returns
      auto text = codec.tokenizer->Decode(prompt);
      plan.prompt_texts[i] = text.ok() ? text.value() : "";
    }
  }
  for (const auto& prompt : plan.prompts) {
    if (prompt.empty()) {
      out.error = Invalid("prompt", "the prompt has no tokens");
      return out;
    }
    const int64_t room =
        std::min(limits.max_model_len, limits.cache_tokens) - static_cast<int64_t>(prompt.size());
    if (!max_given) {
      // Completions default to 16 tokens; chat to what the context leaves.
      if (endpoint == Endpoint::kChat) plan.params.max_tokens = std::max<int64_t>(room, 0);
      plan.params.max_tokens = std::min(plan.params.max_tokens, std::max<int64_t>(room, 0));
    }
    // OpenAI's code for both: clients (and the Responses API's truncation) know it.
    if (static_cast<int64_t>(prompt.size()) + plan.params.max_tokens > limits.max_model_len) {
      out.error = Invalid(max_given ? "max_tokens" : "prompt",
                          fmt::format("this model's maximum context length is {} tokens; the "
                                      "request asks for {} ({} in the prompt, {} to generate)",
                                      limits.max_model_len, prompt.size() + plan.params.max_tokens,
                                      prompt.size(), plan.params.max_tokens));
      out.error.code = kContextLengthExceeded;
      return out;
    }
    if (static_cast<int64_t>(prompt.size()) + plan.params.max_tokens > limits.cache_tokens) {
      out.error = Invalid(max_given ? "max_tokens" : "prompt",
                          fmt::format("the request needs {} tokens of cache but the server's "
                                      "whole cache holds {}",
                                      prompt.size() + plan.params.max_tokens, limits.cache_tokens));
      out.error.code = kContextLengthExceeded;
      return out;
    }
  }
  if (plan.params.min_tokens > plan.params.max_tokens) {
    out.error = Invalid("min_tokens", "must not exceed max_tokens");
    return out;
  }
  if (plan.params.beam_width > 0) {
    if (Status s = CheckBeamSearchParams(plan.params); !s.ok()) {
      out.error = Invalid("use_beam_search", s.message());
      return out;
    }
  }
  if (Status s = plan.params.Validate(vocab); !s.ok()) {
    out.error = Invalid("", s.message());
    return out;
  }
  out.plan = std::move(plan);
  return out;
}
}  // namespace

namespace {

// vLLM's return_tokens_as_token_ids: "token_id:N" names a token whatever its bytes (two tokens of
// one text stay apart; a token that is not whole UTF-8 keeps its identity).
std::string TokenText(const TextCodec& codec, int32_t token, bool as_id = false) {
  if (as_id) return fmt::format("token_id:{}", token);
  const int32_t ids[1] = {token};
  auto text = codec.tokenizer->Decode(ids);
  return text.ok() ? text.value() : "";
}

json TokenBytes(const TextCodec& codec, int32_t token) {
  json bytes = json::array();
  for (unsigned char b : codec.tokenizer->TokenBytes(token))
    bytes.push_back(b);
  return bytes;
}

}  // namespace

json ChatLogprobEntry(const TextCodec& codec, const TokenLogprob& lp, bool tokens_as_ids) {
  json top = json::array();
  for (const auto& [t, l] : lp.top)
    top.push_back({{"token", TokenText(codec, t, tokens_as_ids)},
                   {"logprob", l},
                   {"bytes", TokenBytes(codec, t)}});
  return {{"token", TokenText(codec, lp.token, tokens_as_ids)},
          {"logprob", lp.logprob},
          {"bytes", TokenBytes(codec, lp.token)},
          {"top_logprobs", top}};
}

ReasoningSplit SplitReasoningTokens(const GenerationPlan& plan, const std::vector<int32_t>& tokens,
                                    const TextCodec& codec) {
  ReasoningSplit out;
  if (!plan.output.reasoning || !plan.output.starts_in_reasoning) return out;
  std::string bytes;
  std::vector<size_t> ends;
  ends.reserve(tokens.size());
  for (int32_t t : tokens) {
    bytes += codec.tokenizer->TokenBytes(t);
    ends.push_back(bytes.size());
  }
  const size_t start =
      bytes.starts_with(chat_output::kThinkBegin) ? chat_output::kThinkBegin.size() : 0;
  const auto [end_at, answer] =
      chat_output::FindReasoningEnd(plan.output.reasoning_format, bytes, start);
  const size_t end = end_at == std::string::npos ? bytes.size() : end_at;
  out.answer_begin = tokens.size();
  for (size_t i = 0; i < tokens.size(); ++i) {
    const size_t begin = i ? ends[i - 1] : 0;
    if (begin >= start && ends[i] <= end) ++out.reasoning_tokens;
    if (begin >= answer && out.answer_begin == tokens.size()) out.answer_begin = i;
  }
  return out;
}

namespace {

// The legacy completions logprobs object for a run of tokens; `offset` starts text_offset.
void AppendCompletionLogprobs(const TextCodec& codec, const std::optional<TokenLogprob>& lp,
                              int32_t token, json& out, int64_t* offset, bool as_ids,
                              size_t top_limit = SIZE_MAX) {
  const std::string text = TokenText(codec, token, as_ids);
  out["tokens"].push_back(text);
  out["text_offset"].push_back(*offset);
  *offset += static_cast<int64_t>(text.size());
  if (!lp) {
    out["token_logprobs"].push_back(nullptr);
    out["top_logprobs"].push_back(nullptr);
    return;
  }
  out["token_logprobs"].push_back(lp->logprob);
  json top = json::object();
  for (size_t i = 0; i < lp->top.size() && i < top_limit; ++i)
    top[TokenText(codec, lp->top[i].first, as_ids)] = lp->top[i].second;
  out["top_logprobs"].push_back(top);
}

// The legacy completions logprobs object: the echoed prompt's tokens first (when `prompt` is
// given; offsets from 0), then the generated ones, whose offsets continue from the prompt's or
// start at `generated_offset` when given. The prompt's alternatives are cut to the request's
// `logprobs` (prompt_logprobs may have asked the engine for more).
json CompletionLogprobs(const TextCodec& codec, int64_t top, const std::vector<int32_t>* prompt,
                        const std::vector<std::optional<TokenLogprob>>& prompt_logprobs,
                        const std::vector<int32_t>& tokens,
                        const std::vector<TokenLogprob>& logprobs,
                        std::optional<int64_t> generated_offset, bool as_ids) {
  json out = {{"tokens", json::array()},
              {"token_logprobs", json::array()},
              {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
  int64_t offset = 0;
  if (prompt)
    for (size_t p = 0; p < prompt->size(); ++p)
      AppendCompletionLogprobs(codec,
                               p < prompt_logprobs.size() ? prompt_logprobs[p] : std::nullopt,
                               (*prompt)[p], out, &offset, as_ids, static_cast<size_t>(top));
  if (generated_offset) offset = *generated_offset;
  for (size_t t = 0; t < tokens.size(); ++t)
    AppendCompletionLogprobs(codec, t < logprobs.size() ? std::optional(logprobs[t]) : std::nullopt,
                             tokens[t], out, &offset, as_ids);
  return out;
}

// vLLM's prompt_logprobs: per prompt token (none for the first) {token id: {logprob, rank,
// decoded_token}} for the token itself and the `top` most likely in its place.
json VllmPromptLogprobs(const TextCodec& codec, const std::vector<std::optional<TokenLogprob>>& lps,
                        int64_t top) {
  json out = json::array();
  for (const auto& lp : lps) {
    if (!lp) {
      out.push_back(nullptr);
      continue;
    }
    json position = json::object();
    auto add = [&](int32_t token, float logprob, int64_t rank) {
      // -inf is not JSON: vLLM writes -9999.0 for it.
      position[std::to_string(token)] = {{"logprob", std::isfinite(logprob) ? logprob : -9999.0f},
                                         {"rank", rank},
                                         {"decoded_token", TokenText(codec, token)}};
    };
    add(lp->token, lp->logprob, lp->rank);
    for (size_t i = 0; i < lp->top.size() && static_cast<int64_t>(i) < top; ++i)
      add(lp->top[i].first, lp->top[i].second, static_cast<int64_t>(i) + 1);
    out.push_back(std::move(position));
  }
  return out;
}

json Usage(const GenerationPlan& plan, const std::vector<ChoiceResult>& choices,
           const TextCodec& codec) {
  int64_t prompt = 0, completion = 0, cached = 0, reasoning = 0;
  for (size_t i = 0; i < choices.size(); ++i) {
    // Each prompt counts once however many samples it has.
    if (static_cast<int64_t>(i) % plan.n == 0) {
      prompt += choices[i].prompt_tokens;
      cached += choices[i].cached_tokens;
    }
    completion += static_cast<int64_t>(choices[i].tokens.size());
    reasoning += SplitReasoningTokens(plan, choices[i].tokens, codec).reasoning_tokens;
  }
  json usage = {{"prompt_tokens", prompt},
                {"completion_tokens", completion},
                {"total_tokens", prompt + completion},
                {"prompt_tokens_details", {{"cached_tokens", cached}}}};
  // vLLM reports it whenever a reasoning parser is on (0 for an output without reasoning).
  if (plan.output.reasoning) usage["completion_tokens_details"] = {{"reasoning_tokens", reasoning}};
  return usage;
}

json FinishReason(const ChoiceResult& c) {
  if (c.finish_reason.empty()) return nullptr;
  if (c.finish_reason == "error" || c.finish_reason == "abort") return "abort";
  return c.finish_reason;
}

json ToolCallsJson(const std::vector<chat_output::ToolCall>& calls) {
  json out = json::array();
  for (const auto& call : calls)
    out.push_back({{"id", call.id},
                   {"type", "function"},
                   {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
  return out;
}

// A parsed chat message: content (null when none), reasoning_content when a reasoning parser is
// on, tool_calls when there are calls.
json ChatMessageJson(const GenerationPlan& plan, const chat_output::ChatMessage& m) {
  json message = {{"role", "assistant"}, {"content", m.content ? json(*m.content) : json(nullptr)}};
  if (plan.output.reasoning)
    message["reasoning_content"] = m.reasoning ? json(*m.reasoning) : json(nullptr);
  if (!m.tool_calls.empty()) message["tool_calls"] = ToolCallsJson(m.tool_calls);
  return message;
}

json ToolCallDeltasJson(const std::vector<chat_output::ToolCallDelta>& deltas) {
  json out = json::array();
  for (const auto& d : deltas) {
    json item = {{"index", d.index}};
    if (d.id) {
      item["id"] = *d.id;
      item["type"] = "function";
      item["function"] = {{"name", d.name.value_or("")}, {"arguments", d.arguments}};
    } else {
      item["function"] = {{"arguments", d.arguments}};
    }
    out.push_back(std::move(item));
  }
  return out;
}

// vLLM's stop_reason: the stop string matched or the stop token id sampled, else null.
json StopReason(const std::optional<std::string>& stop_string,
                const std::optional<int32_t>& stop_token) {
  if (stop_string) return *stop_string;
  if (stop_token) return *stop_token;
  return nullptr;
}

}  // namespace

ChatChoice FinishedChatChoice(const GenerationPlan& plan, const ChoiceResult& choice) {
  ChatChoice out;
  chat_output::ChatOutputParser parser(plan.output);
  parser.Feed(choice.text);
  parser.Finish(choice.finish_reason == "length");
  out.message = parser.Message();
  out.finish_reason =
      choice.finish_reason == "stop" && parser.CalledTools() ? "tool_calls" : choice.finish_reason;
  if (out.finish_reason == "error") out.finish_reason = "abort";
  return out;
}

std::string ResponseBody(const GenerationPlan& plan, const std::vector<ChoiceResult>& choices,
                         const std::string& id, int64_t created, const TextCodec& codec,
                         const ServingLimits& limits) {
  json out_choices = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& c = choices[i];
    const size_t prompt_index = i / static_cast<size_t>(plan.n);
    if (plan.endpoint == Endpoint::kCompletions) {
      std::string text = plan.echo ? plan.prompt_texts[prompt_index] + c.text : c.text;
      json logprobs = nullptr;
      if (plan.params.logprobs)
        logprobs = CompletionLogprobs(
            codec, *plan.params.logprobs, plan.echo ? &plan.prompts[prompt_index] : nullptr,
            c.prompt_logprobs, c.tokens, c.logprobs, std::nullopt, plan.tokens_as_ids);
      out_choices.push_back({{"index", i},
                             {"text", text},
                             {"logprobs", logprobs},
                             {"finish_reason", FinishReason(c)},
                             {"stop_reason", StopReason(c.stop_string, c.stop_token)}});
      if (plan.prompt_logprobs)
        out_choices.back()["prompt_logprobs"] =
            VllmPromptLogprobs(codec, c.prompt_logprobs, *plan.prompt_logprobs);
      if (plan.return_token_ids) {
        out_choices.back()["prompt_token_ids"] = plan.prompts[prompt_index];
        out_choices.back()["token_ids"] = c.tokens;
      }
    } else {
      json logprobs = nullptr;
      if (plan.chat_logprobs) {
        json content = json::array();
        for (const auto& lp : c.logprobs)
          content.push_back(ChatLogprobEntry(codec, lp, plan.tokens_as_ids));
        logprobs = {{"content", content}};
      }
      json message = {{"role", "assistant"}, {"content", c.text}};
      json finish = FinishReason(c);
      if (plan.parse_output) {
        const ChatChoice chat = FinishedChatChoice(plan, c);
        message = ChatMessageJson(plan, chat.message);
        if (!finish.is_null()) finish = chat.finish_reason;
      }
      out_choices.push_back({{"index", i},
                             {"message", message},
                             {"logprobs", logprobs},
                             {"finish_reason", finish},
                             {"stop_reason", StopReason(c.stop_string, c.stop_token)}});
      if (plan.return_token_ids) out_choices.back()["token_ids"] = c.tokens;
    }
  }
  json body = {
      {"id", id},
      {"object", plan.endpoint == Endpoint::kCompletions ? "text_completion" : "chat.completion"},
      {"created", created},
      {"model", limits.model_name},
      {"choices", out_choices},
      {"usage", Usage(plan, choices, codec)}};
  if (!plan.service_tier.empty()) body["service_tier"] = plan.service_tier;
  // Chat has one prompt: its log-probabilities and ids go beside the choices (vLLM's).
  if (plan.endpoint == Endpoint::kChat && !choices.empty()) {
    if (plan.prompt_logprobs)
      body["prompt_logprobs"] =
          VllmPromptLogprobs(codec, choices[0].prompt_logprobs, *plan.prompt_logprobs);
    if (plan.return_token_ids) body["prompt_token_ids"] = plan.prompts[0];
  }
  return DumpJson(body);
}

std::string StreamChunk(const GenerationPlan& plan, int64_t index, const RequestEvent& event,
                        ChoiceResult& so_far, bool first, const std::string& id, int64_t created,
                        const TextCodec& codec, const ServingLimits& limits) {
  json choice;
  const size_t prompt_index = static_cast<size_t>(index / plan.n);
  json finish = nullptr;
  if (event.finish_reason) {
    ChoiceResult c;
    c.finish_reason = *event.finish_reason;
    finish = FinishReason(c);
  }
  if (plan.endpoint == Endpoint::kCompletions) {
    std::string text = event.text;
    json logprobs = nullptr;
    if (plan.params.logprobs) {
      // Generated offsets count the echoed prompt text and the text streamed before this event.
      const int64_t before =
          (plan.echo ? static_cast<int64_t>(plan.prompt_texts[prompt_index].size()) : 0) +
          static_cast<int64_t>(so_far.text.size() - event.text.size());
      logprobs = CompletionLogprobs(
          codec, *plan.params.logprobs, plan.echo && first ? &plan.prompts[prompt_index] : nullptr,
          event.prompt_logprobs, event.token_ids, event.logprobs, before, plan.tokens_as_ids);
    }
    if (plan.echo && first) text = plan.prompt_texts[prompt_index] + text;
    choice = {{"index", index},
              {"text", text},
              {"logprobs", logprobs},
              {"finish_reason", finish},
              {"stop_reason", StopReason(event.stop_string, event.stop_token)}};
  } else {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (plan.parse_output) {
      if (!so_far.output)
        so_far.output = std::make_shared<chat_output::ChatOutputParser>(plan.output);
      chat_output::OutputDelta parsed = so_far.output->Feed(event.text);
      if (event.finish_reason) {
        chat_output::OutputDelta rest = so_far.output->Finish(*event.finish_reason == "length");
        parsed.reasoning += rest.reasoning;
        parsed.content += rest.content;
        for (auto& d : rest.tool_calls) {
          if (!parsed.tool_calls.empty() && parsed.tool_calls.back().index == d.index && !d.id)
            parsed.tool_calls.back().arguments += d.arguments;
          else
            parsed.tool_calls.push_back(std::move(d));
        }
        if (*event.finish_reason == "stop" && so_far.output->CalledTools()) finish = "tool_calls";
      }
      // Tokens the parser holds back or that belong to a call's header say nothing yet: no
      // chunk, as vLLM sends none (unless log-probabilities, token ids or the finish must go
      // out).
      if (parsed.empty() && !first && !event.finish_reason && !plan.chat_logprobs &&
          !plan.return_token_ids)
        return "";
      if (!parsed.reasoning.empty()) delta["reasoning_content"] = parsed.reasoning;
      if (!parsed.content.empty() || first ||
          (parsed.reasoning.empty() && parsed.tool_calls.empty()))
        delta["content"] = parsed.content;
      if (!parsed.tool_calls.empty()) delta["tool_calls"] = ToolCallDeltasJson(parsed.tool_calls);
    } else {
      if (!event.text.empty() || !first) delta["content"] = event.text;
      if (first && event.text.empty()) delta["content"] = "";
    }
    json logprobs = nullptr;
    if (plan.chat_logprobs) {
      json content = json::array();
      for (const auto& lp : event.logprobs)
        content.push_back(ChatLogprobEntry(codec, lp, plan.tokens_as_ids));
      logprobs = {{"content", content}};
    }
    choice = {{"index", index},
              {"delta", delta},
              {"logprobs", logprobs},
              {"finish_reason", finish},
              {"stop_reason", StopReason(event.stop_string, event.stop_token)}};
  }
  json chunk = {{"id", id},
                {"object", plan.endpoint == Endpoint::kCompletions ? "text_completion"
                                                                   : "chat.completion.chunk"},
                {"created", created},
                {"model", limits.model_name},
                {"choices", json::array({choice})}};
  if (!plan.service_tier.empty()) chunk["service_tier"] = plan.service_tier;
  if (plan.return_token_ids) {  // each chunk's ids; the prompt's with a choice's first (vLLM's)
    chunk["choices"][0]["token_ids"] = event.token_ids;
    if (first) {
      json& at = plan.endpoint == Endpoint::kCompletions ? chunk["choices"][0] : chunk;
      at["prompt_token_ids"] = plan.prompts[prompt_index];
    }
  }
  if (plan.continuous_usage) {
    const auto completion = static_cast<int64_t>(so_far.tokens.size());
    chunk["usage"] = {{"prompt_tokens", so_far.prompt_tokens},
                      {"completion_tokens", completion},
                      {"total_tokens", so_far.prompt_tokens + completion}};
  } else if (plan.include_usage) {
    chunk["usage"] = nullptr;
  }
  return "data: " + DumpJson(chunk) + "\n\n";
}

std::map<std::string, int64_t> DefaultEffortBudgets() {
  return {{"none", 0},  {"minimal", -1}, {"low", -1}, {"medium", -1},
          {"high", -1}, {"xhigh", -1},   {"max", -1}};
}

Status ParseEffortBudgets(const std::string& text, std::map<std::string, int64_t>* budgets) {
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string entry = text.substr(at, comma - at);
    const size_t eq = entry.find('=');
    int64_t tokens = 0;
    size_t used = 0;
    bool number = false;
    if (eq != std::string::npos && eq > 0 && eq + 1 < entry.size()) {
      try {
        tokens = std::stoll(entry.substr(eq + 1), &used);
        number = used == entry.size() - eq - 1;
      } catch (...) {
      }
    }
    if (!number || tokens < -1)
      return Status::Errorf(
          "--reasoning-effort-budgets: '{}' is not level=tokens (tokens at least 0, or -1 for "
          "no budget)",
          entry);
    (*budgets)[entry.substr(0, eq)] = tokens;
    at = comma + 1;
  }
  return Status::Ok();
}

Status ConfigureChatOutput(const std::string& tool_call_parser, bool enable_auto_tool_choice,
                           const std::string& reasoning_parser, const TextCodec& codec,
                           ServingLimits* limits) {
  if (!tool_call_parser.empty()) {
    limits->tool_format = chat_output::ToolCallFormatByName(tool_call_parser);
    if (!limits->tool_format)
      return Status::Errorf(
          "--tool-call-parser: unknown parser '{}' (deepseek_v3, deepseek_v31, deepseek_v32, "
          "kimi_k2)",
          tool_call_parser);
  } else if (codec.chat && codec.chat->kind() != ChatTemplateKind::kJinja) {
    limits->tool_format = codec.chat->kind() == ChatTemplateKind::kDeepSeekV3_1
                              ? chat_output::ToolCallFormat::kDeepSeekV31
                          : codec.chat->kind() == ChatTemplateKind::kDeepSeekV3_2
                              ? chat_output::ToolCallFormat::kDeepSeekV32
                              : chat_output::ToolCallFormat::kDeepSeekV3;
  } else if (codec.tokenizer &&
             codec.tokenizer->TokenToId(chat_output::kKimiCallsBegin).has_value()) {
    // Kimi K2's tokenizer has its call format's tokens. Any other interpreted template's format
    // is the model's own: --tool-call-parser names it.
    limits->tool_format = chat_output::ToolCallFormat::kKimiK2;
  }
  limits->sort_tool_keys = codec.config.sort_tool_keys;
  limits->auto_tool_choice = enable_auto_tool_choice;
  if (!reasoning_parser.empty()) {
    limits->reasoning = chat_output::ReasoningFormatByName(reasoning_parser);
    if (!limits->reasoning)
      return Status::Errorf(
          "--reasoning-parser: unknown parser '{}' (deepseek_r1, deepseek_v3, kimi_k2)",
          reasoning_parser);
  }
  return Status::Ok();
}

std::string StreamUsageChunk(const GenerationPlan& plan, const std::vector<ChoiceResult>& choices,
                             const std::string& id, int64_t created, const TextCodec& codec,
                             const ServingLimits& limits) {
  json chunk = {{"id", id},
                {"object", plan.endpoint == Endpoint::kCompletions ? "text_completion"
                                                                   : "chat.completion.chunk"},
                {"created", created},
                {"model", limits.model_name},
                {"choices", json::array()},
                {"usage", Usage(plan, choices, codec)}};
  return "data: " + DumpJson(chunk) + "\n\n";
}

std::string StreamError(const ApiError& error) {
  return "data: " + ErrorBody(error) + "\n\n";
}

std::string TokenizeResponse(const std::string& body, const TextCodec& codec,
                             const ServingLimits& limits, ApiError* error) try {
  json root = json::parse(body, nullptr, false);
  if (!root.is_object()) {
    *error = Invalid("", "the body must be a JSON object");
    return "";
  }
  bool add_special = true;
  if (auto it = root.find("add_special_tokens"); it != root.end() && !it->is_null()) {
    if (!it->is_boolean()) {
      *error = Invalid("add_special_tokens", "must be true or false");
      return "";
    }
    add_special = it->get<bool>();
  }
  Result<std::vector<int32_t>> ids = Status::Error("");
  if (auto prompt = root.find("prompt"); prompt != root.end() && prompt->is_string()) {
    ids = codec.EncodePrompt(prompt->get<std::string>(), add_special);
  } else if (auto messages = root.find("messages");
             messages != root.end() && messages->is_array()) {
    // The chat request's prompt: the same template fields and tools (rendered whatever
    // tool_choice a chat request would give, as vLLM's /tokenize does), so its count is the
    // chat request's prompt_tokens.
    Reader r{root, std::nullopt};
    ChatOptions options;
    ReadChatTemplateOptions(r, options);
    if (const json* v = r.Get("return_token_strs"); v && *v != false)
      r.Fail("return_token_strs", "is not supported");
    if (r.error) {
      *error = *r.error;
      return "";
    }
    std::optional<ChatTemplate> own_template;
    const ChatTemplate* chat = ChooseChatTemplate(r, codec, limits, &own_template, error);
    if (!chat) return "";
    json flat, rendered_tools;
    if (!RenderableMessages(&*messages, *chat, limits, flat, error)) return "";
    if (const json* tools = r.Get("tools")) {
      if (!limits.tool_format) {
        *error = Invalid("tools", "tool calling needs a chat template with a tool-call format");
        return "";
      }
      const json none = "none";
      auto read = chat_output::ReadToolRequest(tools, &none, nullptr, *limits.tool_format, false);
      if (read.error) {
        *error = Invalid(read.error->param, read.error->message);
        return "";
      }
      if (!read.request->functions.empty()) {
        rendered_tools = chat_output::ToolsForTemplate(*tools, limits.sort_tool_keys);
        options.tools = &rendered_tools;
      }
    }
    auto rendered = chat->Render(flat, options);
    ids = rendered.ok() ? codec.tokenizer->Encode(*rendered)
                        : Result<std::vector<int32_t>>(rendered.status());
    if (!ids.ok()) {
      *error = Invalid("messages", ids.status().message());
      return "";
    }
  } else {
    *error = Invalid("prompt", "give \"prompt\" (a string) or \"messages\" (a list)");
    return "";
  }
  if (!ids.ok()) {
    *error = Invalid("prompt", ids.status().message());
    return "";
  }
  return DumpJson(
      {{"count", ids->size()}, {"max_model_len", limits.max_model_len}, {"tokens", ids.value()}});
} catch (const json::exception& e) {
  *error = Invalid("", fmt::format("malformed request: {}", e.what()));
  return "";
}

std::string DetokenizeResponse(const std::string& body, const TextCodec& codec,
                               ApiError* error) try {
  json root = json::parse(body, nullptr, false);
  if (!root.is_object() || !root.contains("tokens") || !root["tokens"].is_array()) {
    *error = Invalid("tokens", "must be a list of token ids");
    return "";
  }
  std::vector<int32_t> ids;
  const auto& tokens = root["tokens"];
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (!tokens[i].is_number_integer() || tokens[i].get<int64_t>() < 0 ||
        tokens[i].get<int64_t>() >= codec.tokenizer->vocab_size()) {
      *error = Invalid("tokens", fmt::format("[{}] is not a token id in [0, {})", i,
                                             codec.tokenizer->vocab_size()));
      return "";
    }
    ids.push_back(static_cast<int32_t>(tokens[i].get<int64_t>()));
  }
  auto text = codec.tokenizer->Decode(ids);
  return DumpJson({{"prompt", text.value()}});
} catch (const json::exception& e) {
  *error = Invalid("", fmt::format("malformed request: {}", e.what()));
  return "";
}

namespace {
// The served model in OpenAI's shape (vLLM's fields) and Anthropic's (type, display_name,
// created_at, max_input_tokens, max_tokens) at once: each client reads its own fields.
json ModelObject(const ServingLimits& limits, int64_t created) {
  return {{"id", limits.model_name},
          {"object", "model"},
          {"created", created},
          {"owned_by", "switchyard"},
          {"root", limits.model_name},
          {"max_model_len", limits.max_model_len},
          {"type", "model"},
          {"display_name", limits.model_name},
          {"created_at", fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", fmt::gmtime(std::time_t{created}))},
          {"max_input_tokens", limits.max_model_len},
          {"max_tokens", limits.max_model_len}};
}
}  // namespace

std::string ModelsResponse(const ServingLimits& limits, int64_t created) {
  return DumpJson({{"object", "list"},
                   {"data", json::array({ModelObject(limits, created)})},
                   {"has_more", false},
                   {"first_id", limits.model_name},
                   {"last_id", limits.model_name}});
}

std::string ModelResponse(const ServingLimits& limits, int64_t created, const std::string& id,
                          ApiError* error) {
  if (id != limits.model_name) {
    *error = {404,
              fmt::format("the model '{}' does not exist (this server serves '{}')", id,
                          limits.model_name),
              "model", "model_not_found"};
    return "";
  }
  return DumpJson(ModelObject(limits, created));
}

ApiError InvalidField(const std::string& param, const std::string& message) {
  return {400, param.empty() ? message : param + ": " + message, param, "invalid_value"};
}

const json* NonNullField(const json& body, const char* key) {
  auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

std::optional<ApiError> UnknownField(const json& object, const std::string& prefix,
                                     std::initializer_list<std::string_view> allowed,
                                     const std::string& message) {
  for (const auto& [key, value] : object.items())
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end())
      return InvalidField(prefix + key, message);
  return std::nullopt;
}

void ForEachQueryPair(std::string_view query,
                      const std::function<bool(std::string_view, std::string_view)>& visit) {
  for (size_t at = 0; at < query.size();) {
    size_t end = query.find('&', at);
    if (end == std::string_view::npos) end = query.size();
    const std::string_view pair = query.substr(at, end - at);
    at = end + 1;
    const size_t eq = pair.find('=');
    if (!visit(pair.substr(0, eq), eq == std::string_view::npos ? "" : pair.substr(eq + 1))) return;
  }
}

std::optional<std::string> QueryValue(std::string_view query, std::string_view key) {
  std::optional<std::string> found;
  ForEachQueryPair(query, [&](std::string_view k, std::string_view v) {
    if (k == key) found = std::string(v);
    return true;
  });
  return found;
}

ApiError RenameFields(ApiError error, std::initializer_list<FieldRename> fields,
                      std::initializer_list<FieldRename> infixes) {
  const std::string before = error.param;
  for (const auto& [from, to] : fields) {
    const std::string_view f = from;
    if (!error.param.starts_with(f)) continue;
    const char next = error.param.size() > f.size() ? error.param[f.size()] : '\0';
    if (next != '\0' && next != '.' && next != '[') continue;
    error.param = to + error.param.substr(f.size());
    break;
  }
  for (const auto& [from, to] : infixes) {
    const size_t at = error.param.find(from);
    if (at == std::string::npos) continue;
    error.param.replace(at, std::string_view(from).size(), to);
    break;
  }
  if (error.param != before && error.message.starts_with(before))
    error.message = error.param + error.message.substr(before.size());
  return error;
}

OutputBlocks::OutputBlocks(const GenerationPlan& plan) {
  if (plan.parse_output) parser_ = std::make_unique<chat_output::ChatOutputParser>(plan.output);
}

OutputBlocks::~OutputBlocks() = default;

std::string OutputBlocks::Feed(const RequestEvent& event, Kind open_kind, const OpenFn& open,
                               const AppendFn& append) {
  chat_output::OutputDelta delta;
  if (parser_) {
    delta = parser_->Feed(event.text);
    if (event.finish_reason) {
      chat_output::OutputDelta rest = parser_->Finish(*event.finish_reason == "length");
      delta.reasoning += rest.reasoning;
      delta.content += rest.content;
      for (auto& d : rest.tool_calls)
        delta.tool_calls.push_back(std::move(d));
    }
  } else {
    delta.content = event.text;
  }
  std::string out;
  auto start = [&](Kind kind, const std::string& call_id, const std::string& name) {
    out += open(kind, call_id, name);
    open_kind = kind;
  };
  if (!delta.reasoning.empty()) {
    if (open_kind != Kind::kReasoning) start(Kind::kReasoning, "", "");
    out += append(delta.reasoning);
  }
  if (!delta.content.empty()) {
    if (open_kind != Kind::kText) start(Kind::kText, "", "");
    out += append(delta.content);
  }
  for (const auto& d : delta.tool_calls) {
    if (d.id || open_kind != Kind::kCall || d.index != call_index_) {
      start(Kind::kCall, d.id.value_or(""), d.name.value_or(""));
      call_index_ = d.index;
    }
    out += append(d.arguments);
  }
  return out;
}

}  // namespace sy::serve
