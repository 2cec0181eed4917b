#include "kernels/cuda/device_info.cuh"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.cuh"

namespace sy::cuda {
namespace {

__global__ void saxpy_kernel(int n, float a, const float* x, float* y) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

std::string check(cudaError_t e, const char* what) {
  return e == cudaSuccess ? std::string() : std::string(what) + ": " + cudaGetErrorString(e);
}

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

std::string describe_devices() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return std::string("no CUDA device (") + cudaGetErrorString(e) + ")";
  if (n == 0) return "no CUDA device";
  std::string out;
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    cudaGetDeviceProperties(&p, i);
    out += "cuda:" + std::to_string(i) + " " + p.name + " sm_" + std::to_string(p.major) + std::to_string(p.minor) +
           " " + std::to_string(p.totalGlobalMem >> 20) + " MiB";
    if (i + 1 < n) out += "; ";
  }
  return out;
}

std::string self_test() {
  if (device_count() == 0) return "no CUDA device";
  const int n = 64;
  std::vector<float> hx(n * n), hy(n * n), hc(n * n);
  for (int i = 0; i < n * n; ++i) {
    hx[i] = std::sin(0.1f * i);
    hy[i] = std::cos(0.07f * i);
  }
  float *dx = nullptr, *dy = nullptr, *dc = nullptr;
  std::string err;
  if ((err = check(cudaMalloc(&dx, n * n * 4), "cudaMalloc")).size()) return err;
  cudaMalloc(&dy, n * n * 4);
  cudaMalloc(&dc, n * n * 4);
  cudaMemcpy(dx, hx.data(), n * n * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dy, hy.data(), n * n * 4, cudaMemcpyHostToDevice);
  saxpy_kernel<<<(n * n + 255) / 256, 256>>>(n * n, 2.f, dx, dy);
  err = check(cudaGetLastError(), "saxpy launch");
  cublasHandle_t h = nullptr;
  if (err.empty() && cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) err = "cublasCreate failed";
  const float one = 1.f, zero = 0.f;
  if (err.empty() &&
      cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, dx, n, dy, n, &zero, dc, n) != CUBLAS_STATUS_SUCCESS)
    err = "cublasSgemm failed";
  if (err.empty()) err = check(cudaMemcpy(hc.data(), dc, n * n * 4, cudaMemcpyDeviceToHost), "copy back");
  if (err.empty()) {
    // Host reference: y' = 2x + y, C = X * Y' (column-major).
    std::vector<float> y2(n * n);
    for (int i = 0; i < n * n; ++i) y2[i] = 2.f * hx[i] + hy[i];
    for (int j = 0; j < n && err.empty(); ++j)
      for (int i = 0; i < n; ++i) {
        double ref = 0;
        for (int k = 0; k < n; ++k) ref += static_cast<double>(hx[k * n + i]) * y2[j * n + k];
        if (std::fabs(ref - hc[j * n + i]) > 1e-3 * (1 + std::fabs(ref))) {
          err = "sgemm mismatch at (" + std::to_string(i) + "," + std::to_string(j) + ")";
          break;
        }
      }
  }
  if (h) cublasDestroy(h);
  cudaFree(dx);
  cudaFree(dy);
  cudaFree(dc);
  return err;
}

double copy_bandwidth(int device, size_t bytes) {
  SY_CUDA_CHECK(cudaSetDevice(device));
  void* a = nullptr;
  void* b = nullptr;
  bytes &= ~size_t{255};
  while (bytes >= (size_t{1} << 20)) {
    if (cudaMalloc(&a, bytes) == cudaSuccess) {
      if (cudaMalloc(&b, bytes) == cudaSuccess) break;
      cudaFree(a);
      a = nullptr;
    }
    cudaGetLastError();
    bytes /= 2;
  }
  if (!a || !b) throw std::runtime_error("copy_bandwidth: cannot allocate two buffers of 1 MiB");
  cudaEvent_t t0 = nullptr, t1 = nullptr;
  std::vector<float> ms;
  std::string err;
  try {
    SY_CUDA_CHECK(cudaEventCreate(&t0));
    SY_CUDA_CHECK(cudaEventCreate(&t1));
    SY_CUDA_CHECK(cudaMemset(a, 1, bytes));
    SY_CUDA_CHECK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));  // warm-up
    for (int i = 0; i < 5; ++i) {
      SY_CUDA_CHECK(cudaEventRecord(t0));
      SY_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
      SY_CUDA_CHECK(cudaEventRecord(t1));
      SY_CUDA_CHECK(cudaEventSynchronize(t1));
      float t = 0;
      SY_CUDA_CHECK(cudaEventElapsedTime(&t, t0, t1));
      ms.push_back(t);
    }
  } catch (const std::exception& e) {
    err = e.what();
  }
  if (t0) cudaEventDestroy(t0);
  if (t1) cudaEventDestroy(t1);
  cudaFree(a);
  cudaFree(b);
  if (!err.empty()) throw std::runtime_error(err);
  std::sort(ms.begin(), ms.end());
  const double sec = ms[ms.size() / 2] / 1000.0;
  return sec > 0 ? 2.0 * static_cast<double>(bytes) / sec : 0;
}

}  // namespace sy::cuda
