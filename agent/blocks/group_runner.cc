#include "agent/blocks/group_runner.h"

#include <torch/csrc/autograd/engine.h>

#include <utility>

#include "agent/blocks/rng_fork.h"

namespace memplan {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Everything one group call keeps between its forward and its backward. Held by the autograd
// context (as a capsule), so it dies with the outer graph.
struct GroupCall : torch::CustomClassHolder {
  GroupSpec spec;
  GroupRunnerOptions options;
  bool input_requires_grad = false;
  torch::Tensor inner_input;  // NONE/SWAP: the leaf the inner graph starts from
  // NONE/SWAP: where the inner graph's output enters it, without the output's storage
  // ([Outputs belong to the next group]).
  torch::autograd::Edge inner_edge;
  torch::Tensor saved_input;  // CKPT: the block input, kept on the device
  RngState rng;               // CKPT/HS_OFFLOAD
};

// A leaf that starts the inner graph at `input`: same storage, no history.
torch::Tensor InnerLeaf(const torch::Tensor& input, bool requires_grad) {
  torch::Tensor leaf = input.detach();
  if (requires_grad) leaf.requires_grad_(true);
  return leaf;
}

class GroupFunction : public torch::autograd::Function<GroupFunction> {
 public:
  // `anchor` is a grad-requiring placeholder that makes autograd record this node even when
  // `input` (token ids) needs no gradient.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& input,
                               const torch::Tensor& anchor, c10::intrusive_ptr<GroupCall> call) {
    const GroupSpec& spec = call->spec;
    ParamResidency* residency = call->options.residency;
    ActivationOffloader* offloader = call->options.offloader;
    const int g = spec.group;
    call->input_requires_grad = input.requires_grad();

    if (residency != nullptr) residency->PreForward(g);
    torch::Tensor output;
    switch (spec.mode) {
      case BlockMode::kNone:
      case BlockMode::kSwap: {
        torch::AutoGradMode grad_on(true);
        call->inner_input = InnerLeaf(input, call->input_requires_grad);
        std::unique_ptr<ActivationOffloader::SwapScope> scope;
        if (spec.mode == BlockMode::kSwap) scope = offloader->BeginSwap(g, call->inner_input);
        const torch::Tensor inner_output = spec.body(call->inner_input);
        // [Outputs belong to the next group] The detached output shares storage with the inner
        // one; the outer node stands in for the inner graph from here on. Backward needs only the
        // graph's entry, not the output's values: holding the tensor would keep its storage on
        // the device until backward, so an HS_OFFLOAD group after this one (which copies its
        // input to the host and drops it) kept it anyway, one hidden state the planner does not
        // charge. A next group that needs its input keeps it itself.
        if (inner_output.requires_grad()) {
          call->inner_edge = torch::autograd::impl::gradient_edge(inner_output);
        }
        output = inner_output.detach();
        break;
      }
      case BlockMode::kCkpt:
      case BlockMode::kHsOffload: {
        call->rng = CaptureRng(input.device());
        torch::NoGradGuard no_grad;
        output = spec.body(input.detach());
        if (spec.mode == BlockMode::kCkpt) {
          call->saved_input = input.detach();
        } else {
          offloader->OffloadInput(g, input);
        }
        break;
      }
    }
    if (residency != nullptr) residency->PostForward(g);
    // Every group: the end of a group's forward is where older groups' copies are waited for
    // and their sources freed ([Sources released in program order], activation_offloader.cc).
    if (offloader != nullptr) offloader->EndForwardGroup(g);
    ctx->saved_data["call"] = c10::IValue::make_capsule(std::move(call));
    return output;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto call = c10::static_intrusive_pointer_cast<GroupCall>(ctx->saved_data["call"].toCapsule());
    ctx->saved_data.erase("call");
    const GroupSpec& spec = call->spec;
    ParamResidency* residency = call->options.residency;
    ActivationOffloader* offloader = call->options.offloader;
    const int g = spec.group;

    if (residency != nullptr) residency->PreBackward(g);
    if (offloader != nullptr) {
      // This group's data first (normally already started one group earlier), then the next
      // group backward will need, so that its copy overlaps this group's compute.
      offloader->Prefetch(g);
      offloader->Prefetch(g - 1);
    }
    if (spec.before_backward) spec.before_backward();

    torch::Tensor leaf;
    torch::autograd::Edge entry;
    switch (spec.mode) {
      case BlockMode::kNone:
      case BlockMode::kSwap:
        leaf = std::move(call->inner_input);
        entry = std::move(call->inner_edge);
        break;
      case BlockMode::kCkpt:
      case BlockMode::kHsOffload: {
        torch::Tensor input =
            spec.mode == BlockMode::kCkpt ? std::move(call->saved_input) : offloader->TakeInput(g);
        leaf = InnerLeaf(input, call->input_requires_grad);
        input.reset();
        RngFork fork(call->rng);
        torch::AutoGradMode grad_on(true);
        const torch::Tensor output = spec.body(leaf);
        if (output.requires_grad()) entry = torch::autograd::impl::gradient_edge(output);
        break;
      }
    }
    if (entry.function != nullptr && grad_outputs[0].defined()) {
      // What torch::autograd::backward({output}, {grad}) runs, from the graph's entry.
      torch::autograd::Engine::get_default_engine().execute(
          {entry}, {grad_outputs[0]}, /*keep_graph=*/false, /*create_graph=*/false,
          /*accumulate_grad=*/true);
    }
    entry = torch::autograd::Edge();
    torch::Tensor input_grad;
    if (call->input_requires_grad) input_grad = leaf.grad();
    leaf.reset();

    if (spec.after_backward) spec.after_backward();
    if (residency != nullptr) residency->PostBackward(g);
    if (offloader != nullptr) offloader->Clear(g);
    return {input_grad, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor RunGroup(const GroupSpec& spec, const torch::Tensor& input,
                       const GroupRunnerOptions& options) {
  TORCH_CHECK(spec.body, "RunGroup: group ", spec.group, " has no body");
  TORCH_CHECK(options.offloader != nullptr ||
                  (spec.mode != BlockMode::kSwap && spec.mode != BlockMode::kHsOffload),
              "RunGroup: group ", spec.group, " uses mode ", std::string(BlockModeName(spec.mode)),
              " but no ActivationOffloader was given");
  auto call = c10::make_intrusive<GroupCall>();
  call->spec = spec;
  call->options = options;
  // Autograd's custom Functions need every tensor argument defined; the anchor only requires
  // grad when the input does not.
  torch::Tensor anchor = torch::empty(
      {0}, torch::TensorOptions().device(input.device()).requires_grad(!input.requires_grad()));
  return GroupFunction::apply(input, anchor, std::move(call));
}

}  // namespace memplan
