// CUDA device discovery and a smoke kernel + cuBLAS call (the real kernels come with the CUDA
// backend). Callable from host code without a GPU: it then reports that none was found.
#pragma once

#include <string>

namespace sy::cuda {

// Number of usable devices (0 when the driver or a device is missing).
int device_count();
// One line per device, or the reason there is none.
std::string describe_devices();
// Runs a saxpy kernel and a cuBLAS SGEMM on device 0 and checks them against the host;
// returns an empty string on success, else what failed. Requires a device.
std::string self_test();

}  // namespace sy::cuda
