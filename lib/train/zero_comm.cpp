// ZeroCollectives: the data-parallel group's collectives in order, on the communication
// thread or stream, and the 16-bit gradient wire; ZeroWorkMeter.
#include "train/zero_comm.h"

#include "core/check.h"

#include <algorithm>

namespace dtrain::train {

namespace {
char* wire_at(void* base, size_t elems, DType t) { return static_cast<char*>(base) + elems * dtype_size(t); }
}  // namespace

void ZeroWorkMeter::add(ptrdiff_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  bytes_ = static_cast<size_t>(static_cast<ptrdiff_t>(bytes_) + bytes);
  peak_ = std::max(peak_, bytes_);
}

size_t ZeroWorkMeter::peak() const {
  std::lock_guard<std::mutex> lk(mu_);
  return peak_;
}

// ----------------------------------------------------------------------------
void ZeroCollectives::attach(const comm::ProcessGroups& groups, bool model_on_host, bool single_rank_comm,
                             bool overlap_comm) {
  comm::Communicator* c = groups.data_parallel;
  if (c != nullptr && (c->size() > 1 || single_rank_comm)) {
    comm_ = c;
    rank_ = c->rank();
    world_ = c->size();
    DT_ENFORCE(c->on_device() == !model_on_host, UsageError,
               "the model is on {} but the {} communicator's buffers live {}: use NCCL with a CUDA model and Gloo "
               "with a CPU model",
               dev_.name(), comm::backend_name(c->backend()), c->on_device() ? "on a GPU" : "in host memory");
    stream_ = c->collective_stream();
  }
  if (stream_ != nullptr) {
    ev_compute_ = dev_.event_create();
    ev_comm_ = dev_.event_create();
  }
  // Stream-ordered collectives overlap by themselves; a thread is for blocking ones.
  queue_ = std::make_unique<ZeroCommQueue>(overlap_comm && comm_ != nullptr && stream_ == nullptr);
}

// Stream order. With NCCL the collectives and the ops that consume their results run on
// the communicator's stream, after the compute work issued before them (an event); the
// compute stream waits for that stream only where it reads what they wrote (join, or a
// stage-3 layer's own event), so backward keeps running while buckets reduce.
void ZeroCollectives::on_comm(const std::function<void()>& f) {
  if (stream_ == nullptr) {
    f();
    return;
  }
  dev_.event_record(*ev_compute_, nullptr);
  dev_.stream_wait(stream_, *ev_compute_);
  unjoined_ = true;
  void* prev = dev_.use_stream(stream_);
  try {
    f();
  } catch (...) {
    dev_.use_stream(prev);
    throw;
  }
  dev_.use_stream(prev);
}

uint64_t ZeroCollectives::submit(std::function<void()> f) {
  return queue_->submit([this, f = std::move(f)] { on_comm(f); });
}

// Only after work was issued there since the last join: a step recorded in a CUDA graph
// may not wait on the communicator's stream before its own work brought that stream into
// the recording (CUDA refuses a dependency on work outside the capture).
void ZeroCollectives::join() {
  if (stream_ == nullptr || !unjoined_) return;
  unjoined_ = false;
  dev_.event_record(*ev_comm_, stream_);
  dev_.stream_wait(nullptr, *ev_comm_);
}

ZeroCommQueue::Times ZeroCollectives::times_take() {
  if (!queue_) return {};
  const ZeroCommQueue::Times t = queue_->times();
  queue_->times_reset();
  return t;
}

// ----------------------------------------------------------------------------
void ZeroCollectives::allreduce(void* buf, size_t n, DType t, comm::ReduceOp op) {
  if (comm_ != nullptr && n > 0) comm_->allreduce(buf, buf, n, t, op);
}

void ZeroCollectives::reduce_scatter(void* buf, size_t shard, DType t) {
  if (comm_ == nullptr || shard == 0) return;
  char* b = static_cast<char*>(buf);
  comm_->reduce_scatter(b, b + static_cast<size_t>(rank_) * shard * dtype_size(t), shard, t, comm::ReduceOp::AVG);
}

void ZeroCollectives::all_gather(void* buf, size_t shard, DType t) {
  if (comm_ == nullptr || shard == 0) return;
  char* b = static_cast<char*>(buf);
  comm_->all_gather(b + static_cast<size_t>(rank_) * shard * dtype_size(t), b, shard, t);
}

void ZeroCollectives::wire_set(DType wire, size_t elems, ZeroWorkMeter& work) {
  wire_t_ = wire;
  if (comm_ == nullptr || wire == DType::F32) return;
  wire_ = device::DeviceBuffer(dev_, elems * dtype_size(wire));
  work.add(static_cast<ptrdiff_t>(wire_.bytes()));
}

// The 16-bit wire divides by the world size before it rounds (PyTorch's fp16_compress_hook
// divides too: an fp16 sum of W gradients can overflow where their mean does not), sums
// in 16 bits (Gloo adds pairs in fp32 and rounds each partial sum; NCCL likewise) and
// widens this rank's result back into the fp32 gradient.
void ZeroCollectives::grad_reduce(float* buf, size_t n, bool scatter) {
  if (comm_ == nullptr || n == 0) return;
  const size_t W = static_cast<size_t>(world_), seg = scatter ? n / W : n;
  const DType w = wire_t_;
  if (w == DType::F32) {
    if (scatter) reduce_scatter(buf, seg, DType::F32);
    else allreduce(buf, n, DType::F32, comm::ReduceOp::AVG);
    return;
  }
  DT_CHECK(wire_.bytes() >= n * dtype_size(w));
  dev_.scale(buf, n, 1.0f / static_cast<float>(world_));
  dev_.cast(wire_.get(), w, buf, DType::F32, n);
  const size_t mine = scatter ? static_cast<size_t>(rank_) * seg : 0;
  if (scatter) comm_->reduce_scatter(wire_.get(), wire_at(wire_.get(), mine, w), seg, w, comm::ReduceOp::SUM);
  else comm_->allreduce(wire_.get(), wire_.get(), n, w, comm::ReduceOp::SUM);
  dev_.cast(buf + mine, DType::F32, wire_at(wire_.get(), mine, w), w, seg);
}

}  // namespace dtrain::train
