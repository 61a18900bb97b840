// mlx5-golden-check: replays libmlx5's captured cases (tests/data/golden/*.json) through the
// project's mlx5 encoder and completion decoder, and reports each case as match, MISMATCH or
// unsupported. Exits non-zero on any mismatch or unreadable input.
#include <cstdio>
#include <exception>
#include <fstream>
#include <string>

#include "tools/golden_check/case_result.hpp"

namespace golden = rdmachan::golden;

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s VECTORS.json [VECTORS.json ...]\n", argv[0]);
        return 2;
    }
    int passed = 0;
    int failed = 0;
    int skipped = 0;
    for (int argument = 1; argument < argc; ++argument) {
        nlohmann::json cases;
        try {
            std::ifstream input(argv[argument]);
            if (!input) {
                std::fprintf(stderr, "mlx5-golden-check: cannot open %s\n", argv[argument]);
                return 2;
            }
            cases = nlohmann::json::parse(input);
            if (!cases.is_array()) throw std::runtime_error("the top level is not an array of cases");
        } catch (const std::exception& error) {
            std::fprintf(stderr, "mlx5-golden-check: %s is not a vectors file: %s\n", argv[argument], error.what());
            return 2;
        }
        for (const nlohmann::json& one_case : cases) {
            const std::string name = one_case.value("name", std::string("<unnamed>"));
            golden::CaseResult result;
            try {
                result = one_case.contains("kind") ? golden::check_receive_case(one_case)
                                                   : golden::check_send_case(one_case);
            } catch (const std::exception& error) {
                result = golden::CaseResult::mismatch(std::string("case could not be replayed: ") + error.what());
            }
            switch (result.kind) {
                case golden::CaseResult::Kind::match:
                    ++passed;
                    std::printf("%s match\n", name.c_str());
                    break;
                case golden::CaseResult::Kind::mismatch:
                    ++failed;
                    std::printf("%s MISMATCH %s\n", name.c_str(), result.detail.c_str());
                    break;
                case golden::CaseResult::Kind::unsupported:
                    ++skipped;
                    std::printf("%s unsupported: %s\n", name.c_str(), result.detail.c_str());
                    break;
            }
        }
    }
    std::printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed == 0 ? 0 : 1;
}
