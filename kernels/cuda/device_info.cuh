// CUDA device discovery, a smoke kernel + cuBLAS call, and a copy-bandwidth probe. Callable from
// host code without a GPU: it then reports that none was found.
#pragma once

#include <cstddef>
#include <string>

namespace sy::cuda {

// Number of usable devices (0 when the driver or a device is missing).
int device_count();
// One line per device, or the reason there is none.
std::string describe_devices();
// Runs a saxpy kernel and a cuBLAS SGEMM on device 0 and checks them against the host;
// returns an empty string on success, else what failed. Requires a device.
std::string self_test();
// Device-to-device copy bandwidth of `device` in bytes/s, each copied byte counted twice (read
// and written, as NVIDIA's bandwidthTest counts it): the median of 5 timed cudaMemcpy of `bytes`
// after one warm-up, halving `bytes` while the allocation fails. Throws std::runtime_error on a
// CUDA error or without a device.
double copy_bandwidth(int device, size_t bytes);

}  // namespace sy::cuda
