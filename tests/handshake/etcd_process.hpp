// A private etcd for one test: free loopback ports, a temporary data directory, stopped by its own
// pid when the fixture goes out of scope (also when the test fails), and restartable on the same
// ports and data to test a watch across a restart.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>

namespace rdmachan::test {

inline const char* etcd_binary() {
    for (const char* path : {"/usr/bin/etcd", "/usr/local/bin/etcd"})
        if (::access(path, X_OK) == 0) return path;
    return nullptr;
}

// Whether etcd is missing, said on stderr in the line CTest reads to count a suite skipped
// (SKIP_REGULAR_EXPRESSION "skipped: no etcd binary"). For a suite's `doctest::skip`.
inline bool etcd_missing_said() {
    const bool missing = etcd_binary() == nullptr;
    if (missing) std::fprintf(stderr, "skipped: no etcd binary (scripts/setup.sh installs etcd-server)\n");
    return missing;
}

// A loopback port nobody listens on now (the kernel's pick for a socket bound to port 0).
inline std::uint16_t free_loopback_port() {
    const int descriptor = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    if (descriptor < 0 || ::bind(descriptor, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
        ::getsockname(descriptor, reinterpret_cast<sockaddr*>(&address), &length) != 0)
        throw std::runtime_error("no free loopback port");
    ::close(descriptor);
    return ntohs(address.sin_port);
}

class EtcdProcess {
  public:
    // `tls`: serve https with a self-signed certificate for 127.0.0.1 made by `openssl req`
    // (certificate_file() is then the authority a client must trust).
    explicit EtcdProcess(bool tls = false) : client_port_(free_loopback_port()), peer_port_(free_loopback_port()) {
        char pattern[] = "/tmp/rdmachan-etcd-XXXXXX";
        if (::mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp failed");
        directory_ = pattern;
        if (tls) {
            const std::string command = "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1"
                                        " -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 -keyout " +
                                        directory_ + "/key.pem -out " + certificate_file() + " 2>" + directory_ +
                                        "/openssl.log";
            if (std::system(command.c_str()) != 0) throw std::runtime_error("openssl req failed: " + command);
            scheme_ = "https";
        }
        start();
    }
    ~EtcdProcess() {
        stop();
        std::error_code ignored;
        std::filesystem::remove_all(directory_, ignored);
    }
    EtcdProcess(const EtcdProcess&) = delete;
    EtcdProcess& operator=(const EtcdProcess&) = delete;

    std::string endpoint() const { return endpoint_on(client_port_); }
    std::string endpoint_on(std::uint16_t port) const { return scheme_ + "://127.0.0.1:" + std::to_string(port); }
    std::string certificate_file() const { return directory_ + "/certificate.pem"; }

    // On the fixture's client port, or (a restart) on another one, with the same data.
    void start() { start_on(client_port_); }
    void start_on(std::uint16_t client_port) {
        // Everything the child needs is built here: the store's threads may hold the allocator's
        // lock at the fork, so the child makes only system calls before exec.
        const std::string client = endpoint_on(client_port);
        const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
        const std::string cluster = "default=" + peer;
        const std::string data = directory_ + "/data";
        const std::string log = directory_ + "/etcd.log";
        const std::string certificate = certificate_file();
        const std::string key = directory_ + "/key.pem";
        std::vector<const char*> arguments = {"etcd", "--data-dir", data.c_str(), "--listen-client-urls",
                                              client.c_str(), "--advertise-client-urls", client.c_str(),
                                              "--listen-peer-urls", peer.c_str(), "--initial-advertise-peer-urls",
                                              peer.c_str(), "--initial-cluster", cluster.c_str()};
        if (scheme_ == "https")
            arguments.insert(arguments.end(), {"--cert-file", certificate.c_str(), "--key-file", key.c_str()});
        arguments.push_back(nullptr);
        const char* binary = etcd_binary();
        const pid_t parent = ::getpid();
        pid_ = ::fork();
        if (pid_ < 0) throw std::runtime_error("fork failed");
        if (pid_ == 0) {
            // A test that crashes runs no destructor: etcd then goes with it.
            ::prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (::getppid() != parent) ::_exit(127);
            const int output = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
            if (output >= 0) {
                ::dup2(output, 1);
                ::dup2(output, 2);
            }
            ::execv(binary, const_cast<char* const*>(arguments.data()));
            ::_exit(127);
        }
    }

    // SIGTERM, then SIGKILL if it has not ended within 5 s.
    void stop() {
        if (pid_ <= 0) return;
        ::kill(pid_, SIGTERM);
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (::waitpid(pid_, nullptr, WNOHANG) == 0) {
            if (std::chrono::steady_clock::now() > deadline) {
                ::kill(pid_, SIGKILL);
                ::waitpid(pid_, nullptr, 0);
                break;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        pid_ = -1;
    }

  private:
    std::uint16_t client_port_;
    std::uint16_t peer_port_;
    std::string directory_;
    std::string scheme_ = "http";
    pid_t pid_ = -1;
};

}  // namespace rdmachan::test
