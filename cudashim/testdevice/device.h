// What the test accelerator's two files share: device.cpp (memory, the guard, generators,
// hooks) and kernels.cpp (the kernels, the fallback, autocast's lists).

#pragma once

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/autocast_mode.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CPUAllocator.h>
#include <torch/library.h>

#include <vector>

namespace testdevice {

constexpr c10::DeviceType kDevice = c10::DeviceType::PrivateUse1;
constexpr size_t kCapacity = size_t{8} << 30;  // the memory each device reports
constexpr int kMaxDevices = 16;

extern int device_count;                              // set once by init()
extern thread_local c10::DeviceIndex current_device;
extern c10::Allocator* const device_allocator;       // device memory: PROT_NONE pages

void check_index(c10::DeviceIndex index);

// Where the host reaches the device memory at ``address``: the same pages mapped a second
// time, readable and writable, at an address no tensor holds; nullptr for host memory.
void* host_address(const void* address);
// ``address`` itself for host memory, else its host address.
void* reachable(const void* address);

// While one lives on a thread, the host memory torch allocates there is device memory of
// ``device`` reached at its host mapping: a kernel's results are made where they will live,
// not copied there after it returns (``take_device_memory``).
class AllocateOnDevice {
 public:
  explicit AllocateOnDevice(c10::DeviceIndex device);
  ~AllocateOnDevice();
  AllocateOnDevice(const AllocateOnDevice&) = delete;
  AllocateOnDevice& operator=(const AllocateOnDevice&) = delete;

 private:
  c10::DeviceIndex outer_;
};

// The device memory under a host storage made while an AllocateOnDevice lived, taken from it
// (the host storage keeps its pointer and owns nothing); an empty DataPtr for any other storage.
c10::DataPtr take_device_memory(const c10::Storage& host);

const at::Generator& default_generator(c10::DeviceIndex index);
// The CPU generator a device generator draws with, handed to CPU kernels in its place.
at::Generator engine_of(const at::Generator& generator);

// A storage whose bytes move to fresh device memory on ``device`` (contents kept up to the
// smaller size): what resize_ and a kernel that grew a storage need.
void move_to_new_memory(const c10::Storage& storage, const void* source, size_t bytes, size_t keep,
                        c10::DeviceIndex device);

// torch's autograd fallback on the device's autograd key, where torch registered none (kernels.cpp).
void register_autograd_fallback();

}  // namespace testdevice
