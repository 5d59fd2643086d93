// CUDA execution engine: the allocator behind cudaMalloc / cudaMallocHost /
// cudaMallocAsync (memory.cpp), used by the runtime only.
#pragma once

#include <cstddef>
#include <string>

namespace cuda_emu {

// A poisoned allocation of `size` bytes followed by a guard zone; device -1 with
// pinned = true is page-locked host memory. nullptr when the mapping fails.
void* mem_alloc(size_t size, int device, bool pinned);
// Frees an allocation start (false: not one); reports its device and kind.
bool mem_free(void* p, int* device, bool* pinned);
// Bytes currently allocated on a device.
size_t mem_used(int device);
// Checks the slack between each live allocation's end and its guard zone; returns a
// description of the first overrun found (and re-arms it), or "".
std::string mem_canaries_check();

}  // namespace cuda_emu
