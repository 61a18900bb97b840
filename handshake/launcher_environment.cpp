#include "rdmachan/launcher_environment.hpp"

#include <charconv>
#include <vector>

#include "handshake/authentication.hpp"
#include "handshake/hex.hpp"
#include "rdmachan/error.hpp"

namespace rdmachan {
namespace {

struct Candidate {
    std::string source;
    std::uint32_t value;
};

std::uint32_t parse_number(const std::string& source, std::string_view text,
                           std::uint64_t maximum) {
    std::uint64_t value = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error != std::errc() || end != text.data() + text.size() || text.empty() || value > maximum)
        throw Error("launcher variable " + source + "=\"" + std::string(text.substr(0, 40)) +
                    "\" is not a number in 0.." + std::to_string(maximum));
    return static_cast<std::uint32_t>(value);
}

// Collects every launcher variable that is set; all must agree.
std::optional<Candidate> agree(const EnvironmentLookup& getenv,
                               std::initializer_list<const char*> names, std::uint64_t maximum) {
    std::optional<Candidate> chosen;
    for (const char* name : names) {
        const char* text = getenv(name);
        if (text == nullptr) continue;
        const std::uint32_t value = parse_number(name, text, maximum);
        if (!chosen) {
            chosen = Candidate{name, value};
        } else if (chosen->value != value) {
            throw Error("launcher variables disagree: " + chosen->source + "=" +
                        std::to_string(chosen->value) + " but " + name + "=" +
                        std::to_string(value));
        }
    }
    return chosen;
}

void split_host_port(const std::string& source, const std::string& text, std::string& host,
                     std::uint16_t& port) {
    const std::size_t colon = text.rfind(':');
    if (colon == std::string::npos || colon == 0)
        throw Error(source + "=\"" + text + "\" is not host:port");
    host = text.substr(0, colon);
    if (host.size() > 2 && host.front() == '[' && host.back() == ']')
        host = host.substr(1, host.size() - 2);
    port = static_cast<std::uint16_t>(
        parse_number(source, std::string_view(text).substr(colon + 1), 65535));
}

}  // namespace

LaunchEnvironment discover_launch_environment(const EnvironmentLookup& getenv) {
    return discover_launch_environment(LaunchArguments{}, getenv);
}

LaunchEnvironment discover_launch_environment(const LaunchArguments& arguments,
                                              const EnvironmentLookup& getenv) {
    LaunchEnvironment result;
    auto pick = [&](std::optional<std::uint32_t> argument, const char* own,
                    std::initializer_list<const char*> launchers,
                    std::optional<std::uint32_t>& value, std::string& source) {
        // Launcher variables are checked for agreement even when overridden: a contradiction
        // there points at a broken launch either way.
        const auto from_launchers = agree(getenv, launchers, UINT32_MAX);
        if (argument) {
            value = argument;
            source = "argument";
        } else if (const char* text = getenv(own)) {
            value = parse_number(own, text, UINT32_MAX);
            source = own;
        } else if (from_launchers) {
            value = from_launchers->value;
            source = from_launchers->source;
        }
    };
    pick(arguments.rank, "RDMACHAN_RANK",
         {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"}, result.rank,
         result.rank_source);
    pick(arguments.world_size, "RDMACHAN_WORLD_SIZE",
         {"WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}, result.world_size,
         result.world_size_source);
    if (result.world_size && *result.world_size == 0)
        throw Error("world size 0 from " + result.world_size_source);
    if (result.rank && result.world_size && *result.rank >= *result.world_size)
        throw Error("rank " + std::to_string(*result.rank) + " from " + result.rank_source +
                    " is not below world size " + std::to_string(*result.world_size) + " from " +
                    result.world_size_source);

    std::uint16_t port = 0;
    if (arguments.rendezvous) {
        split_host_port("rendezvous argument", *arguments.rendezvous, result.rendezvous_host, port);
        result.rendezvous_port = port;
        result.rendezvous_source = "argument";
    } else if (const char* text = getenv("RDMACHAN_RENDEZVOUS")) {
        split_host_port("RDMACHAN_RENDEZVOUS", text, result.rendezvous_host, port);
        result.rendezvous_port = port;
        result.rendezvous_source = "RDMACHAN_RENDEZVOUS";
    } else {
        const char* address = getenv("MASTER_ADDR");
        const char* master_port = getenv("MASTER_PORT");
        if ((address == nullptr) != (master_port == nullptr))
            throw Error(std::string("torchrun variables incomplete: ") +
                        (address ? "MASTER_ADDR is set but MASTER_PORT is not"
                                 : "MASTER_PORT is set but MASTER_ADDR is not"));
        if (address) {
            result.rendezvous_host = address;
            result.rendezvous_port =
                static_cast<std::uint16_t>(parse_number("MASTER_PORT", master_port, 65535));
            result.rendezvous_source = "MASTER_ADDR/MASTER_PORT";
        }
    }
    if (const char* token = getenv("RDMACHAN_JOB_TOKEN")) result.job_token = token;
    return result;
}

std::string generate_job_token() {
    return handshake::make_nonce() + handshake::make_nonce();
}

}  // namespace rdmachan
