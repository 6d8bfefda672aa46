// GBNF (llama.cpp's grammar format) -> llguidance Lark (see bonsai/grammar.h).
//
// GBNF, as llama.cpp's grammar parser reads it:
//   rule     := name ws "::=" ws* alts (newline | end)          name: [A-Za-z0-9_-]+
//   alts     := seq ("|" ws* seq)*
//   seq      := (item repeat?)*       a newline ends the sequence unless inside ( ... )
//   item     := "literal" | [class] | [^class] | name | ( alts ) | .
//   repeat   := * | + | ? | {m} | {m,} | {m,n}
//   escapes  := \n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH (in literals and classes)
//   comments := # to the end of the line
// The Lark written: `%llguidance {}`, then one line per rule `name: alt | alt`. Literals become
// JSON-escaped strings, classes `/[...]/` regexes with every character but [A-Za-z0-9 ] written
// as \x{HEX} (so no regex metacharacter or '/' can leak), `.` becomes /(?s:.)/ (any character,
// newline included, as in llama.cpp). Rule names are lower-cased with '-' -> '_' (made unique);
// a rule (other than root) whose body is made only of literals, classes, `.` and such rules is
// written as an upper-case Lark terminal, one lexeme, as llguidance's Python converter does: far
// faster masks, and what its docs require for repeated character classes.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "bonsai/error.h"
#include "bonsai/grammar.h"
#include "bonsai/unicode.h"

namespace bonsai {

namespace {

struct Node {
    enum Type { LITERAL, CLASS, ANY, REF, SEQ, ALT, REPEAT } type = SEQ;
    std::string text;          // LITERAL: the Lark string; CLASS: the Lark regex; REF: the GBNF name
    std::vector<Node> kids;    // SEQ / ALT items; REPEAT: the one repeated node
    int64_t min = 0, max = -1; // REPEAT bounds, max -1 = unbounded
    size_t pos = 0;            // REF: where it is used (for "undefined rule" errors)
};

struct Rule {
    std::string name;
    Node body;  // an ALT
    size_t pos = 0;
};

bool is_word_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

std::string hex(uint32_t v, int width) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%0*X", width, v);
    return buf;
}

// A code point as a Lark (JSON) string character.
void append_string_char(std::string& out, uint32_t cp) {
    if (cp == '"' || cp == '\\') {
        out += '\\';
        out += static_cast<char>(cp);
    } else if (cp < 0x20 || cp == 0x7F) {
        out += "\\u" + hex(cp, 4);
    } else {
        unicode::append_utf8(out, cp);
    }
}

// A code point inside a regex character class.
std::string class_char(uint32_t cp) {
    const bool plain = (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9') || cp == ' ';
    return plain ? std::string(1, static_cast<char>(cp)) : "\\x{" + hex(cp, 2) + "}";
}

class Parser {
public:
    explicit Parser(const std::string& s) : s_(s) {}

    std::vector<Rule> parse() {
        std::vector<Rule> rules;
        skip_space(true);
        while (i_ < s_.size()) {
            Rule r;
            r.pos = i_;
            r.name = parse_name();
            skip_space(false);
            if (s_.compare(i_, 3, "::=") != 0) fail("expected '::=' after the rule name '" + r.name + "'");
            i_ += 3;
            skip_space(true);
            r.body = parse_alts(false);
            if (i_ < s_.size() && s_[i_] == '\r') ++i_;
            if (i_ < s_.size() && s_[i_] != '\n') fail(unexpected("a newline after the rule"));
            skip_space(true);
            rules.push_back(std::move(r));
        }
        return rules;
    }

    [[noreturn]] void fail_at(size_t pos, const std::string& what) const {
        size_t line = 1, col = 1;
        for (size_t k = 0; k < pos && k < s_.size(); ++k) {
            if (s_[k] == '\n') {
                ++line;
                col = 1;
            } else {
                ++col;
            }
        }
        throw Error("line " + std::to_string(line) + ", column " + std::to_string(col) + ": " + what);
    }

private:
    [[noreturn]] void fail(const std::string& what) const { fail_at(i_, what); }

    std::string unexpected(const std::string& expected) const {
        if (i_ >= s_.size()) return "expected " + expected + ", found the end of the grammar";
        const unsigned char c = static_cast<unsigned char>(s_[i_]);
        const std::string found = c >= 0x20 && c < 0x7F ? "'" + std::string(1, s_[i_]) + "'" : "byte 0x" + hex(c, 2);
        return "expected " + expected + ", found " + found;
    }

    void skip_space(bool newlines) {
        while (i_ < s_.size()) {
            const char c = s_[i_];
            if (c == ' ' || c == '\t' || (newlines && (c == '\r' || c == '\n'))) {
                ++i_;
            } else if (c == '#') {
                while (i_ < s_.size() && s_[i_] != '\n' && s_[i_] != '\r') ++i_;
            } else {
                break;
            }
        }
    }

    std::string parse_name() {
        const size_t start = i_;
        while (i_ < s_.size() && is_word_char(s_[i_])) ++i_;
        if (i_ == start) fail(unexpected("a rule name"));
        return s_.substr(start, i_ - start);
    }

    int64_t parse_int() {
        const size_t start = i_;
        int64_t v = 0;
        while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
            v = v * 10 + (s_[i_++] - '0');
            if (v > 1000000) fail_at(start, "repetition count too large");
        }
        if (i_ == start) fail(unexpected("a number"));
        return v;
    }

    uint32_t parse_hex(size_t digits) {
        uint32_t v = 0;
        for (size_t k = 0; k < digits; ++k, ++i_) {
            const char c = i_ < s_.size() ? s_[i_] : '\0';
            const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                        : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
            if (d < 0) fail("expected " + std::to_string(digits) + " hex digits in the escape");
            v = v * 16 + static_cast<uint32_t>(d);
        }
        if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) fail("the escape is not a Unicode scalar value");
        return v;
    }

