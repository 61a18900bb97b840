// Test helper: polls a condition every millisecond until it holds or a deadline passes, for
// what another thread or process makes true (a counter, a state) with no event to wait on.
#pragma once

#include <chrono>
#include <thread>

namespace rdmachan::test {

template <typename Condition>
bool eventually(Condition done, std::chrono::milliseconds deadline = std::chrono::seconds(10)) {
    const auto until = std::chrono::steady_clock::now() + deadline;
    while (!done()) {
        if (std::chrono::steady_clock::now() >= until) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
}

}  // namespace rdmachan::test
