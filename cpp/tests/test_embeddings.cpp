// The pooling of embed() (bonsai/context.h): none / mean / cls / last over a few rows, the names
// and llama.cpp's numbers, and the refusals (rank, unknown names, no rows). The forward itself is
// checked against the numpy reference by tests/test_embeddings.py.
#include <vector>

#include "bonsai/context.h"
#include "check.h"

using namespace bonsai;

int main() {
    const std::vector<float> rows = {1, 2, 3,  4, 5, 6,  -2, 0, 9};  // 3 rows of width 3
    std::vector<float> out;
    pool_rows(rows.data(), 3, 3, Pooling::NONE, out);
    CHECK(out == rows);
    pool_rows(rows.data(), 3, 3, Pooling::MEAN, out);
    CHECK((out == std::vector<float>{1, 7.0f / 3.0f, 6}));
    pool_rows(rows.data(), 3, 3, Pooling::CLS, out);
    CHECK((out == std::vector<float>{1, 2, 3}));
    pool_rows(rows.data(), 3, 3, Pooling::LAST, out);
    CHECK((out == std::vector<float>{-2, 0, 9}));
    pool_rows(rows.data(), 1, 3, Pooling::MEAN, out);
    CHECK((out == std::vector<float>{1, 2, 3}));

    CHECK(static_cast<int>(Pooling::NONE) == 0 && static_cast<int>(Pooling::MEAN) == 1 &&
          static_cast<int>(Pooling::CLS) == 2 && static_cast<int>(Pooling::LAST) == 3 &&
          static_cast<int>(Pooling::RANK) == 4);  // the values of <arch>.pooling_type
    for (Pooling p : {Pooling::NONE, Pooling::MEAN, Pooling::CLS, Pooling::LAST, Pooling::RANK}) {
        CHECK(parse_pooling(pooling_name(p)) == p);
    }
    CHECK_THROWS(parse_pooling("max"), "unknown pooling 'max'");
    CHECK_THROWS(pool_rows(rows.data(), 3, 3, Pooling::RANK, out), "rank");
    CHECK_THROWS(pool_rows(rows.data(), 0, 3, Pooling::MEAN, out), "no rows");
    return g_failures == 0 ? 0 : 1;
}