    // One character of a literal or class: an escape or one UTF-8 encoded code point.
    uint32_t parse_char() {
        if (i_ >= s_.size()) fail("unterminated literal or character class");
        const unsigned char c = static_cast<unsigned char>(s_[i_]);
        if (c == '\\') {
            ++i_;
            if (i_ >= s_.size()) fail("incomplete escape at the end of the grammar");
            const char e = s_[i_++];
            switch (e) {
                case 'n': return '\n';
                case 'r': return '\r';
                case 't': return '\t';
                case '\\': case '"': case '[': case ']': return static_cast<uint32_t>(e);
                case 'x': return parse_hex(2);
                case 'u': return parse_hex(4);
                case 'U': return parse_hex(8);
                default: --i_; fail(std::string("unknown escape '\\") + e + "' (use \\n \\r \\t \\\\ \\\" \\[ \\] "
                                    "\\xHH \\uHHHH or \\UHHHHHHHH)");
            }
        }
        const int n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
        if (n == 0 || i_ + n > s_.size()) fail("invalid UTF-8");
        uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
        for (int k = 1; k < n; ++k) {
            const unsigned char cc = static_cast<unsigned char>(s_[i_ + k]);
            if ((cc & 0xC0) != 0x80) fail("invalid UTF-8");
            cp = (cp << 6) | (cc & 0x3F);
        }
        i_ += static_cast<size_t>(n);
        return cp;
    }

    Node parse_literal() {
        ++i_;  // "
        Node n;
        n.type = Node::LITERAL;
        n.text = "\"";
        while (true) {
            if (i_ >= s_.size()) fail("unterminated literal (missing closing '\"')");
            if (s_[i_] == '"') break;
            append_string_char(n.text, parse_char());
        }
        ++i_;
        n.text += '"';
        return n;
    }

    Node parse_class() {
        const size_t start = i_++;  // [
        Node n;
        n.type = Node::CLASS;
        n.text = "/[";
        if (i_ < s_.size() && s_[i_] == '^') {
            n.text += '^';
            ++i_;
        }
        bool empty = true;
        while (true) {
            if (i_ >= s_.size()) fail_at(start, "unterminated character class (missing ']')");
            if (s_[i_] == ']') break;
            const uint32_t lo = parse_char();
            n.text += class_char(lo);
            if (i_ + 1 < s_.size() && s_[i_] == '-' && s_[i_ + 1] != ']') {
                ++i_;
                const uint32_t hi = parse_char();
                if (hi < lo) fail("character range out of order in the class");
                n.text += "-" + class_char(hi);
            }
            empty = false;
        }
        ++i_;
        if (empty) fail_at(start, "empty character class []");
        n.text += "]/";
        return n;
    }

