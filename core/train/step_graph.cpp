#include "core/train/step_graph.h"

#include <cstdio>
#include <exception>
#include <utility>

#include "core/error.h"

namespace ct {

std::string step_graph_refusal(const TrainArgs& args, const DeviceInfo& device, bool loss_scaling,
                               int world) {
  if (!device.graphs) return device.id() + " has no graphs";
  if (!args.cuda_graph) return "--no-cuda-graph";
  if (args.profile)
    return "--profile times every op on its own, and a graph replays them as one launch";
  if (loss_scaling)
    return "--fp16's dynamic loss scale, an argument of the backward's kernels, changes between "
           "steps";
  if (args.lora_r > 0 && args.lora_dropout > 0)
    return "--lora-dropout draws new masks (a kernel argument) for every micro-batch";
  if (world > 1 && args.ddp_overlap)
    return "data parallel with overlap runs the gradient buckets' all-reduce from host code in "
           "the middle of the backward pass (--no-ddp-overlap allows the graph)";
  return "";
}

StepGraph::StepGraph(Device& device, std::string refusal)
    : device_(device), refusal_(std::move(refusal)) {}

StepGraph::~StepGraph() {
  try {
    release();
  } catch (...) {
    // closing must not throw; the device frees what is left when it closes
  }
}

void StepGraph::run(const std::function<void()>& micro_batch) {
  if (!enabled() || calls_++ == 0) {
    micro_batch();
    return;
  }
  if (graph_ == 0) {
    // A call the capture rules refuse (Error kInvalidArgument) is crosstrain's bug: it stops the
    // run (CI finds it on the SIMT runtime). The driver refusing the capture is not: nothing of
    // the micro-batch ran, so it runs as it is, and so does every later one.
    try {
      capture(micro_batch);
    } catch (const Error& e) {
      if (e.kind() == ErrorKind::kInvalidArgument) throw;
      give_up(e.what());
    } catch (const std::exception& e) {
      give_up(e.what());
    }
    if (graph_ == 0) {
      micro_batch();
      return;
    }
  }
  device_.replay_graph(graph_);
  ++replays_;
}

void StepGraph::capture(const std::function<void()>& micro_batch) {
  device_.begin_capture();
  try {
    micro_batch();
  } catch (...) {
    try {  // leaves capture (and drops what was recorded); the error that stopped it is the news
      device_.release_graph(device_.end_capture());
    } catch (...) {
    }
    throw;
  }
  graph_ = device_.end_capture();
}

void StepGraph::give_up(const std::string& why) {
  refusal_ = "the capture failed: " + why;
  std::fprintf(stderr, "graph: %s; each op is launched on its own from here\n", refusal_.c_str());
}

void StepGraph::release() {
  if (graph_ != 0) device_.release_graph(std::exchange(graph_, 0));
  refusal_ = refusal_.empty() ? "released" : refusal_;
}

}  // namespace ct
