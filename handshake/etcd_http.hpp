// One HTTP/1.1 connection to etcd's JSON gateway, plain or TLS, through Boost.Beast: a POST
// answered whole, or a POST whose answer streams (the watch). Beast stays inside etcd_http.cpp.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "handshake/asio.hpp"
#include "rdmachan/error.hpp"

namespace rdmachan::handshake {

struct EtcdAddress {
    bool tls = false;
    std::string host;
    std::string port;
    std::string name;  // "etcd http://host:port", as every error names the store
};

// "http://host:port" or "https://host:port" ("[v6]:port" too); throws rdmachan::Error naming
// the text when it is anything else.
EtcdAddress parse_etcd_address(std::string_view url);

// The connection could not be made (refused, unresolvable, TLS refused): nothing was sent, so
// the call may be tried again.
class EtcdUnreachable : public Error {
  public:
    using Error::Error;
};

// The connection broke after the request was sent (reset, closed, TLS failure): the store may or
// may not have acted on it. A watch resumes; a write is not repeated.
class EtcdConnectionLost : public Error {
  public:
    using Error::Error;
};

// The call's deadline passed while an attempt was under way; its text says what was under way
// ("" for the call's own request), so that every call ends its deadline with one wording.
class EtcdDeadlinePassed : public Error {
  public:
    using Error::Error;
};

struct HttpAnswer {
    unsigned status = 0;
    std::string body;
};

// Largest whole answer taken (a range over a prefix of many members); past it the call fails.
inline constexpr std::size_t etcd_answer_size_cap = 64u << 20;

class HttpConnection {
  public:
    // `ca_file`: for https, the authority to trust (empty: the system's).
    HttpConnection(EtcdAddress address, std::string ca_file);
    ~HttpConnection();
    HttpConnection(const HttpConnection&) = delete;
    HttpConnection& operator=(const HttpConnection&) = delete;

    // Resolves, connects and (https) completes the TLS handshake; throws EtcdUnreachable.
    Task<void> connect();
    // POSTs `body` (JSON) to `target` with `token` in the Authorization header when not empty,
    // and reads the whole answer. Throws rdmachan::Error on a broken or oversized answer.
    Task<HttpAnswer> post(std::string target, std::string body, std::string token);
    // POSTs and reads the answer's head only; returns the status. The body follows through
    // read_some.
    Task<unsigned> post_streamed(std::string target, std::string body, std::string token);
    // The next bytes of a streamed body, as they arrive; empty once the body has ended.
    Task<std::string> read_some();
    // Closes the socket: an operation in progress ends with EtcdConnectionLost.
    void close();

  private:
    struct State;
    std::unique_ptr<State> state_;
};

}  // namespace rdmachan::handshake
