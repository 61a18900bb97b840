// mlx5-golden-check: replays libmlx5's captured cases (tests/data/golden/*.json) through the
// project's mlx5 encoder and completion decoder, and reports each case as match, MISMATCH or
// unsupported.
//
// A case is judged only on the state it describes: every input field is either reproduced
// (replayed, like filler posts, SRQ post/poll cycles, before_capture steps (before_capture.hpp),
// receives completed before the setup and pre-polled completions, then checked against the
// recorded state before the capture) or, when non-zero and not reproduced, makes the case
// "unsupported: <field> not reproduced" (input_fields.hpp and the field lists in
// send_cases.cpp, receive_cases.cpp and completion_case.cpp).
//
//   mlx5-golden-check [--scatter-to-cqe] [--expected-unsupported LIST.json] VECTORS.json ...
//
// --scatter-to-cqe replays the completion cases with our QP created with scatter-to-CQE
// (golden::CheckOptions); without it, a CQE carrying data differs on purpose.
// LIST.json (committed beside the vectors) maps each case expected to be unsupported to its
// reason. Without it, no case is expected to be unsupported. Exits non-zero on a mismatch, on
// unreadable input, on a case unsupported but not listed or for another reason than listed,
// and on a listed case that now matches, mismatches or is missing from the vectors: the list
// must be updated on purpose, so the count of unsupported cases cannot drift unnoticed.
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include "tools/golden_check/case_result.hpp"

namespace golden = rdmachan::golden;

namespace {

// Reads a JSON file; prints why and returns false if it cannot.
bool read_json(const char* path, nlohmann::json& out) {
    try {
        std::ifstream input(path);
        if (!input) {
            std::fprintf(stderr, "mlx5-golden-check: cannot open %s\n", path);
            return false;
        }
        out = nlohmann::json::parse(input);
        return true;
    } catch (const std::exception& error) {
        std::fprintf(stderr, "mlx5-golden-check: %s is not JSON: %s\n", path, error.what());
        return false;
    }
}

}  // namespace

golden::CheckOptions& golden::check_options() {
    static CheckOptions options;
    return options;
}

int main(int argc, char** argv) {
    std::map<std::string, std::string> expected_unsupported;  // case name -> reason
    int first_vectors = 1;
    if (argc >= 2 && std::strcmp(argv[1], "--scatter-to-cqe") == 0) {
        golden::check_options().scatter_to_cqe = true;
        first_vectors = 2;
    }
    if (argc >= first_vectors + 2 && std::strcmp(argv[first_vectors], "--expected-unsupported") == 0) {
        nlohmann::json list;
        const char* list_path = argv[first_vectors + 1];
        if (!read_json(list_path, list)) return 2;
        if (!list.is_object()) {
            std::fprintf(stderr, "mlx5-golden-check: %s is not an object of case name -> reason\n", list_path);
            return 2;
        }
        for (const auto& [name, reason] : list.items()) {
            if (!reason.is_string()) {
                std::fprintf(stderr, "mlx5-golden-check: %s: the reason for %s is not a string\n", list_path,
                             name.c_str());
                return 2;
            }
            expected_unsupported[name] = reason.get<std::string>();
        }
        first_vectors += 2;
    }
    if (argc <= first_vectors) {
        std::fprintf(stderr,
                     "usage: %s [--scatter-to-cqe] [--expected-unsupported LIST.json] VECTORS.json [VECTORS.json ...]\n",
                     argv[0]);
        return 2;
    }
    int passed = 0;
    int failed = 0;
    int skipped = 0;
    std::set<std::string> seen;
    for (int argument = first_vectors; argument < argc; ++argument) {
        nlohmann::json cases;
        if (!read_json(argv[argument], cases)) return 2;
        if (!cases.is_array()) {
            std::fprintf(stderr, "mlx5-golden-check: %s is not a vectors file: the top level is not an array of cases\n",
                         argv[argument]);
            return 2;
        }
        for (const nlohmann::json& one_case : cases) {
            const std::string name = one_case.value("name", std::string("<unnamed>"));
            seen.insert(name);
            golden::CaseResult result;
            try {
                result = one_case.contains("kind") ? golden::check_receive_case(one_case)
                                                   : golden::check_send_case(one_case);
            } catch (const std::exception& error) {
                result = golden::CaseResult::mismatch(std::string("case could not be replayed: ") + error.what());
            }
            const auto expected = expected_unsupported.find(name);
            switch (result.kind) {
                case golden::CaseResult::Kind::match:
                    if (expected != expected_unsupported.end()) {
                        ++failed;
                        std::printf("%s FAILED: matches, but is listed as unsupported (%s): update the list\n",
                                    name.c_str(), expected->second.c_str());
                        break;
                    }
                    ++passed;
                    std::printf("%s match\n", name.c_str());
                    break;
                case golden::CaseResult::Kind::mismatch:
                    ++failed;
                    std::printf("%s MISMATCH %s%s\n", name.c_str(), result.detail.c_str(),
                                expected != expected_unsupported.end() ? " (listed as unsupported)" : "");
                    break;
                case golden::CaseResult::Kind::unsupported:
                    if (expected == expected_unsupported.end()) {
                        ++failed;
                        std::printf("%s FAILED: newly unsupported: %s\n", name.c_str(), result.detail.c_str());
                    } else if (expected->second != result.detail) {
                        ++failed;
                        std::printf("%s FAILED: unsupported for another reason: %s (listed: %s)\n", name.c_str(),
                                    result.detail.c_str(), expected->second.c_str());
                    } else {
                        ++skipped;
                        std::printf("%s unsupported, as listed: %s\n", name.c_str(), result.detail.c_str());
                    }
                    break;
            }
        }
    }
    for (const auto& [name, reason] : expected_unsupported) {
        if (seen.count(name) != 0) continue;
        ++failed;
        std::printf("%s FAILED: listed as unsupported but not in the vectors\n", name.c_str());
    }
    std::printf("%d passed, %d failed, %d skipped (unsupported as listed)\n", passed, failed, skipped);
    return failed == 0 ? 0 : 1;
}