    void parse_repeat(std::vector<Node>& items) {
        if (i_ >= s_.size() || items.empty()) return;
        int64_t lo = 0, hi = -1;
        const char c = s_[i_];
        if (c == '*') {
            ++i_;
        } else if (c == '+') {
            lo = 1;
            ++i_;
        } else if (c == '?') {
            hi = 1;
            ++i_;
        } else if (c == '{') {
            const size_t start = i_++;
            skip_space(true);
            lo = hi = parse_int();
            skip_space(true);
            if (i_ < s_.size() && s_[i_] == ',') {
                ++i_;
                skip_space(true);
                hi = i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9' ? parse_int() : -1;
                skip_space(true);
            }
            if (i_ >= s_.size() || s_[i_] != '}') fail(unexpected("'}' closing the repetition"));
            ++i_;
            if (hi >= 0 && hi < lo) fail_at(start, "repetition {m,n} with n < m");
        } else {
            return;
        }
        Node r;
        r.type = Node::REPEAT;
        r.min = lo;
        r.max = hi;
        r.kids.push_back(std::move(items.back()));
        items.back() = std::move(r);
    }

    Node parse_seq(bool nested) {
        Node seq;
        seq.type = Node::SEQ;
        while (i_ < s_.size()) {
            const char c = s_[i_];
            if (c == '"') {
                seq.kids.push_back(parse_literal());
            } else if (c == '[') {
                seq.kids.push_back(parse_class());
            } else if (c == '.') {
                ++i_;
                Node n;
                n.type = Node::ANY;
                n.text = "/(?s:.)/";
                seq.kids.push_back(n);
            } else if (c == '(') {
                const size_t start = i_++;
                if (++depth_ > kMaxDepth) fail_at(start, "groups nested deeper than " + std::to_string(kMaxDepth));
                skip_space(true);
                seq.kids.push_back(parse_alts(true));
                if (i_ >= s_.size() || s_[i_] != ')') fail_at(start, "unclosed '(' (missing ')')");
                ++i_;
                --depth_;
            } else if (is_word_char(c)) {
                Node n;
                n.type = Node::REF;
                n.pos = i_;
                n.text = parse_name();
                seq.kids.push_back(n);
            } else {
                break;
            }
            skip_space(nested);
            parse_repeat(seq.kids);
            skip_space(nested);
        }
        return seq;
    }

    Node parse_alts(bool nested) {
        Node alts;
        alts.type = Node::ALT;
        alts.kids.push_back(parse_seq(nested));
        while (i_ < s_.size() && s_[i_] == '|') {
            ++i_;
            skip_space(true);
            alts.kids.push_back(parse_seq(nested));
        }
        return alts;
    }

    static constexpr int kMaxDepth = 200;  // nesting of ( ... ): bounds every recursion over the tree

    const std::string& s_;
    size_t i_ = 0;
    int depth_ = 0;
};

