// The training step as a device graph (#26 item 6): on a device with graphs (CUDA and HIP graphs,
// the SIMT runtime's model of them, Vulkan's recorded command buffers: DeviceInfo::graphs), a
// micro-batch's forward and backward and the add of its loss into the logging window's sum are
// captured once the shapes have settled and then replayed as one launch, instead of one launch per
// op. The inputs and targets are uploaded into the same buffers before each replay, outside the
// graph. The update after the micro-batches (gradient norm, optimizer, 16-bit weight refresh) is a
// second StepGraph where the optimizer reads its learning rate and step from a device tensor
// uploaded before each replay (AdamW: Optimizer::set_schedule / apply); the others pass them as
// kernel arguments that change every step, and their update runs op by op. The results are those of
// running the ops one by one, bit for bit: the same kernels with the same arguments on the same
// buffers.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "core/device.h"
#include "core/train/train_args.h"

namespace ct {

// Why a run with these settings does not capture its micro-batches ("" when it does): the device
// has no graphs, --no-cuda-graph, or a setting that changes a kernel argument between
// micro-batches or runs host code inside one. `loss_scaling`: fp16's dynamic loss scale is on;
// `world`: data-parallel ranks.
std::string step_graph_refusal(const TrainArgs& args, const DeviceInfo& device, bool loss_scaling,
                               int world);

class StepGraph {
 public:
  // `refusal` as step_graph_refusal gives it ("": capture).
  StepGraph(Device& device, std::string refusal);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Enqueues `micro_batch`, ops that are the same at every call (the same buffers, shapes and
  // scalars): run as they are at the first call (which sizes the workspaces and lets the GEMM
  // library pick its algorithms), captured at the second and replayed from then on. Without
  // capture: run as they are, every call. Where the device's runtime refuses the capture (a
  // driver error), the micro-batch runs as it is, the refusal becomes the reason, said on stderr.
  // A call that the capture rules refuse (Error kInvalidArgument) is thrown.
  void run(const std::function<void()>& micro_batch);
  // Frees the graph (its buffers go back to the device's cache); later calls run eagerly.
  void release();

  bool enabled() const { return refusal_.empty(); }
  const std::string& refusal() const { return refusal_; }
  int64_t replays() const { return replays_; }

 private:
  void capture(const std::function<void()>& micro_batch);
  void give_up(const std::string& why);

  Device& device_;
  std::string refusal_;
  int64_t calls_ = 0;
  int64_t graph_ = 0;  // 0: none yet
  int64_t replays_ = 0;
};

}  // namespace ct
