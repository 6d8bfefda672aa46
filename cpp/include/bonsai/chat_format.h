// Chat prompt formats for bonsai_run's interactive mode, chosen from the model file's chat template.
//
// The engine has no Jinja interpreter. Instead the template text (`tokenizer.chat_template`) is
// searched for the markers that identify the common families, as llama.cpp's built-in chat formats
// do, and each family is rendered by code that reproduces what the family's reference template
// renders with Jinja (tests/test_bonsai_run_cli.py checks each against jinja2):
//   ChatML (`<|im_start|>`: Qwen 2 / 2.5 / 3 / 3.5, many others), Llama 3 (`<|start_header_id|>`;
//   3.1+ with their "Cutting Knowledge Date" system header), Llama 2 (`[INST]` with `<<SYS>>`),
//   Mistral (`[INST]` without), Gemma (`<start_of_turn>`), Phi-3 (`<|user|>` + `<|end|>`), Zephyr
//   (`<|user|>` + `<|assistant|>`), DeepSeek 2 (`'Assistant: ' + message['content'] + eos_token`),
//   DeepSeek 3 / R1 (`<｜User｜>` + `<｜Assistant｜>`), Vicuna (`USER: ` + `ASSISTANT: `).
// A template that matches none of them (or no template) gives ChatFamily::PLAIN: "User: ..." /
// "Assistant:" turns; the caller says so once.
//
// ChatSession keeps the conversation and returns only the text each step adds, so a chat feeds
// the KV cache turn by turn instead of re-evaluating the whole conversation.
#pragma once

#include <string>
#include <vector>

namespace bonsai {

enum class ChatFamily {
    PLAIN, CHATML, LLAMA3, LLAMA2, MISTRAL, GEMMA, PHI3, ZEPHYR, DEEPSEEK2, DEEPSEEK3, VICUNA,
};

struct ChatMessage {
    std::string role;     // "system", "user" or "assistant"
    std::string content;
};

struct ChatFormat {
    ChatFamily family = ChatFamily::PLAIN;
    bool system_role = true;        // false: the template refuses a system message (Gemma 1/2, Mistral)
    std::string default_system;     // ChatML: the system turn the template adds when there is none (Qwen 2/2.5)
    bool opens_think = false;       // ChatML, DeepSeek 3: the generation prompt opens "<think>\n" (Qwen 3.5, R1)
    bool trims_content = false;     // ChatML: message texts pass through `| trim` (Qwen 3.5)
    bool vicuna_system_tag = false; // Vicuna: the system text is prefixed "SYSTEM: " (Orca-Vicuna)
    std::string knowledge_date;     // Llama 3.1+: the system header's "Cutting Knowledge Date" ("" = 3.0)
    std::string today;              // Llama 3.1+: its "Today Date" (strftime_now's when the template calls it)
    std::string bos;                // text of the BOS / EOS tokens, as the template's bos_token / eos_token
    std::string eos;

    const char* name() const;       // "ChatML", "Llama 3", ..., "plain"
};

// The format of a chat template text. `bos` / `eos` are the texts of the vocabulary's BOS and EOS
// tokens. An empty or unrecognised template gives ChatFamily::PLAIN.
ChatFormat detect_chat_format(const std::string& tmpl, const std::string& bos, const std::string& eos);

// The whole conversation as the family's template renders it; with add_generation_prompt the
// assistant header that the reply follows is appended. Throws bonsai::Error for a system message
// the format has no place for, or an unknown role.
std::string render_chat(const ChatFormat& fmt, const std::vector<ChatMessage>& messages,
                        bool add_generation_prompt);

class ChatSession {
public:
    explicit ChatSession(ChatFormat fmt) : fmt_(std::move(fmt)) {}

    // Sets the system prompt; must come before the first user message.
    void set_system(const std::string& text);
    // Adds a user message; returns the text to evaluate next: the rendering of the conversation
    // with it and the generation prompt, minus what the cache already holds.
    std::string add_user(const std::string& text);
    // Records the model's reply. `eog_text` is the text of the end-of-generation token that ended
    // it, already in the cache ("" when it stopped otherwise: -n, a reverse prompt, ...). Returns
    // the rest of the format's end of the assistant turn, to evaluate before the next user message.
    std::string end_reply(const std::string& reply, const std::string& eog_text);

    const ChatFormat& format() const { return fmt_; }
    const std::vector<ChatMessage>& messages() const { return messages_; }

private:
    // Conversation text as the cache holds it after a reply: the rendering without the end that
    // some templates add only after the last message (Phi-3's eos).
    std::string render_open(const std::vector<ChatMessage>& messages) const;

    ChatFormat fmt_;
    std::vector<ChatMessage> messages_;
};

}  // namespace bonsai
