// A FIFO that keeps its elements' storage: the software device's requests in flight per QP.
// std::deque allocated a node every few requests and freed it as they were answered; since
// requests are also executed on the doorbell thread (the data path, which allocates nothing),
// this ring keeps every slot it ever had, and every slot keeps what its element held: a request
// is built in place in the next free slot (prepare_back, then commit_back), so the buffers in the
// slots (a request's frame) are reused, not freed and allocated again. Elements leave with
// pop_front, which frees nothing. It allocates only to grow past its high-water mark, and a
// slot's buffers only to grow past the largest frame that slot held.
#pragma once

#include <cstddef>
#include <vector>

namespace rdmachan::soft {

template <typename T>
class ReusingRing {
public:
    bool empty() const { return count_ == 0; }
    std::size_t size() const { return count_; }
    T& front() { return slots_[head_]; }
    const T& front() const { return slots_[head_]; }
    T& back() { return slots_[index(count_ - 1)]; }
    // The element `position` places after the first (position < size()).
    const T& at(std::size_t position) const { return slots_[index(position)]; }

    // The slot the next element goes into, holding what an earlier element left there (the caller
    // overwrites every field, reusing the buffers). It joins the ring with commit_back.
    T& prepare_back() {
        if (count_ == slots_.size()) grow();
        return slots_[index(count_)];
    }
    void commit_back() { ++count_; }
    // Removes the first element; its slot keeps the contents for a later push_back_swap.
    void pop_front() {
        head_ = index(1);
        --count_;
    }
    // Forgets every element; the slots keep their contents.
    void clear() {
        head_ = 0;
        count_ = 0;
    }

    template <typename Ring, typename Element>
    class Iterator {
    public:
        Iterator(Ring& ring, std::size_t position) : ring_(ring), position_(position) {}
        Element& operator*() const { return ring_.slots_[ring_.index(position_)]; }
        Iterator& operator++() {
            ++position_;
            return *this;
        }
        bool operator!=(const Iterator& other) const { return position_ != other.position_; }

    private:
        Ring& ring_;
        std::size_t position_;
    };
    Iterator<ReusingRing, T> begin() { return {*this, 0}; }
    Iterator<ReusingRing, T> end() { return {*this, count_}; }
    Iterator<const ReusingRing, const T> begin() const { return {*this, 0}; }
    Iterator<const ReusingRing, const T> end() const { return {*this, count_}; }

private:
    std::size_t index(std::size_t position) const { return (head_ + position) & (slots_.size() - 1); }
    void grow() {
        std::vector<T> larger(slots_.empty() ? 8 : 2 * slots_.size());  // a power of two
        for (std::size_t i = 0; i < slots_.size(); ++i) larger[i] = std::move(slots_[index(i)]);
        slots_ = std::move(larger);
        head_ = 0;
    }

    std::vector<T> slots_;
    std::size_t head_ = 0;
    std::size_t count_ = 0;
};

}  // namespace rdmachan::soft
