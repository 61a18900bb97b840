// A private etcd for one test: free loopback ports, a temporary data directory, stopped by its own
// pid when the fixture goes out of scope (also when the test fails), and restartable on the same
// ports and data to test a watch across a restart. Starting returns once etcd listens on its
// client port, or throws with the end of etcd's log when it exited instead.
#pragma once

#include <fcntl.h>
#include <linux/close_range.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

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
        try {
            start_choosing_ports();
        } catch (...) {
            std::error_code ignored;
            std::filesystem::remove_all(directory_, ignored);
            throw;
        }
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

    // On the fixture's client port, or (a restart) on another one, with the same data. The test
    // knows these ports, so a port taken meanwhile is an error here, named in what is thrown.
    void start() { start_on(client_port_); }
    void start_on(std::uint16_t client_port) {
        const std::string failure = launch_and_wait(client_port);
        if (!failure.empty()) throw std::runtime_error(failure);
    }

    // A restart on another client port, of the fixture's choosing (chosen again while etcd finds
    // it taken); returns it. start() still restarts on the fixture's own client port.
    std::uint16_t start_elsewhere() {
        return launch_choosing([](int) { return free_loopback_port(); });
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
    // The ports were free when chosen, but were released for etcd to bind: another process on
    // this machine (any test's listener bound to port 0) may take one first, and etcd then exits
    // saying so. On its first start, with no data yet, the fixture chooses both ports again.
    static constexpr int kChoices = 5;

    void start_choosing_ports() {
        launch_choosing([this](int choice) {
            if (choice > 0) {
                client_port_ = free_loopback_port();
                peer_port_ = free_loopback_port();
            }
            return client_port_;
        });
    }

    // Launches on the client port `choose(choice)` gives, asking again while etcd finds a port
    // taken (up to kChoices times); returns the port etcd listens on, or throws etcd's reason.
    template <typename Choose>
    std::uint16_t launch_choosing(Choose&& choose) {
        std::string failure;
        for (int choice = 0; choice < kChoices; ++choice) {
            const std::uint16_t port = choose(choice);
            failure = launch_and_wait(port);
            if (failure.empty()) return port;
            if (failure.find("address already in use") == std::string::npos) break;
        }
        throw std::runtime_error(failure);
    }

    // Empty once etcd listens on `client_port`; else why not, with its log's end.
    std::string launch_and_wait(std::uint16_t client_port) {
        const std::string log = directory_ + "/etcd.log";
        std::error_code ignored;
        const auto log_start = std::filesystem::exists(log) ? std::filesystem::file_size(log, ignored) : 0;
        launch(client_port);
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (std::chrono::steady_clock::now() < deadline) {
            int status = 0;
            if (::waitpid(pid_, &status, WNOHANG) == pid_) {
                pid_ = -1;
                return "etcd on " + endpoint_on(client_port) + " (peer port " + std::to_string(peer_port_) +
                       ") " + (WIFSIGNALED(status) ? "was killed by signal " + std::to_string(WTERMSIG(status))
                                                          : "exited with code " + std::to_string(WEXITSTATUS(status))) +
                       " before listening: " +
                       log_tail(log, log_start);
            }
            if (listens(client_port)) return {};
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        stop();
        return "etcd on " + endpoint_on(client_port) + " did not listen within 20 s: " + log_tail(log, log_start);
    }

    // Whether etcd itself listens on `port`: a listening socket in /proc/net/tcp that is one of
    // etcd's descriptors. Connecting would not tell: another process holding the port accepts too.
    bool listens(std::uint16_t port) const {
        std::ifstream table("/proc/net/tcp");
        std::string line;
        std::getline(table, line);  // the header
        char wanted[16];
        std::snprintf(wanted, sizeof wanted, ":%04X", port);
        while (std::getline(table, line)) {
            char local[64] = {}, remote[64] = {};
            unsigned state = 0;
            unsigned long inode = 0;
            if (std::sscanf(line.c_str(), " %*d: %63s %63s %x %*s %*s %*s %*d %*d %lu", local, remote, &state, &inode) != 4)
                continue;
            if (state != 0x0A || std::string(local).find(wanted) == std::string::npos) continue;
            const std::string socket = "socket:[" + std::to_string(inode) + "]";
            std::error_code error;
            for (const auto& entry :
                 std::filesystem::directory_iterator("/proc/" + std::to_string(pid_) + "/fd", error)) {
                std::error_code unreadable;
                if (std::filesystem::read_symlink(entry.path(), unreadable).string() == socket) return true;
            }
        }
        return false;
    }

    // The last lines etcd wrote since `from`, where its reason to exit is.
    static std::string log_tail(const std::string& log, std::uintmax_t from) {
        std::ifstream input(log);
        input.seekg(static_cast<std::streamoff>(from));
        const std::string text((std::istreambuf_iterator<char>(input)), std::istreambuf_iterator<char>());
        constexpr std::size_t kTail = 600;
        return text.size() > kTail ? "..." + text.substr(text.size() - kTail) : text;
    }

    void launch(std::uint16_t client_port) {
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
        // Closed by the exec: until then the child still holds the test's descriptors, and
        // looking for etcd's listener among them would find the test's own.
        int exec_pipe[2];
        if (::pipe2(exec_pipe, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
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
            // The test's own descriptors (its listeners, its connections) stay the test's.
            ::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
            ::execv(binary, const_cast<char* const*>(arguments.data()));
            ::_exit(127);
        }
        ::close(exec_pipe[1]);
        char ignored;
        while (::read(exec_pipe[0], &ignored, 1) < 0 && errno == EINTR) {
        }
        ::close(exec_pipe[0]);
    }

    std::uint16_t client_port_;
    std::uint16_t peer_port_;
    std::string directory_;
    std::string scheme_ = "http";
    pid_t pid_ = -1;
};

}  // namespace rdmachan::test