// Writes rules as Lark, deciding which are terminals and naming them.
class LarkWriter {
public:
    LarkWriter(std::vector<Rule>& rules, const Parser& parser) : rules_(rules), parser_(parser) {
        for (size_t k = 0; k < rules_.size(); ++k) {
            if (!index_.emplace(rules_[k].name, k).second)
                parser_.fail_at(rules_[k].pos, "rule '" + rules_[k].name + "' is defined twice");
        }
        if (!index_.count("root")) throw Error("the grammar has no 'root' rule (the rule generation starts from)");
        for (const Rule& r : rules_) check_refs(r.body);
        terminal_.assign(rules_.size(), false);
        for (bool changed = true; changed;) {
            changed = false;
            for (size_t k = 0; k < rules_.size(); ++k) {
                if (!terminal_[k] && rules_[k].name != "root" && is_terminal(rules_[k].body)) {
                    terminal_[k] = true;
                    changed = true;
                }
            }
        }
        std::set<std::string> used = {"start"};
        for (size_t k = 0; k < rules_.size(); ++k) {
            if (rules_[k].name == "root") {
                names_.push_back("start");
                continue;
            }
            std::string base;
            for (char c : rules_[k].name) base += c == '-' ? '_' : static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c);
            if (!(base[0] >= 'a' && base[0] <= 'z')) base = "r" + base;
            std::string name = base;
            for (int n = 2; used.count(name); ++n) name = base + "_" + std::to_string(n);
            used.insert(name);
            if (terminal_[k]) std::transform(name.begin(), name.end(), name.begin(), ::toupper);
            names_.push_back(name);
        }
    }

    std::string write() const {
        std::string out = "%llguidance {}\n\n";
        for (size_t k = 0; k < rules_.size(); ++k) {
            out += names_[k] + ": ";
            const Node& body = rules_[k].body;
            for (size_t a = 0; a < body.kids.size(); ++a) out += (a ? " | " : "") + emit(body.kids[a]);
            out += "\n";
        }
        return out;
    }

private:
    void check_refs(const Node& n) const {
        if (n.type == Node::REF && !index_.count(n.text))
            parser_.fail_at(n.pos, "undefined rule '" + n.text + "'; define it with '" + n.text + " ::= ...'");
        for (const Node& k : n.kids) check_refs(k);
    }

    bool is_terminal(const Node& n) const {
        if (n.type == Node::REF) return terminal_[index_.at(n.text)];
        return std::all_of(n.kids.begin(), n.kids.end(), [this](const Node& k) { return is_terminal(k); });
    }

    // A node as Lark; `atom` asks for something a repetition can follow.
    std::string emit(const Node& n, bool atom = false) const {
        switch (n.type) {
            case Node::LITERAL: case Node::CLASS: case Node::ANY: return n.text;
            case Node::REF: return names_[index_.at(n.text)];
            case Node::SEQ: {
                if (n.kids.empty()) return "\"\"";
                if (n.kids.size() == 1) return emit(n.kids[0], atom);
                std::string s;
                for (const Node& k : n.kids) s += (s.empty() ? "" : " ") + emit(k);
                return atom ? "(" + s + ")" : s;
            }
            case Node::ALT: {
                if (n.kids.size() == 1) return emit(n.kids[0], atom);
                std::string s;
                for (const Node& k : n.kids) s += (s.empty() ? "" : " | ") + emit(k);
                return "(" + s + ")";
            }
            case Node::REPEAT: {
                const std::string inner = emit(n.kids[0], true);
                if (n.min == 0 && n.max < 0) return inner + "*";
                if (n.min == 1 && n.max < 0) return inner + "+";
                if (n.min == 0 && n.max == 1) return inner + "?";
                return inner + "{" + std::to_string(n.min) + "," + (n.max < 0 ? "" : std::to_string(n.max)) + "}";
            }
        }
        return "";
    }

    std::vector<Rule>& rules_;
    const Parser& parser_;
    std::map<std::string, size_t> index_;
    std::vector<bool> terminal_;
    std::vector<std::string> names_;
};

}  // namespace

bool is_gbnf(const std::string& text) {
    size_t i = 0;
    while (i < text.size()) {
        while (i < text.size() && (text[i] == ' ' || text[i] == '\t')) ++i;
        const size_t start = i;
        while (i < text.size() && is_word_char(text[i])) ++i;
        if (i > start) {
            while (i < text.size() && (text[i] == ' ' || text[i] == '\t')) ++i;
            if (text.compare(i, 3, "::=") == 0) return true;
        }
        i = text.find('\n', i);
        if (i == std::string::npos) break;
        ++i;
    }
    return false;
}

std::string gbnf_to_lark(const std::string& gbnf) {
    Parser parser(gbnf);
    std::vector<Rule> rules = parser.parse();
    if (rules.empty()) throw Error("the grammar is empty; give at least 'root ::= ...'");
    return LarkWriter(rules, parser).write();
}

}  // namespace bonsai
