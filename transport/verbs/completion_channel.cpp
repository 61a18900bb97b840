#include "transport/verbs/completion_channel.hpp"

#include <fcntl.h>

#include <cerrno>

#include "common/logger.hpp"
#include "transport/verbs/verbs_error.hpp"

namespace rdmachan::verbs {

std::shared_ptr<CompletionChannel> CompletionChannel::try_create(std::shared_ptr<Context> context) {
    errno = 0;
    ibv_comp_channel* channel = ibv_create_comp_channel(context->handle());
    if (channel == nullptr) {
        rdmachan::detail::logger().info(
            "ibv_create_comp_channel on '{}': {}; its CQ gives no completion events, waits poll",
            context->name(), describe_error_code(errno));
        return nullptr;
    }
    const int flags = ::fcntl(channel->fd, F_GETFL);
    if (flags < 0 || ::fcntl(channel->fd, F_SETFL, flags | O_NONBLOCK) != 0) {
        const int code = errno;
        ibv_destroy_comp_channel(channel);
        rdmachan::detail::logger().info(
            "completion channel on '{}': its descriptor cannot be made non-blocking ({}); its CQ "
            "gives no completion events, waits poll",
            context->name(), describe_error_code(code));
        return nullptr;
    }
    return std::shared_ptr<CompletionChannel>(new CompletionChannel(std::move(context), channel));
}

CompletionChannel::~CompletionChannel() {
    ibv_destroy_comp_channel(channel_);
}

}  // namespace rdmachan::verbs
