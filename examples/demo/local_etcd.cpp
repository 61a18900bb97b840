#include "examples/demo/local_etcd.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <thread>
#include <vector>

extern char** environ;

namespace demo {
namespace {

std::uint16_t free_loopback_port() {
    const int descriptor = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    const bool bound = descriptor >= 0 && ::bind(descriptor, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
                       ::getsockname(descriptor, reinterpret_cast<sockaddr*>(&address), &length) == 0;
    if (descriptor >= 0) ::close(descriptor);
    if (!bound) throw std::runtime_error(std::string("no free loopback port: ") + std::strerror(errno));
    return ntohs(address.sin_port);
}

bool accepts(std::uint16_t port) {
    const int descriptor = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(port);
    const bool connected = ::connect(descriptor, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
    ::close(descriptor);
    return connected;
}

}  // namespace

LocalEtcd::LocalEtcd() {
    const char* binary = nullptr;
    for (const char* path : {"/usr/bin/etcd", "/usr/local/bin/etcd"}) {
        if (::access(path, X_OK) == 0) binary = path;
    }
    if (binary == nullptr) {
        throw std::runtime_error("no etcd: set RDMACHAN_ETCD to a running one, or install Debian's etcd-server");
    }
    char pattern[] = "/tmp/rdmachan-demo-etcd-XXXXXX";
    if (::mkdtemp(pattern) == nullptr) throw std::runtime_error(std::string("mkdtemp: ") + std::strerror(errno));
    directory_ = pattern;
    const std::uint16_t client = free_loopback_port();
    const std::uint16_t peer = free_loopback_port();
    endpoint_ = "http://127.0.0.1:" + std::to_string(client);
    const std::string peer_url = "http://127.0.0.1:" + std::to_string(peer);
    std::vector<std::string> arguments = {binary,
                                          "--name", "rdmachan-demo",
                                          "--data-dir", directory_ + "/data",
                                          "--listen-client-urls", endpoint_,
                                          "--advertise-client-urls", endpoint_,
                                          "--listen-peer-urls", peer_url,
                                          "--initial-advertise-peer-urls", peer_url,
                                          "--initial-cluster", "rdmachan-demo=" + peer_url};
    std::vector<char*> argv;
    for (std::string& argument : arguments) argv.push_back(argument.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    const std::string log = directory_ + "/etcd.log";
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    const int error = posix_spawn(&pid_, binary, &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (error != 0) throw std::runtime_error(std::string("starting etcd: ") + std::strerror(error));
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!accepts(client)) {
        if (std::chrono::steady_clock::now() >= until || ::waitpid(pid_, nullptr, WNOHANG) == pid_) {
            ::kill(pid_, SIGKILL);
            ::waitpid(pid_, nullptr, 0);
            pid_ = -1;
            throw std::runtime_error("etcd did not start (its log: " + directory_ + "/etcd.log)");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
}

LocalEtcd::~LocalEtcd() {
    if (pid_ > 0) {
        ::kill(pid_, SIGTERM);
        ::waitpid(pid_, nullptr, 0);
    }
    std::error_code ignored;
    std::filesystem::remove_all(directory_, ignored);
}

}  // namespace demo
