// The message of the rdmachan::Error that a call throws, empty if it throws none: for checks on
// error messages that read as one expression.
#pragma once

#include <functional>
#include <string>

#include "rdmachan/error.hpp"

namespace rdmachan::test {

inline std::string error_of(const std::function<void()>& call) {
    try {
        call();
    } catch (const Error& error) {
        return error.what();
    }
    return {};
}

}  // namespace rdmachan::test
