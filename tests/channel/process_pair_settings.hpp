// Test helper: the pairwise exchange's settings for a test's two processes, the child listening
// and reporting its port through a pipe, the parent connecting to it (both with a job token and
// a 20 s deadline).
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>

#include "rdmachan/channel.hpp"

namespace rdmachan::test {

// The listener's settings: its port is written to port_pipe once it listens; a process that
// cannot say where it listens ends at once (exit status 3).
inline PairwiseSettings listening_settings(const char* token, int port_pipe) {
    PairwiseSettings settings;
    settings.role = PairwiseSettings::Role::listen;
    settings.token = token;
    settings.timeout = std::chrono::seconds(20);
    settings.on_listening = [port_pipe](std::uint16_t port) {
        if (write(port_pipe, &port, sizeof port) != static_cast<ssize_t>(sizeof port)) std::_Exit(3);
    };
    return settings;
}

inline PairwiseSettings connecting_settings(const char* token, std::uint16_t port) {
    PairwiseSettings settings;
    settings.role = PairwiseSettings::Role::connect;
    settings.port = port;
    settings.token = token;
    settings.timeout = std::chrono::seconds(20);
    return settings;
}

}  // namespace rdmachan::test
