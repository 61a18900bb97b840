// A made-up process environment for the code that reads launcher and bootstrap variables through
// an rdmachan::EnvironmentLookup, so tests never touch the real one.
#pragma once

#include <map>
#include <string>

#include "rdmachan/launcher_environment.hpp"

namespace rdmachan::test {

struct FakeEnvironment {
    std::map<std::string, std::string> variables;
    EnvironmentLookup lookup() const {
        return [this](const char* name) -> const char* {
            auto found = variables.find(name);
            return found == variables.end() ? nullptr : found->second.c_str();
        };
    }
};

}  // namespace rdmachan::test
