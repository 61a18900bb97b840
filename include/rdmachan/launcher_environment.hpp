// Rank, world size and rendezvous address from the launcher's environment variables.
//
// Precedence (highest first): explicit arguments; RDMACHAN_RANK / RDMACHAN_WORLD_SIZE /
// RDMACHAN_RENDEZVOUS; then the launchers' own variables: torchrun (RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT), Slurm (SLURM_PROCID, SLURM_NTASKS), Open MPI
// (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE), PMI (PMI_RANK, PMI_SIZE). Explicit arguments
// and RDMACHAN_* override silently (they are how a user settles a conflict); two launcher
// variables that disagree are an error naming both.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>

namespace rdmachan {

struct LaunchEnvironment {
    std::optional<std::uint32_t> rank;
    std::optional<std::uint32_t> world_size;
    std::string rendezvous_host;  // empty when nothing named one
    std::optional<std::uint16_t> rendezvous_port;
    std::string job_token;  // RDMACHAN_JOB_TOKEN, empty if unset
    // Where each value came from: a variable name, "argument", or empty.
    std::string rank_source;
    std::string world_size_source;
    std::string rendezvous_source;
};

struct LaunchArguments {
    std::optional<std::uint32_t> rank;
    std::optional<std::uint32_t> world_size;
    std::optional<std::string> rendezvous;  // host:port, [v6]:port
};

using EnvironmentLookup = std::function<const char*(const char*)>;

// Throws rdmachan::Error naming the variable(s) on malformed values, contradictions and a
// rank outside the world size.
LaunchEnvironment discover_launch_environment(const EnvironmentLookup& getenv = ::getenv);
LaunchEnvironment discover_launch_environment(const LaunchArguments& arguments,
                                              const EnvironmentLookup& getenv = ::getenv);

// A fresh random job token (64 hex digits) for launchers that start every rank themselves.
std::string generate_job_token();

}  // namespace rdmachan
