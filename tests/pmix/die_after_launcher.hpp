// A rank's death for tests/pmix/pmix_replacement_program.cpp. First the launcher's PMIx server
// closes its end of this process's PMIx connection, then the process kills itself.
//
// Why: Open MPI 4.1.4's mpirun with libpmix 4.2.2 (Debian 12) has a race. A process can die
// with its PMIx connection open, and mpirun's daemon can then deregister it before its PMIx
// server has read that connection's end. The deregistration closes the socket but does not
// delete its libevent event. The next connection accepted gets the same descriptor number. Its
// event_add changes nothing (libevent believes the number is watched, the kernel dropped it at
// the close), so that process's PMIx_Init is never answered (handshake/README.md, "A launcher
// that never answers"). Any later connection given that number is lost the same way, so the
// replacement the test then spawns would never start.
//
// The library's part, a PMIx_Init that fails at its deadline instead of hanging, is tested by
// pmix_silent_server_test. Here the victim leaves the server first: what the survivors see (queue
// pairs failing, the launcher's process table saying the rank ended) is the same.
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace pmix_test {

// The TCP port of the PMIx server, from the URI the launcher gives ("<ns>.<rank>;tcp4://host:port");
// 0 when there is none.
inline int pmix_server_port() {
    for (const char* name : {"PMIX_SERVER_URI41", "PMIX_SERVER_URI4", "PMIX_SERVER_URI3", "PMIX_SERVER_URI21", "PMIX_SERVER_URI2"}) {
        const char* uri = std::getenv(name);
        if (uri == nullptr) continue;
        const std::string text = uri;
        const std::size_t colon = text.rfind(':');
        if (colon == std::string::npos) continue;
        return std::atoi(text.c_str() + colon + 1);
    }
    return 0;
}

// This process's socket connected to the PMIx server; -1 when none is found.
inline int pmix_connection() {
    const int port = pmix_server_port();
    if (port <= 0) return -1;
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", error)) {
        const int descriptor = std::atoi(entry.path().filename().c_str());
        sockaddr_storage peer{};
        socklen_t length = sizeof peer;
        if (::getpeername(descriptor, reinterpret_cast<sockaddr*>(&peer), &length) != 0) continue;
        if (peer.ss_family == AF_INET && ntohs(reinterpret_cast<const sockaddr_in&>(peer).sin_port) == port) return descriptor;
        if (peer.ss_family == AF_INET6 && ntohs(reinterpret_cast<const sockaddr_in6&>(peer).sin6_port) == port) return descriptor;
    }
    return -1;
}

[[noreturn]] inline void die_after_launcher_let_go() {
    const int connection = pmix_connection();
    if (connection < 0) {
        std::fprintf(stderr, "pmix_replacement_program: pid %d found no PMIx connection to close before dying\n", getpid());
    } else {
        // Our end says it is done; the server reads that, closes its end (its lost-connection
        // path, which removes the event first), and the close shows here as a hang-up.
        ::shutdown(connection, SHUT_WR);
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        bool closed = false;
        while (!closed && std::chrono::steady_clock::now() < until) {
            pollfd watch{connection, POLLRDHUP, 0};
            // The library's PMIx thread may close the descriptor first, on the same hang-up.
            closed = ::poll(&watch, 1, 100) > 0 && (watch.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
        }
        if (!closed) {
            std::fprintf(stderr, "pmix_replacement_program: pid %d: the PMIx server did not close its end within 10 s\n", getpid());
        }
    }
    ::raise(SIGKILL);
    std::abort();
}

}  // namespace pmix_test
