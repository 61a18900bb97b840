// The bytes read from one connection's socket and not yet handled: the kernel copies them
// straight into it (recv into its free tail), frames are handled where they lie, and only the
// partial frame at the end is moved, to the front, when the tail is too short for the next read.
// A std::vector with a stack chunk in front of it cost two more copies of every payload (the
// chunk into the vector, and the erase that moved a partial frame after each read); on the TCP
// path a 64 KiB write paid them on the receiving device's thread, beside the copy into memory.
// It allocates only to grow past the largest frame it held (plus one read): a connection that
// carries only small frames keeps kInitialCapacity.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

namespace rdmachan::soft {

class ConnectionInput {
public:
    // Free room at the end of at least `wanted` bytes, the unread bytes kept (moved to the front
    // if that makes the room, else into a larger buffer).
    std::uint8_t* room(std::size_t wanted) {
        if (capacity_ - end_ >= wanted) return bytes_.get() + end_;
        const std::size_t unread = end_ - begin_;
        if (capacity_ - unread >= wanted) {
            std::memmove(bytes_.get(), bytes_.get() + begin_, unread);
        } else {
            std::size_t capacity = capacity_ == 0 ? kInitialCapacity : capacity_;
            while (capacity - unread < wanted) capacity *= 2;
            auto larger = std::make_unique_for_overwrite<std::uint8_t[]>(capacity);
            if (unread != 0) std::memcpy(larger.get(), bytes_.get() + begin_, unread);
            bytes_ = std::move(larger);
            capacity_ = capacity;
        }
        begin_ = 0;
        end_ = unread;
        return bytes_.get() + end_;
    }
    std::size_t room_size() const { return capacity_ - end_; }
    // `count` bytes were written at room().
    void commit(std::size_t count) { end_ += count; }

    const std::uint8_t* unread() const { return bytes_.get() + begin_; }
    std::size_t unread_size() const { return end_ - begin_; }
    // The first `count` unread bytes are handled.
    void consume(std::size_t count) {
        begin_ += count;
        if (begin_ == end_) begin_ = end_ = 0;  // empty: the next read starts at the front
    }

    static constexpr std::size_t kInitialCapacity = 4u << 10;

private:
    std::unique_ptr<std::uint8_t[]> bytes_;
    std::size_t capacity_ = 0;
    std::size_t begin_ = 0;
    std::size_t end_ = 0;
};

}  // namespace rdmachan::soft
