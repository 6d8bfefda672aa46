// Unit tests of bonsai_run's chat formats (bonsai/chat_format.h): which family each template's
// markers select, the variants read from the text (Qwen 2's default system turn, Qwen 3.5's open
// <think>, Gemma 1/2 refusing a system message), and ChatSession's increments: each turn adds only
// its own text, and the end of a reply is what the format puts after the content minus the
// end-of-generation token already in the cache. (tests/test_bonsai_run_cli.py compares the
// rendered text with jinja2 for every family.)
#include <cstdio>
#include <string>
#include <vector>

#include "bonsai/chat_format.h"
#include "check.h"

using namespace bonsai;

namespace {

ChatFormat detect(const std::string& t) { return detect_chat_format(t, "<s>", "</s>"); }

void test_detect() {
    CHECK(detect("").family == ChatFamily::PLAIN);
    CHECK(detect("{{ messages }}").family == ChatFamily::PLAIN);
    CHECK(detect("{{'<|im_start|>' + m['role'] + '\\n'}}").family == ChatFamily::CHATML);
    CHECK(detect("<|im_start|>user<|im_sep|>").family == ChatFamily::PLAIN);  // Phi-4 is not ChatML
    CHECK(detect("<|start_header_id|>x<|end_header_id|>").family == ChatFamily::LLAMA3);
    CHECK(detect("<|start_header_id|> only").family == ChatFamily::PLAIN);
    CHECK(detect("bos_token + '[INST] ' + '<<SYS>>\\n'").family == ChatFamily::LLAMA2);
    const ChatFormat mistral = detect("{{ '[INST] ' + message['content'] + ' [/INST]' }}");
    CHECK(mistral.family == ChatFamily::MISTRAL && !mistral.system_role);
    CHECK(detect("[INST] [AVAILABLE_TOOLS]").family == ChatFamily::PLAIN);
    CHECK(detect("[SYSTEM_PROMPT] [INST]").family == ChatFamily::PLAIN);
    const ChatFormat gemma = detect("raise_exception('System role not supported') <start_of_turn>");
    CHECK(gemma.family == ChatFamily::GEMMA && !gemma.system_role);
    CHECK(detect("<start_of_turn>").system_role);  // Gemma 3 merges it into the first user turn
    CHECK(detect("<|user|>\\n <|end|> <|assistant|>").family == ChatFamily::PHI3);
    CHECK(detect("<|user|>\\n eos_token <|assistant|>").family == ChatFamily::ZEPHYR);
    CHECK(detect("{{ 'Assistant: ' + message['content'] + eos_token }}").family == ChatFamily::DEEPSEEK2);
    const ChatFormat vicuna = detect("'USER: ' 'ASSISTANT: '");
    CHECK(vicuna.family == ChatFamily::VICUNA && !vicuna.vicuna_system_tag);
    CHECK(detect("'SYSTEM: ' 'USER: ' 'ASSISTANT: '").vicuna_system_tag);
    CHECK(std::string(detect("").name()) == "plain" && std::string(detect("<|im_start|>").name()) == "ChatML");
}

void test_chatml_variants() {
    const ChatFormat qwen2 = detect("{% if loop.first and messages[0]['role'] != 'system' %}"
                                    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}");
    CHECK(qwen2.default_system == "You are a helpful assistant.");
    CHECK(render_chat(qwen2, {{"user", "hi"}}, true) ==
          "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
          "<|im_start|>assistant\n");
    CHECK(render_chat(qwen2, {{"system", "S"}, {"user", "hi"}}, false) ==
          "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n");
    // an expression after the system header is not a default text
    CHECK(detect("'<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n'").default_system.empty());
    const ChatFormat qwen35 = detect("<|im_start|> {{- '<think>\\n' }} {{- '<think>\\n\\n</think>\\n\\n' }}");
    CHECK(qwen35.opens_think && !qwen35.trims_content && !qwen2.trims_content);
    const ChatFormat trims = detect("<|im_start|> {%- set content = text_of(message.content)|trim %}");
    CHECK(trims.trims_content);
    CHECK(render_chat(trims, {{"user", " hi \n"}}, false) == "<|im_start|>user\nhi<|im_end|>\n");
    CHECK(!detect("<|im_start|> {{- '<think>\\n\\n</think>\\n\\n' }}").opens_think);
    CHECK(render_chat(qwen35, {{"user", "hi"}}, true) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n");
}

void test_llama3_and_deepseek3_variants() {
    const std::string l31 = "<|start_header_id|><|end_header_id|> {%- set date_string = \"26 Jul 2024\" %} "
                            "{{- \"Cutting Knowledge Date: December 2023\\n\" }}";
    const ChatFormat f31 = detect(l31);
    CHECK(f31.family == ChatFamily::LLAMA3 && f31.knowledge_date == "December 2023" && f31.today == "26 Jul 2024");
    CHECK(render_chat(f31, {{"user", "a"}}, false) ==
          "<s><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: "
          "26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\na<|eot_id|>");
    const ChatFormat f32 = detect(l31 + " strftime_now(\"%Y\")");
    CHECK(f32.today.size() == 4 && f32.today != "26 Jul 2024");  // this year, as strftime_now gives it
    CHECK(detect("<|start_header_id|><|end_header_id|>").knowledge_date.empty());  // Llama 3.0

    const ChatFormat r1 = detect("<\uFF5CUser\uFF5C> {{'<\uFF5CAssistant\uFF5C><think>\\n'}}");
    CHECK(r1.family == ChatFamily::DEEPSEEK3 && r1.opens_think);
    CHECK(!detect("<\uFF5CUser\uFF5C> <\uFF5CAssistant\uFF5C>").opens_think);
    CHECK(render_chat(r1, {{"system", "S"}, {"user", "a"}, {"assistant", "<think>\nhm\n</think>\n\nok"}}, false) ==
          "<s>S<\uFF5CUser\uFF5C>a<\uFF5CAssistant\uFF5C>\n\nok<\uFF5Cend\u2581of\u2581sentence\uFF5C>");
}

void test_session_increments() {
    ChatSession chatml(detect("<|im_start|>"));
    chatml.set_system("S");
    CHECK(chatml.add_user("a") == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n");
    CHECK(chatml.end_reply("x", "<|im_end|>") == "\n");  // the end-of-turn token is already in the cache
    CHECK(chatml.add_user("b") == "<|im_start|>user\nb<|im_end|>\n<|im_start|>assistant\n");
    CHECK(chatml.end_reply("y", "") == "<|im_end|>\n");   // stopped by -n or -r: close the turn
    CHECK(chatml.messages().size() == 5);
    ChatSession other_end(detect("<|im_start|>"));
    other_end.add_user("a");
    CHECK(other_end.end_reply("x", "<|endoftext|>") == "<|im_end|>\n");  // another end token: close the turn

    ChatSession llama2(detect("[INST] <<SYS>>"));
    llama2.set_system("S");
    CHECK(llama2.add_user(" a ") == "<s>[INST] <<SYS>>\nS\n<</SYS>>\n\n a [/INST]");  // strip() of the merged text
    CHECK(llama2.end_reply(" x", "</s>").empty());  // " x </s>": nothing after the EOS
    CHECK(llama2.add_user("b") == "<s>[INST] b [/INST]");
    CHECK(llama2.end_reply("y", "") == " </s>");

    ChatSession llama3(detect("<|start_header_id|><|end_header_id|>"));
    CHECK(llama3.add_user("a") == "<s><|start_header_id|>user<|end_header_id|>\n\na<|eot_id|>"
                                  "<|start_header_id|>assistant<|end_header_id|>\n\n");
    CHECK(llama3.end_reply("x", "<|eot_id|>").empty());
    CHECK(llama3.add_user("b") == "<|start_header_id|>user<|end_header_id|>\n\nb<|eot_id|>"
                                  "<|start_header_id|>assistant<|end_header_id|>\n\n");

    // Phi-3 ends a finished conversation with EOS; between turns the cache holds the open text
    ChatSession phi3(detect("<|user|> <|end|>"));
    CHECK(phi3.add_user("a") == "<|user|>\na<|end|>\n<|assistant|>\n");
    CHECK(render_chat(phi3.format(), phi3.messages(), false) == "<|user|>\na<|end|>\n</s>");
    CHECK(phi3.end_reply("x", "<|end|>") == "\n");
    CHECK(phi3.add_user("b") == "<|user|>\nb<|end|>\n<|assistant|>\n");

    ChatSession plain(detect(""));
    plain.set_system("S");
    CHECK(plain.add_user("a") == "S\nUser: a\nAssistant:");
    CHECK(plain.end_reply(" x", "</s>") == "\n");
    CHECK(plain.add_user("b") == "User: b\nAssistant:");
}

void test_errors() {
    ChatSession gemma(detect("System role not supported <start_of_turn>"));
    CHECK_THROWS(gemma.set_system("S"), "has no system role; drop -sys/--system-prompt");
    CHECK_THROWS(render_chat(detect("[INST]"), {{"system", "S"}, {"user", "a"}}, true), "has no system role");
    CHECK_THROWS(render_chat(detect("<|im_start|>"), {{"tool", "x"}}, true), "role 'tool' is not supported");
    CHECK_THROWS(render_chat(detect("<|im_start|>"), {{"user", "a"}, {"system", "S"}}, true),
                 "only be the first message");
    ChatSession late(detect("<|im_start|>"));
    late.add_user("a");
    CHECK_THROWS(late.set_system("S"), "before the first message");
}

}  // namespace

int main() {
    test_detect();
    test_chatml_variants();
    test_llama3_and_deepseek3_variants();
    test_session_increments();
    test_errors();
    if (g_failures) {
        std::fprintf(stderr, "test_chat_format: %d failure(s)\n", g_failures);
        return 1;
    }
    std::printf("test_chat_format: all passed\n");
    return 0;
}
