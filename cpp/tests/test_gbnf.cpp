// Unit tests of the GBNF -> Lark translator (grammar.h): the Lark written for each construct,
// terminal promotion, names, escapes, GBNF detection and every parse error with its position.
// Whether the Lark accepts the same strings as llguidance's own converter is checked from Python
// (tests/test_bonsai_run_grammar.py), which runs this binary as `test_gbnf --to-lark FILE`.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "bonsai/error.h"
#include "bonsai/grammar.h"
#include "check.h"

using namespace bonsai;

namespace {

bool contains(const std::string& s, const std::string& needle) {
    const bool ok = s.find(needle) != std::string::npos;
    if (!ok) std::fprintf(stderr, "expected '%s' in:\n%s\n", needle.c_str(), s.c_str());
    return ok;
}

void test_constructs() {
    const std::string l = gbnf_to_lark("root ::= (\"yes\" | \"no\") \" \" [0-9]{2,3}\n");
    CHECK(contains(l, "%llguidance {}"));
    CHECK(contains(l, "start: (\"yes\" | \"no\") \" \" /[0-9]/{2,3}\n"));

    const std::string g = gbnf_to_lark(
        "# a comment line\n"
        "root ::= item (\",\" item)* # trailing comment\n"
        "item ::= word | number\n"
        "word ::= [a-zA-Z_-]+\n"
        "number ::= \"-\"? [0-9]{1,} (\".\" [0-9]+)? | \"0\"{3}\n");
    CHECK(contains(g, "start: ITEM (\",\" ITEM)*\n"));
    CHECK(contains(g, "ITEM: WORD | NUMBER\n"));  // only terminals inside: a terminal itself
    CHECK(contains(g, "WORD: /[a-zA-Z\\x{5F}\\x{2D}]/+\n"));
    CHECK(contains(g, "NUMBER: \"-\"? /[0-9]/+ (\".\" /[0-9]/+)? | \"0\"{3,3}\n"));

    // recursion keeps a rule a rule; `.` is any character, newline included
    const std::string r = gbnf_to_lark("root ::= list\nlist ::= \"[\" (list | .)* \"]\"\n");
    CHECK(contains(r, "list: \"[\" (list | /(?s:.)/)* \"]\"\n"));

    // alternatives continue after '|' on the next line; groups span lines
    const std::string m = gbnf_to_lark("root ::= \"a\" |\n  \"b\" | (\n  \"c\"\n  \"d\" )\n");
    CHECK(contains(m, "start: \"a\" | \"b\" | \"c\" \"d\"\n"));
    // an empty alternative
    CHECK(contains(gbnf_to_lark("root ::= \"x\" | \n"), "start: \"x\" | \"\"\n"));
}

void test_escapes_and_names() {
    const std::string e =
        gbnf_to_lark("root ::= \"q\\\"b\\\\n\\n\\t\\x41\\u00e9\\U0001F600\" [^\"\\\\\\]/\\x00-\\x1f]\n");
    CHECK(contains(e, "\"q\\\"b\\\\n\\u000A\\u0009A\xC3\xA9\xF0\x9F\x98\x80\""));
    CHECK(contains(e, "/[^\\x{22}\\x{5C}\\x{5D}\\x{2F}\\x{00}-\\x{1F}]/"));
    // UTF-8 in classes and literals passes through as code points
    CHECK(contains(gbnf_to_lark("root ::= [\xE3\x81\x81-\xE3\x82\x9F]+\n"), "/[\\x{3041}-\\x{309F}]/+"));

    // '-' -> '_', lower case, unique names; `start` is taken by root
    const std::string n = gbnf_to_lark("root ::= json-value Start start\njson-value ::= \"v\" root\n"
                                       "Start ::= \"S\" root\nstart ::= \"s\" root\n");
    CHECK(contains(n, "start: json_value start_2 start_3\n"));
    CHECK(contains(n, "json_value: \"v\" start\n"));
    CHECK(contains(gbnf_to_lark("root ::= 9lives\n9lives ::= \"9\"\n"), "R9LIVES: \"9\""));
}

void test_detection() {
    CHECK(is_gbnf("root ::= \"a\"\n"));
    CHECK(is_gbnf("# comment\n  value-x::=[a]\nroot ::= value-x\n"));
    CHECK(!is_gbnf("start: \"a\" | \"b\"\n"));
    CHECK(!is_gbnf("start: \"::=\"\n"));
    CHECK(!is_gbnf(""));
}

void test_errors() {
    CHECK_THROWS(gbnf_to_lark("item ::= \"a\"\n"), "no 'root' rule");
    CHECK_THROWS(gbnf_to_lark("root ::= item\n"), "line 1, column 10: undefined rule 'item'");
    CHECK_THROWS(gbnf_to_lark("root ::= \"a\"\nroot ::= \"b\"\n"), "line 2, column 1: rule 'root' is defined twice");
    CHECK_THROWS(gbnf_to_lark("root ::= \"abc\n"), "unterminated literal");
    CHECK_THROWS(gbnf_to_lark("root ::= [a-z\n"), "line 1, column 10: unterminated character class");
    CHECK_THROWS(gbnf_to_lark("root ::= []\n"), "empty character class");
    CHECK_THROWS(gbnf_to_lark("root ::= [z-a]\n"), "out of order");
    CHECK_THROWS(gbnf_to_lark("root ::= \"\\q\"\n"), "unknown escape '\\q'");
    CHECK_THROWS(gbnf_to_lark("root ::= \"\\x4\"\n"), "2 hex digits");
    CHECK_THROWS(gbnf_to_lark("root ::= \"\\uD800\"\n"), "not a Unicode scalar value");
    CHECK_THROWS(gbnf_to_lark("root ::= (\"a\" | \"b\"\n"), "unclosed '('");
    CHECK_THROWS(gbnf_to_lark("root ::= \"a\"{3,2}\n"), "n < m");
    CHECK_THROWS(gbnf_to_lark("root ::= \"a\"{2\n"), "expected '}'");
    CHECK_THROWS(gbnf_to_lark("root = \"a\"\n"), "line 1, column 6: expected '::=' after the rule name 'root'");
    CHECK_THROWS(gbnf_to_lark("root ::= \"a\" )\n"), "line 1, column 14: expected a newline after the rule, found ')'");
    CHECK_THROWS(gbnf_to_lark("root ::= \"\xFF\"\n"), "invalid UTF-8");
    CHECK_THROWS(gbnf_to_lark("# only a comment\n"), "the grammar is empty");
    CHECK_THROWS(gbnf_to_lark("root ::= " + std::string(100000, '(') + "\"a\"" + std::string(100000, ')')),
                 "line 1, column 210: groups nested deeper than 200");
    CHECK(contains(gbnf_to_lark("root ::= " + std::string(200, '(') + "\"a\"" + std::string(200, ')') + "\n"),
                   "start: \"a\"\n"));
}

}  // namespace

int main(int argc, char** argv) {
    if (argc == 3 && std::string(argv[1]) == "--to-lark") {
        std::ifstream in(argv[2], std::ios::binary);
        if (!in) {
            std::fprintf(stderr, "test_gbnf: cannot read %s\n", argv[2]);
            return 2;
        }
        std::stringstream ss;
        ss << in.rdbuf();
        try {
            std::fputs(gbnf_to_lark(ss.str()).c_str(), stdout);
        } catch (const Error& e) {
            std::fprintf(stderr, "test_gbnf: %s\n", e.what());
            return 1;
        }
        return 0;
    }
    test_constructs();
    test_escapes_and_names();
    test_detection();
    test_errors();
    if (g_failures) {
        std::fprintf(stderr, "test_gbnf: %d failure(s)\n", g_failures);
        return 1;
    }
    std::printf("test_gbnf: all passed\n");
    return 0;
}
