# The files that make up the library. Listed by hand so a new file is a reviewed change.
set(MANTISSA_PUBLIC_HEADERS
  include/mantissa/mantissa.h
  include/mantissa/version.h
  include/mantissa/arg.h
  include/mantissa/choice.h
  include/mantissa/argument_enums.h
  include/mantissa/training_arguments.h
  include/mantissa/amp/autocast.h
  include/mantissa/amp/tf32_guard.h
  include/mantissa/amp/unscale.h
  include/mantissa/amp/supports_amp_scaling.h
  include/mantissa/amp/grad_scaler.h
  include/mantissa/amp/master_weights.h
  include/mantissa/optim/low_precision_update.h
  include/mantissa/optim/fused_adamw.h
  include/mantissa/io/safetensors.h
  include/mantissa/lr_scheduler_kwargs.h
  include/mantissa/lr_scheduler.h
  include/mantissa/clip_grad.h
  include/mantissa/batch.h
  include/mantissa/model_output.h
  include/mantissa/model_forward.h
  include/mantissa/precision_plan.h
  include/mantissa/seed.h
  include/mantissa/trainer_callback.h
  include/mantissa/trainer_hooks.h
  include/mantissa/trainer.h
  include/mantissa/tensorboard_callback.h
  include/mantissa/distributed_backend.h
  include/mantissa/distributed.h
)
set(MANTISSA_CXX_SOURCES
  src/device_info.cpp
  src/seed.cpp
  src/training_arguments/python_repr.cpp
  src/training_arguments/cli.cpp
  src/training_arguments/json.cpp
  src/training_arguments/lr_scheduler_kwargs_json.cpp
  src/training_arguments/reporting_checks.cpp
  src/training_arguments/validate.cpp
  src/training_arguments/derived.cpp
  src/amp/tf32_guard.cpp
  src/amp/unscale.cpp
  src/amp/grad_scaler.cpp
  src/amp/master_weights.cpp
  src/optim/fused_adamw.cpp
  src/io/atomic_file.cpp
  src/io/safetensors.cpp
  src/io/filesystem.cpp
  src/io/torch_save.cpp
  src/io/json_reader.cpp
  src/io/tfrecord.cpp
  src/io/tensorboard_event.cpp
  src/io/event_file.cpp
  src/lr_scheduler.cpp
  src/clip_grad.cpp
  src/trainer/trainer_state.cpp
  src/trainer/precision_plan.cpp
  src/trainer/progress.cpp
  src/trainer/step_graph.cpp
  src/trainer/checkpoint.cpp
  src/trainer/metrics_log.cpp
  src/trainer/reporting.cpp
  src/trainer/tensorboard_callback.cpp
  src/trainer/resume_check.cpp
  src/trainer/run_schedule.cpp
  src/trainer/interval_policy.cpp
  src/trainer/loss_window.cpp
  src/trainer/optimizer_factory.cpp
  src/trainer/eager_engine.cpp
  src/trainer/data_parallel.cpp
  src/trainer/gradient_sync.cpp
  src/trainer/graph_engine.cpp
  src/trainer/batch_roles.cpp
  src/trainer/evaluation.cpp
  src/trainer/trainer.cpp
  src/trainer/trainer_loop.cpp
  src/distributed/environment.cpp
  src/distributed/sampler.cpp
  src/distributed/process_group.cpp
)
# The one file that includes ProcessGroupGloo.hpp (and ProcessGroupNCCL.hpp): it alone needs the
# gloo and NCCL headers (CMakeLists.txt).
set(MANTISSA_C10D_SOURCES src/distributed/process_group.cpp)
# CPU kernels compiled once per instruction set with their own flags, and without the PCH
# (cmake/MantissaCpuKernels.cmake); the library picks one at run time.
set(MANTISSA_CPU_KERNEL_SOURCES
  src/optim/fused_adamw_cpu_default.cpp
  src/optim/fused_adamw_cpu_avx2.cpp
  src/optim/fused_adamw_cpu_avx512.cpp
)
set(MANTISSA_CUDA_SOURCES
  src/amp/unscale_cuda.cu
  src/optim/fused_adamw_cuda.cu
)
list(TRANSFORM MANTISSA_PUBLIC_HEADERS PREPEND "${CMAKE_CURRENT_SOURCE_DIR}/")
list(TRANSFORM MANTISSA_CXX_SOURCES PREPEND "${CMAKE_CURRENT_SOURCE_DIR}/")
list(TRANSFORM MANTISSA_CPU_KERNEL_SOURCES PREPEND "${CMAKE_CURRENT_SOURCE_DIR}/")
list(TRANSFORM MANTISSA_C10D_SOURCES PREPEND "${CMAKE_CURRENT_SOURCE_DIR}/")
list(TRANSFORM MANTISSA_CUDA_SOURCES PREPEND "${CMAKE_CURRENT_SOURCE_DIR}/")
