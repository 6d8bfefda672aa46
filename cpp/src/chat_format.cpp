// Chat formats of bonsai_run's interactive mode (see bonsai/chat_format.h).
//
// Each family's renderer mirrors its reference Jinja template, including the details that change
// the text: which fields are trimmed (Llama 3, Gemma, Qwen 3.5: `| trim`; Llama 2: `.strip()`),
// where BOS goes (once at the start, or before every [INST] in Llama 2), where the system prompt
// goes (its own turn, merged into the first user turn, or refused), and what follows the last
// message (Phi-3 ends a conversation without a generation prompt with EOS).
#include "bonsai/chat_format.h"

#include <ctime>
#include <utility>

#include "bonsai/error.h"

namespace bonsai {

namespace {

bool contains(const std::string& s, const char* needle) { return s.find(needle) != std::string::npos; }

// Python's str.strip() / Jinja's trim for ASCII white space.
std::string trim(const std::string& s) {
    const char* ws = " \t\n\r\v\f";
    const size_t b = s.find_first_not_of(ws);
    if (b == std::string::npos) return "";
    return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// Qwen 2 / 2.5 templates write the system turn they add when the conversation has none as one
// string literal, '<|im_start|>system\n...<|im_end|>\n'. Returns its text, or "" when the
// template has no such literal (the system text then comes from the messages only).
std::string chatml_default_system(const std::string& tmpl) {
    const std::string open = "<|im_start|>system\\n";
    for (size_t at = tmpl.find(open); at != std::string::npos; at = tmpl.find(open, at + 1)) {
        const size_t start = at + open.size();
        const size_t end = tmpl.find("<|im_end|>", start);
        if (end == std::string::npos) break;
        const std::string raw = tmpl.substr(start, end - start);
        if (raw.empty() || raw.find_first_of("'\"{}+") != std::string::npos) continue;  // an expression
        std::string text;
        for (size_t i = 0; i < raw.size(); ++i) {
            if (raw[i] == '\\' && i + 1 < raw.size() && raw[i + 1] == 'n') {
                text += '\n';
                ++i;
            } else {
                text += raw[i];
            }
        }
        return text;
    }
    return "";
}

// The text of a string literal in the template that follows `key` (e.g. `date_string = "`), up to
// the closing quote or an escaped newline; "" when absent.
std::string literal_after(const std::string& tmpl, const std::string& key) {
    const size_t at = tmpl.find(key);
    if (at == std::string::npos) return "";
    const size_t start = at + key.size();
    size_t end = start;
    while (end < tmpl.size() && tmpl[end] != '"' && tmpl[end] != '\'' && tmpl.compare(end, 2, "\\n") != 0)
        ++end;
    return tmpl.substr(start, end - start);
}

// Llama 3.2+ date the system header with strftime_now("%d %b %Y") (the local date, as
// Transformers' strftime_now gives it); 3.1 with the template's default date_string.
std::string llama3_today(const std::string& tmpl) {
    const std::string fmt = literal_after(tmpl, "strftime_now(\"");
    if (!fmt.empty()) {
        const std::time_t now = std::time(nullptr);
        std::tm local{};
        localtime_r(&now, &local);
        char buf[64];
        if (std::strftime(buf, sizeof buf, fmt.c_str(), &local) > 0) return buf;
    }
    return literal_after(tmpl, "date_string = \"");
}

enum class RenderMode {
    GENERATION,  // add_generation_prompt = true
    CLOSED,      // add_generation_prompt = false: what the template renders after the last message
    OPEN,        // the conversation as the cache holds it between turns (no end-of-conversation text)
};

[[noreturn]] void no_system_role(const ChatFormat& f) {
    throw Error(std::string("the model's chat template (") + f.name() + ") has no system role; "
                "drop -sys/--system-prompt");
}

void check_role(const ChatMessage& m) {
    if (m.role != "system" && m.role != "user" && m.role != "assistant")
        throw Error("chat message role '" + m.role + "' is not supported; use system, user or assistant");
}

std::string render(const ChatFormat& f, const std::vector<ChatMessage>& msgs, RenderMode mode) {
    for (const ChatMessage& m : msgs) check_role(m);
    const bool gen = mode == RenderMode::GENERATION;
    // the system prompt, when the first message is one, and where the rest of the conversation starts
    const bool has_system = !msgs.empty() && msgs[0].role == "system";
    const std::string system = has_system ? msgs[0].content : "";
    const size_t first = has_system ? 1 : 0;
    if (has_system && !f.system_role) no_system_role(f);
    for (size_t i = first; i < msgs.size(); ++i)
        if (msgs[i].role == "system")
            throw Error("a system message can only be the first message of a chat");
    std::string out;
    switch (f.family) {
        case ChatFamily::CHATML: {
            if (!has_system && !f.default_system.empty())
                out += "<|im_start|>system\n" + f.default_system + "<|im_end|>\n";
            for (const ChatMessage& m : msgs) {
                const std::string text = f.trims_content ? trim(m.content) : m.content;
                out += "<|im_start|>" + m.role + "\n" + text + "<|im_end|>\n";
            }
            if (gen) out += f.opens_think ? "<|im_start|>assistant\n<think>\n" : "<|im_start|>assistant\n";
            break;
        }
        case ChatFamily::LLAMA3: {
            out += f.bos;
            if (!f.knowledge_date.empty()) {
                // 3.1+: a system turn always, dated, the system prompt (trimmed) after the dates
                out += "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: " +
                       f.knowledge_date + "\nToday Date: " + f.today + "\n\n" + trim(system) + "<|eot_id|>";
            }
            for (size_t i = f.knowledge_date.empty() ? 0 : first; i < msgs.size(); ++i)
                out += "<|start_header_id|>" + msgs[i].role + "<|end_header_id|>\n\n" + trim(msgs[i].content) +
                       "<|eot_id|>";
            if (gen) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
            break;
        }
        case ChatFamily::LLAMA2: {
            // the system prompt goes into the first user turn; BOS opens every [INST]
            for (size_t i = first; i < msgs.size(); ++i) {
                const ChatMessage& m = msgs[i];
                std::string content = m.content;
                if (i == first && has_system) content = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content;
                if (m.role == "user") out += f.bos + "[INST] " + trim(content) + " [/INST]";
                else out += " " + trim(content) + " " + f.eos;
            }
            break;
        }
        case ChatFamily::MISTRAL: {
            out += f.bos;
            for (const ChatMessage& m : msgs) {
                if (m.role == "user") out += "[INST] " + m.content + " [/INST]";
                else out += m.content + f.eos;
            }
            break;
        }
        case ChatFamily::GEMMA: {
            // Gemma 3 puts the system text before the first user turn's content (Gemma 1/2 refuse it)
            out += f.bos;
            for (size_t i = first; i < msgs.size(); ++i) {
                const ChatMessage& m = msgs[i];
                const std::string prefix = i == first && has_system ? system + "\n\n" : "";
                out += "<start_of_turn>" + std::string(m.role == "assistant" ? "model" : m.role) + "\n" + prefix +
                       trim(m.content) + "<end_of_turn>\n";
            }
            if (gen) out += "<start_of_turn>model\n";
            break;
        }
        case ChatFamily::PHI3: {
            for (const ChatMessage& m : msgs) out += "<|" + m.role + "|>\n" + m.content + "<|end|>\n";
            if (gen) out += "<|assistant|>\n";
            else if (mode == RenderMode::CLOSED) out += f.eos;
            break;
        }
        case ChatFamily::ZEPHYR: {
            for (const ChatMessage& m : msgs) out += "<|" + m.role + "|>\n" + m.content + f.eos + "\n";
            if (gen) out += "<|assistant|>\n";
            break;
        }
        case ChatFamily::DEEPSEEK2: {
            out += f.bos;
            for (const ChatMessage& m : msgs) {
                if (m.role == "system") out += m.content + "\n\n";
                else if (m.role == "user") out += "User: " + m.content + "\n\n";
                else out += "Assistant: " + m.content + f.eos;
            }
            if (gen) out += "Assistant:";
            break;
        }
        case ChatFamily::DEEPSEEK3: {
            // R1 keeps only the answer of earlier replies: the text after the last </think>
            out += f.bos + system;
            for (size_t i = first; i < msgs.size(); ++i) {
                const ChatMessage& m = msgs[i];
                if (m.role == "user") {
                    out += "<\uFF5CUser\uFF5C>" + m.content;
                } else {
                    const size_t think_end = m.content.rfind("</think>");
                    out += "<\uFF5CAssistant\uFF5C>" +
                           (think_end == std::string::npos ? m.content : m.content.substr(think_end + 8)) +
                           "<\uFF5Cend\u2581of\u2581sentence\uFF5C>";
                }
            }
            if (gen) out += f.opens_think ? "<\uFF5CAssistant\uFF5C><think>\n" : "<\uFF5CAssistant\uFF5C>";
            break;
        }
        case ChatFamily::VICUNA: {
            for (const ChatMessage& m : msgs) {
                if (m.role == "system")
                    out += f.vicuna_system_tag ? "SYSTEM: " + m.content + "\n" : m.content + "\n\n";
                else if (m.role == "user") out += "USER: " + m.content + "\n";
                else out += "ASSISTANT: " + m.content + "</s>\n";
            }
            if (gen) out += "ASSISTANT:";
            break;
        }
        case ChatFamily::PLAIN: {
            for (const ChatMessage& m : msgs) {
                if (m.role == "system") out += m.content + "\n";
                else if (m.role == "user") out += "User: " + m.content + "\n";
                else out += "Assistant:" + m.content + "\n";
            }
            if (gen) out += "Assistant:";
            break;
        }
    }
    return out;
}

// Stands for the reply while finding the text the format puts after it; survives trimming.
const char* const kReplyMark = "\x01\x02reply\x02\x01";

}  // namespace

const char* ChatFormat::name() const {
    switch (family) {
        case ChatFamily::CHATML: return "ChatML";
        case ChatFamily::LLAMA3: return "Llama 3";
        case ChatFamily::LLAMA2: return "Llama 2";
        case ChatFamily::MISTRAL: return "Mistral";
        case ChatFamily::GEMMA: return "Gemma";
        case ChatFamily::PHI3: return "Phi-3";
        case ChatFamily::ZEPHYR: return "Zephyr";
        case ChatFamily::DEEPSEEK2: return "DeepSeek 2";
        case ChatFamily::DEEPSEEK3: return "DeepSeek 3";
        case ChatFamily::VICUNA: return "Vicuna";
        case ChatFamily::PLAIN: break;
    }
    return "plain";
}

ChatFormat detect_chat_format(const std::string& t, const std::string& bos, const std::string& eos) {
    ChatFormat plain;
    plain.bos = bos;
    plain.eos = eos;
    ChatFormat f = plain;
    if (t.empty()) return f;
    if (contains(t, "<|im_start|>")) {
        if (contains(t, "<|im_sep|>")) return f;  // Phi-4: <|im_start|> turns but another layout
        f.family = ChatFamily::CHATML;
        f.default_system = chatml_default_system(t);
        f.opens_think = contains(t, "'<think>\\n'");
        // the content filtered by trim: `text_of(message.content)|trim`, `message.content | trim`
        f.trims_content = contains(t, "content)|trim") || contains(t, "content) | trim") ||
                          contains(t, "content|trim") || contains(t, "content | trim");
    } else if (contains(t, "<|start_header_id|>") && contains(t, "<|end_header_id|>")) {
        f.family = ChatFamily::LLAMA3;
        f.knowledge_date = literal_after(t, "Cutting Knowledge Date: ");
        if (!f.knowledge_date.empty()) {
            f.today = llama3_today(t);
            if (f.today.empty()) f = plain;  // no date to put in the header
        }
    } else if (contains(t, "<start_of_turn>")) {
        f.family = ChatFamily::GEMMA;
        f.system_role = !contains(t, "System role not supported");
    } else if (contains(t, "[INST]")) {
        // Mistral v0.3+ ([AVAILABLE_TOOLS]) and v7 ([SYSTEM_PROMPT]) lay out turns differently
        if (contains(t, "[AVAILABLE_TOOLS]") || contains(t, "[SYSTEM_PROMPT]")) return f;
        if (contains(t, "<<SYS>>")) {
            f.family = ChatFamily::LLAMA2;
        } else {
            f.family = ChatFamily::MISTRAL;
            f.system_role = false;
        }
    } else if (contains(t, "<|user|>") && contains(t, "<|end|>")) {
        f.family = ChatFamily::PHI3;
    } else if (contains(t, "<|user|>") && contains(t, "<|assistant|>")) {
        f.family = ChatFamily::ZEPHYR;
    } else if (contains(t, "<\uFF5CUser\uFF5C>") && contains(t, "<\uFF5CAssistant\uFF5C>")) {
        f.family = ChatFamily::DEEPSEEK3;
        f.opens_think = contains(t, "<\uFF5CAssistant\uFF5C><think>\\n");
    } else if (contains(t, "'Assistant: ' + message['content'] + eos_token")) {
        f.family = ChatFamily::DEEPSEEK2;
    } else if (contains(t, "USER: ") && contains(t, "ASSISTANT: ")) {
        f.family = ChatFamily::VICUNA;
        f.vicuna_system_tag = contains(t, "SYSTEM: ");
    }
    return f;
}

std::string render_chat(const ChatFormat& fmt, const std::vector<ChatMessage>& messages,
                        bool add_generation_prompt) {
    return render(fmt, messages, add_generation_prompt ? RenderMode::GENERATION : RenderMode::CLOSED);
}

std::string ChatSession::render_open(const std::vector<ChatMessage>& messages) const {
    return render(fmt_, messages, RenderMode::OPEN);
}

void ChatSession::set_system(const std::string& text) {
    if (!messages_.empty()) throw Error("the system prompt must be set before the first message");
    if (!fmt_.system_role) no_system_role(fmt_);
    messages_.push_back({"system", text});
}

std::string ChatSession::add_user(const std::string& text) {
    // what the cache holds: the conversation so far (the system prompt alone is not evaluated yet)
    const bool started = !messages_.empty() && messages_.back().role == "assistant";
    const std::string cached = started ? render_open(messages_) : "";
    messages_.push_back({"user", text});
    const std::string full = render(fmt_, messages_, RenderMode::GENERATION);
    if (full.compare(0, cached.size(), cached) != 0) {
        messages_.pop_back();
        throw Error(std::string("chat format ") + fmt_.name() + ": a new turn changes the earlier text; "
                    "this conversation cannot be continued incrementally");
    }
    return full.substr(cached.size());
}

std::string ChatSession::end_reply(const std::string& reply, const std::string& eog_text) {
    std::vector<ChatMessage> marked = messages_;
    marked.push_back({"assistant", kReplyMark});
    const std::string text = render_open(marked);
    std::string closing = text.substr(text.rfind(kReplyMark) + std::string(kReplyMark).size());
    if (!eog_text.empty()) {
        const size_t at = closing.find(eog_text);
        if (at != std::string::npos) closing = closing.substr(at + eog_text.size());
    }
    messages_.push_back({"assistant", reply});
    return closing;
}

}  // namespace bonsai
