// The --config JSON reader (see config_json.h); moved out of cli_args.cpp unchanged.
#include "config_json.h"

#include <cctype>
#include <string>
#include <utility>
#include <vector>

#include "bonsai/error.h"

namespace bonsai {

namespace {

// Minimal JSON reader for a flat object of string/number/bool values (the --config file).
class ConfigReader {
public:
    ConfigReader(std::string text, std::string path) : s_(std::move(text)), path_(std::move(path)) {}

    // Returns (key, value as command-line text) pairs in file order; booleans as "true"/"false".
    std::vector<std::pair<std::string, std::string>> read_object() {
        std::vector<std::pair<std::string, std::string>> out;
        expect('{');
        if (peek() == '}') {
            ++i_;
        } else {
            for (;;) {
                std::string key = read_string();
                expect(':');
                out.emplace_back(key, read_value(key));
                if (peek() == ',') {
                    ++i_;
                    continue;
                }
                expect('}');
                break;
            }
        }
        if (peek() != '\0') fail("unexpected text after the closing '}'");
        return out;
    }

private:
    [[noreturn]] void fail(const std::string& what) const {
        throw Error("--config " + path_ + ": " + what + " at byte " + std::to_string(i_) +
                    "; the file must be one JSON object such as {\"ctx-size\": 4096, \"temp\": 0.2}");
    }
    char peek() {
        while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r')) ++i_;
        return i_ < s_.size() ? s_[i_] : '\0';
    }
    void expect(char c) {
        if (peek() != c) fail(std::string("expected '") + c + "'");
        ++i_;
    }
    std::string read_string() {
        expect('"');
        std::string out;
        while (i_ < s_.size() && s_[i_] != '"') {
            char c = s_[i_++];
            if (c == '\\') {
                if (i_ >= s_.size()) break;
                const char e = s_[i_++];
                switch (e) {
                    case 'n': c = '\n'; break;
                    case 't': c = '\t'; break;
                    case 'r': c = '\r'; break;
                    case '"': case '\\': case '/': c = e; break;
                    default: fail(std::string("unsupported escape '\\") + e + "'");
                }
            }
            out += c;
        }
        if (i_ >= s_.size()) fail("unterminated string");
        ++i_;
        return out;
    }
    // Value as the text a command-line argument would carry; booleans as "true"/"false".
    std::string read_value(const std::string& key) {
        const char c = peek();
        if (c == '"') return read_string();
        const size_t start = i_;
        while (i_ < s_.size() && std::string(",} \n\t\r").find(s_[i_]) == std::string::npos) ++i_;
        const std::string tok = s_.substr(start, i_ - start);
        if (tok == "true" || tok == "false") return tok;
        if (!tok.empty() && (std::isdigit(static_cast<unsigned char>(tok[0])) || tok[0] == '-'))
            return tok;
        i_ = start;
        fail("the value of \"" + key + "\" must be a string, a number, true or false");
    }

    std::string s_;
    std::string path_;
    size_t i_ = 0;
};

}  // namespace

std::vector<std::pair<std::string, std::string>> read_config_object(const std::string& text, const std::string& path) {
    return ConfigReader(text, path).read_object();
}

}  // namespace bonsai
