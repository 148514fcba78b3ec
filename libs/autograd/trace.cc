#include "libs/autograd/trace.h"

namespace dtrain {
namespace autograd {
namespace internal {

__thread Tracer* tls_tracer = nullptr;

}  // namespace internal
}  // namespace autograd
}  // namespace dtrain
