# Included by tests/CMakeLists.txt in every build, and alone in SY_DEVICE_ONLY builds: plain
# programs and scripts, no Catch2. SY_MODEL_PATH is set by the includer.
# Tests that need a CUDA device carry the label `gpu` and exit 77 (skipped) without one.
if(SY_CUDA_ENABLED)
  add_executable(test_cuda_smoke gpu/cuda_smoke.cpp)
  target_link_libraries(test_cuda_smoke PRIVATE sy_kernels_cuda)
  add_test(NAME gpu/cuda_smoke COMMAND test_cuda_smoke)
  set_tests_properties(gpu/cuda_smoke PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 120)
  # Per-op parity against the CPU reference (plain programs: exit 77 without a device).
  foreach(t IN ITEMS ops attention sampling)
    add_executable(test_cuda_${t} gpu/test_cuda_${t}.cpp)
    target_link_libraries(test_cuda_${t} PRIVATE sy_kernels_cuda sy_kernels_cpu sy_worker_engine)
    add_test(NAME gpu/cuda_${t} COMMAND test_cuda_${t})
    set_tests_properties(gpu/cuda_${t} PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 300)
  endforeach()
  # The weight decoder of dequantize/embedding, checked on the host against the CPU reference:
  # runs everywhere (no device needed), so layout bugs show without a GPU.
  add_executable(test_quant_decode gpu/test_quant_decode.cpp)
  target_link_libraries(test_quant_decode PRIVATE sy_kernels_cuda sy_kernels_cpu)
  add_test(NAME gpu/quant_decode_host COMMAND test_quant_decode)
  set_tests_properties(gpu/quant_decode_host PROPERTIES TIMEOUT 120)
  add_executable(test_cuda_forward gpu/test_cuda_forward.cpp)
  target_link_libraries(test_cuda_forward PRIVATE sy_cuda_forward sy_worker_engine)
  # The generated model families: $SY_TEST_MODELS_DIR at run time, else this build's test-models/
  # (tests/tools/test_models.sh); the device check carries a few (deploy/gpu-check.sh).
  target_compile_definitions(test_cuda_forward PRIVATE SY_MODEL_PATH="${SY_MODEL_PATH}"
                                                       SY_TEST_MODELS_DIR="${CMAKE_BINARY_DIR}/test-models")
  add_test(NAME gpu/cuda_forward COMMAND test_cuda_forward)
  set_tests_properties(gpu/cuda_forward PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 600)
  # The engine on the CUDA backend: vs the CPU engine, graphs vs eager, seeded device sampling.
  add_executable(test_cuda_engine gpu/test_cuda_engine.cpp)
  target_link_libraries(test_cuda_engine PRIVATE sy_cuda_forward sy_worker_engine)
  target_compile_definitions(test_cuda_engine PRIVATE SY_MODEL_PATH="${SY_MODEL_PATH}")
  add_test(NAME gpu/cuda_engine COMMAND test_cuda_engine)
  set_tests_properties(gpu/cuda_engine PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 600)
else()
  # Without the CUDA toolkit the GPU tests are not built; they are still listed, each a visible
  # skip with the reason (exit 77), so a run shows what it did not check. Not a failure under CI:
  # CI machines have no GPU (the GPU tests run in the device check, deploy/gpu-check.sh); set
  # SY_REQUIRE_GPU=1 to make the missing build a failure.
  foreach(t IN ITEMS cuda_smoke cuda_ops cuda_attention cuda_sampling quant_decode_host cuda_forward cuda_engine)
    add_test(NAME gpu/${t} COMMAND sh -c
             "echo 'SKIP: GPU tests not built (no CUDA toolkit, or SY_CUDA=OFF)' >&2; [ -n \"$SY_REQUIRE_GPU\" ] && exit 1; exit 77")
    set_tests_properties(gpu/${t} PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 30)
  endforeach()
endif()
# `--device` and `--cuda-graphs` mistakes, and no GPU where none exists, end with a message and
# exit code 1 (never a crash); runs everywhere. Device-only builds have no `serve`: the same
# start-up through `switchyard-bench serve-check` (worker/cli/serve_engine.hpp).
if(SY_DEVICE_ONLY)
  add_test(NAME worker/device_errors
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/gpu/device_errors.sh $<TARGET_FILE:switchyard-bench> ${SY_MODEL_PATH}
                   serve-check)
else()
  add_test(NAME worker/device_errors
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/gpu/device_errors.sh $<TARGET_FILE:switchyard-worker> ${SY_MODEL_PATH})
endif()
set_tests_properties(worker/device_errors PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
