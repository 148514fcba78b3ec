// Synchronized batch norm: the replicas of a data-parallel job normalize with
// the mean and variance of the global batch instead of their own slice
// (PyTorch's SyncBatchNorm, the "synchronized batch norm" option of the
// chapter's batch-norm discussion).
//
// Every BatchNorm2d layer of every replica in a trainer shares one
// SyncBatchNormGroup per layer; replica r is member r. In training mode the
// layer's forward gathers each member's per-channel (count, mean, M2) and
// combines them (Chan's parallel formula, in a fixed order, so every member
// and every trainer computes bitwise the same statistics); its backward
// gathers each member's per-channel sums of dy and dy * xhat. With a
// CrossGather (for example a collective::Communicator allgather) the
// combined contributions of every trainer are gathered too.
//
//   auto group = std::make_shared<SyncBatchNormGroup>(k, absl::Minutes(5));
//   for (int r = 0; r < k; ++r) bn_of_replica[r]->SetSyncGroup(group, r);
//   // every step, before the replicas run forward:
//   group->Reset();
//   for (int r = 0; r < k; ++r) group->set_loss_weight(r, slice_rows[r] / global_rows);
//
// Loss weights. Data-parallel training computes the gradient of the global
// loss as sum_r w_r * grad(L_r), where L_r is replica r's own loss (the mean
// over its slice) and w_r its weight (slice size / global batch, divided by
// the number of trainers when trainers average). With shared statistics L_r
// depends on every replica's inputs, so the backward of member r returns
// (1 / w_r) * dL/dx_r: the trainer's weighted sum then yields the exact
// gradient of the global loss, even for uneven slices.
//
// Deadlocks. Every member must call Gather the same number of times in the
// same order (the replicas run the same graph). A waiting member gives up
// after the group's timeout (DeadlineExceeded); Abort() releases every waiter
// (a replica that failed elsewhere must call it). After an error the layer
// falls back to per-member statistics so the replica's step finishes quickly,
// and status() reports the error: the caller must fail the step.
//
// Thread-safety: a group is shared by its members' threads; Reset and
// set_loss_weight must not race with Gather.
#ifndef DTRAIN_LIBS_NN_SYNC_BATCH_NORM_H_
#define DTRAIN_LIBS_NN_SYNC_BATCH_NORM_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "libs/autograd/variable.h"
#include "libs/tensor/tensor.h"

namespace dtrain {
namespace nn {

class SyncBatchNormGroup {
 public:
  // Gathers this trainer's `local` (its members' contributions in member
  // order) from every trainer into `all` (trainers x local.size(), in rank
  // order). Called by exactly one member per gathering, in the same order on
  // every trainer. Every trainer must have the same number of members.
  using CrossGather =
      std::function<absl::Status(const std::vector<double>& local, std::vector<double>* all)>;

  // REQUIRES: members >= 1, timeout > 0.
  SyncBatchNormGroup(int members, absl::Duration timeout, CrossGather cross = nullptr);

  int members() const { return members_; }

  // Member `member` contributes `mine` (the same length from every member)
  // and blocks until every member (of every trainer, with a CrossGather) has
  // contributed to this gathering. Returns all contributions concatenated in
  // (trainer, member) order. Errors: DeadlineExceeded after the timeout,
  // Aborted after Abort(), the CrossGather's error; the first error is kept
  // (status()) and fails every later Gather until Reset().
  absl::StatusOr<std::vector<double>> Gather(int member, const std::vector<double>& mine);

  // Fails current and later Gathers with `reason` until Reset().
  void Abort(const absl::Status& reason);
  // Starts over (a new step): clears the error and any partial gathering.
  // REQUIRES: no member is inside Gather.
  void Reset();
  // The first error since Reset().
  absl::Status status() const;

  // Member `member`'s loss weight w_r (see the file comment); 1 by default.
  void set_loss_weight(int member, double weight);
  double loss_weight(int member) const;

 private:
  const int members_;
  const absl::Duration timeout_;
  const CrossGather cross_;
  mutable absl::Mutex mu_;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::vector<double>> slots_ ABSL_GUARDED_BY(mu_);
  std::vector<double> result_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::vector<double> loss_weights_ ABSL_GUARDED_BY(mu_);
};

// Batch norm in training mode over channels (dim 1 of [N, C] or [N, C, H, W]
// inputs) with statistics over every member of `group` (see the file
// comment); updates *running_mean and *running_var (may be null) from the
// global mean and the unbiased global variance, as BatchNorm does.
autograd::Variable SyncBatchNorm(const autograd::Variable& x, const autograd::Variable& gamma,
                                 const autograd::Variable& beta, Tensor* running_mean,
                                 Tensor* running_var, float momentum, float eps,
                                 std::shared_ptr<SyncBatchNormGroup> group, int member);

}  // namespace nn
}  // namespace dtrain

#endif  // DTRAIN_LIBS_NN_SYNC_BATCH_NORM_H_
