// A doctest listener linked into every suite that uses the library: a failed test
// leaves its flight record where CTest's output says, and a passed run leaves nothing.
//
// - The run writes its flight records into $RDMACHAN_FLIGHT_RECORD_DIR, by default
//   flight-records/PROGRAM in the working directory (CTest's: the test's build folder), with a
//   file prefix naming this run (RDMACHAN_FLIGHT_RECORD_RUN = the pid of the test's main
//   process, inherited by every process it forks or starts, the demo's peers included).
// - A failed test case writes the ring of the main process at once.
// - At the end of the run: when something failed, the run's files are kept and listed; when
//   everything passed, they are removed (a suite that fails on purpose writes them every run).
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "rdmachan/flight_recorder.hpp"
#include "tests/flight_test_events.hpp"

namespace {

class FlightRecordListener : public doctest::IReporter {
public:
    explicit FlightRecordListener(const doctest::ContextOptions& options) : main_process_(::getpid()) {
        if (const char* set = std::getenv("RDMACHAN_FLIGHT_RECORD_DIR"); set != nullptr && *set != '\0') {
            directory_ = set;
        } else {
            std::error_code ignored;
            const std::string program = options.binary_name.c_str();
            directory_ = (std::filesystem::current_path(ignored) / "flight-records" /
                          std::filesystem::path(program).filename())
                             .string();
            ::setenv("RDMACHAN_FLIGHT_RECORD_DIR", directory_.c_str(), 1);
        }
        if (const char* set = std::getenv("RDMACHAN_FLIGHT_RECORD_RUN"); set != nullptr && *set != '\0') {
            run_ = set;
        } else {
            run_ = std::to_string(main_process_);
            ::setenv("RDMACHAN_FLIGHT_RECORD_RUN", run_.c_str(), 1);
        }
    }

    void report_query(const doctest::QueryData&) override {}
    void test_run_start() override {}
    void test_case_start(const doctest::TestCaseData& test) override {
        current_ = test.m_name;  // a string literal of the TEST_CASE macro: static storage
        rdmachan::flight::record(rdmachan::flight::TestEvent::marker, 0, 0, rdmachan::flight::text(current_));
    }
    void test_case_reenter(const doctest::TestCaseData&) override {}
    void test_case_exception(const doctest::TestCaseException&) override {}
    void subcase_start(const doctest::SubcaseSignature&) override {}
    void subcase_end() override {}
    void log_assert(const doctest::AssertData&) override {}
    void log_message(const doctest::MessageData&) override {}
    void test_case_skipped(const doctest::TestCaseData&) override {}

    void test_case_end(const doctest::CurrentTestCaseStats& stats) override {
        if (stats.testCaseSuccess || ::getpid() != main_process_) return;
        try {
            const std::string path = rdmachan::flight_recorder::dump(std::string("test case \"") + current_ + "\" failed");
            std::fprintf(stderr, "flight record of the failed test case \"%s\": %s\n", current_, path.c_str());
        } catch (const std::exception& error) {
            std::fprintf(stderr, "flight record of the failed test case \"%s\" not written: %s\n", current_, error.what());
        }
    }

    void test_run_end(const doctest::TestRunStats& stats) override {
        if (::getpid() != main_process_) return;  // a forked child that returned through doctest
        const bool failed = stats.numTestCasesFailed != 0 || stats.numAssertsFailed != 0;
        std::vector<std::filesystem::path> files;
        std::error_code error;
        const std::string prefix = "flight-" + run_ + "-";
        for (const auto& entry : std::filesystem::directory_iterator(directory_, error)) {
            if (entry.path().filename().string().rfind(prefix, 0) == 0) files.push_back(entry.path());
        }
        if (!failed) {
            for (const auto& file : files) std::filesystem::remove(file, error);
            return;
        }
        std::fprintf(stderr, "flight records of this failed run (%zu files) kept in %s:\n", files.size(), directory_.c_str());
        for (const auto& file : files) std::fprintf(stderr, "  %s\n", file.filename().c_str());
    }

private:
    pid_t main_process_;
    std::string directory_;
    std::string run_;
    const char* current_ = "";
};

REGISTER_LISTENER("flight_record", 1, FlightRecordListener);

}  // namespace
