// SGD with momentum and weight decay (torch.optim.SGD semantics).
//
//   Sgd opt(net->NamedParameters(), {.lr = 0.2f});
//   loss.Backward();
//   opt.Step();       // uses each parameter's grad; skips parameters without one
//   opt.ZeroGrad();
#ifndef DTRAIN_LIBS_NN_OPTIM_H_
#define DTRAIN_LIBS_NN_OPTIM_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "libs/autograd/variable.h"
#include "libs/ops/ops.h"

namespace dtrain {
namespace nn {

class Sgd {
 public:
  Sgd(std::vector<std::pair<std::string, autograd::Variable>> params, const ops::SgdParams& p);

  void Step();
  void ZeroGrad();

  const ops::SgdParams& params() const { return p_; }
  void set_lr(float lr) { p_.lr = lr; }

  // Momentum buffers by parameter name ("<name>.momentum_buffer"), for
  // checkpoints. Empty when momentum is 0 or before the first step.
  std::vector<std::pair<std::string, Tensor*>> NamedState();

  // Restores momentum buffers: `read(name, dst)` fills *dst (allocated here
  // with the parameter's shape) or returns NotFound when the checkpoint has
  // none for that name (the buffer then starts at zero). Other errors abort.
  absl::Status LoadState(
      const std::function<absl::Status(const std::string& name, Tensor* dst)>& read);

 private:
  std::vector<std::pair<std::string, autograd::Variable>> vars_;
  std::vector<Tensor> momentum_;
  ops::SgdParams p_;
};

}  // namespace nn
}  // namespace dtrain

#endif  // DTRAIN_LIBS_NN_OPTIM_H_
