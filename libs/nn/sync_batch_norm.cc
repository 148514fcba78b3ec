#include "libs/nn/sync_batch_norm.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/base/logging.h"
#include "libs/base/status.h"

namespace dtrain {
namespace nn {

using autograd::Variable;

SyncBatchNormGroup::SyncBatchNormGroup(int members, absl::Duration timeout, CrossGather cross)
    : members_(members), timeout_(timeout), cross_(std::move(cross)) {
  DT_CHECK(members >= 1) << "a sync batch-norm group needs members, got " << members;
  DT_CHECK(timeout > absl::ZeroDuration()) << "sync batch-norm timeout must be positive";
  slots_.resize(members);
  loss_weights_.assign(members, 1.0);
}

absl::StatusOr<std::vector<double>> SyncBatchNormGroup::Gather(int member,
                                                               const std::vector<double>& mine) {
  DT_CHECK(member >= 0 && member < members_) << "member " << member << " of " << members_;
  absl::MutexLock lock(&mu_);
  if (!error_.ok()) return error_;
  const int64_t my_generation = generation_;
  slots_[member] = mine;
  if (++arrived_ < members_) {
    auto done = [this, my_generation]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return generation_ != my_generation || !error_.ok();
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&done), timeout_)) {
      error_ = absl::DeadlineExceededError(absl::StrCat(
          "sync batch norm: member ", member, " waited ", absl::FormatDuration(timeout_),
          arrived_ == members_
              ? " for the other trainers (every member of this trainer arrived)"
              : absl::StrCat(" for the other members (", arrived_, " of ", members_, " arrived)")));
    }
    if (generation_ != my_generation) return result_;  // completed (maybe just before an error)
    return error_;
  }
  // The last member to arrive completes the gathering.
  std::vector<double> local;
  for (const std::vector<double>& s : slots_) {
    if (s.size() != mine.size()) {
      error_ = absl::InternalError(absl::StrCat("sync batch norm: members contributed ", s.size(),
                                                " and ", mine.size(),
                                                " values (do the replicas run the same model?)"));
      return error_;
    }
    local.insert(local.end(), s.begin(), s.end());
  }
  std::vector<double> all;
  if (cross_) {
    // The other members wait for the generation to change meanwhile.
    mu_.Unlock();
    absl::Status s = cross_(local, &all);
    mu_.Lock();
    if (s.ok() && all.size() % local.size() != 0) {
      s = absl::InternalError(absl::StrCat("sync batch norm: the cross-trainer gather returned ",
                                           all.size(), " values for ", local.size()));
    }
    if (!s.ok()) {
      if (error_.ok()) error_ = Annotate(s, "sync batch norm across trainers");
      return error_;
    }
    if (!error_.ok()) return error_;  // aborted or timed out meanwhile
  } else {
    all = std::move(local);
  }
  result_ = std::move(all);
  arrived_ = 0;
  ++generation_;
  return result_;
}

void SyncBatchNormGroup::Abort(const absl::Status& reason) {
  absl::MutexLock lock(&mu_);
  if (error_.ok()) {
    error_ = reason.ok() ? absl::AbortedError("sync batch norm: aborted") : reason;
  }
}

void SyncBatchNormGroup::Reset() {
  absl::MutexLock lock(&mu_);
  error_ = absl::OkStatus();
  arrived_ = 0;
  ++generation_;
  for (auto& s : slots_) s.clear();
  result_.clear();
}

absl::Status SyncBatchNormGroup::status() const {
  absl::MutexLock lock(&mu_);
  return error_;
}

void SyncBatchNormGroup::set_loss_weight(int member, double weight) {
  absl::MutexLock lock(&mu_);
  loss_weights_.at(member) = weight;
}

double SyncBatchNormGroup::loss_weight(int member) const {
  absl::MutexLock lock(&mu_);
  return loss_weights_.at(member);
}

Variable SyncBatchNorm(const Variable& x, const Variable& gamma, const Variable& beta,
                       Tensor* running_mean, Tensor* running_var, float momentum, float eps,
                       std::shared_ptr<SyncBatchNormGroup> group, int member) {
  const Tensor& xv = x.value();
  DT_CHECK(xv.device().is_cpu() && xv.dtype() == DType::kF32)
      << "sync batch norm: needs f32 CPU input, got " << xv.DebugString();
  DT_CHECK(xv.ndim() == 2 || xv.ndim() == 4)
      << "sync batch norm: x " << xv.DebugString() << " is not [N, C] or [N, C, H, W]";
  const int64_t n = xv.dim(0), c = xv.dim(1);
  const int64_t hw = n * c == 0 ? 0 : xv.numel() / (n * c);
  DT_CHECK(gamma.value().numel() == c && beta.value().numel() == c)
      << "sync batch norm: gamma/beta for " << c << " channels";
  const float* px = xv.data<float>();
  const int64_t local_count = n * hw;

  // This member's per-channel count, mean and M2 (two passes, in double).
  std::vector<double> mine(1 + 2 * c, 0.0);
  mine[0] = static_cast<double>(local_count);
  for (int64_t ic = 0; ic < c; ++ic) {
    double sum = 0;
    for (int64_t in = 0; in < n; ++in) {
      const float* p = px + (in * c + ic) * hw;
      for (int64_t j = 0; j < hw; ++j) sum += p[j];
    }
    const double mean = local_count > 0 ? sum / local_count : 0.0;
    double m2 = 0;
    for (int64_t in = 0; in < n; ++in) {
      const float* p = px + (in * c + ic) * hw;
      for (int64_t j = 0; j < hw; ++j) {
        const double d = p[j] - mean;
        m2 += d * d;
      }
    }
    mine[1 + ic] = mean;
    mine[1 + c + ic] = m2;
  }
  // Combine every member's statistics in (trainer, member) order.
  absl::StatusOr<std::vector<double>> all = group->Gather(member, mine);
  const std::vector<double>& stats = all.ok() ? *all : mine;  // on error: local, see header
  const size_t stride = mine.size();
  double count = 0;
  std::vector<double> mean(c, 0.0), m2(c, 0.0);
  for (size_t off = 0; off < stats.size(); off += stride) {
    const double nb = stats[off];
    if (nb <= 0) continue;
    const double total = count + nb;
    for (int64_t ic = 0; ic < c; ++ic) {
      const double delta = stats[off + 1 + ic] - mean[ic];
      mean[ic] += delta * nb / total;
      m2[ic] += stats[off + 1 + c + ic] + delta * delta * count * nb / total;
    }
    count = total;
  }
  DT_CHECK(count > 1) << "sync batch norm: x " << xv.DebugString()
                      << " has one value per channel over all members; training needs more";

  std::vector<float> mean_f(c), inv_std(c);
  float* rm = running_mean != nullptr ? running_mean->data<float>() : nullptr;
  float* rv = running_var != nullptr ? running_var->data<float>() : nullptr;
  const double unbias = count / (count - 1);
  for (int64_t ic = 0; ic < c; ++ic) {
    const double var = m2[ic] / count;  // biased, for normalization
    mean_f[ic] = static_cast<float>(mean[ic]);
    inv_std[ic] = static_cast<float>(1.0 / std::sqrt(var + eps));
    if (rm != nullptr) rm[ic] = (1.0f - momentum) * rm[ic] + momentum * mean_f[ic];
    if (rv != nullptr) {
      rv[ic] = (1.0f - momentum) * rv[ic] + momentum * static_cast<float>(var * unbias);
    }
  }

  Tensor y = Tensor::Empty(xv.shape(), xv.dtype(), xv.device());
  const float* pg = gamma.value().data<float>();
  const float* pb = beta.value().data<float>();
  float* py = y.data<float>();
  for (int64_t in = 0; in < n; ++in) {
    for (int64_t ic = 0; ic < c; ++ic) {
      const int64_t base = (in * c + ic) * hw;
      const float m = mean_f[ic], s = inv_std[ic], g = pg[ic], b = pb[ic];
      for (int64_t j = 0; j < hw; ++j) py[base + j] = g * ((px[base + j] - m) * s) + b;
    }
  }

  const Tensor gv = gamma.value();
  const bool nx = x.defined() && x.requires_grad();
  const bool ng = gamma.defined() && gamma.requires_grad();
  const bool nbeta = beta.defined() && beta.requires_grad();
  Tensor saved_x = xv;
  return autograd::MakeResult(
      y, "sync_batch_norm", {x, gamma, beta}, [=](const Tensor& dy, std::vector<Tensor>* grads) {
        const float* pdy = dy.data<float>();
        const float* sx = saved_x.data<float>();
        // Local per-channel sums of dy and dy * xhat.
        std::vector<double> sdy(c, 0.0), sdyx(c, 0.0);
        for (int64_t in = 0; in < n; ++in) {
          for (int64_t ic = 0; ic < c; ++ic) {
            const int64_t base = (in * c + ic) * hw;
            const float m = mean_f[ic], s = inv_std[ic];
            double a = 0, b = 0;
            for (int64_t j = 0; j < hw; ++j) {
              const float xhat = (sx[base + j] - m) * s;
              a += pdy[base + j];
              b += static_cast<double>(pdy[base + j]) * xhat;
            }
            sdy[ic] += a;
            sdyx[ic] += b;
          }
        }
        if (ng) {
          Tensor dg = Tensor::Empty(gv.shape(), gv.dtype(), gv.device());
          for (int64_t ic = 0; ic < c; ++ic) dg.data<float>()[ic] = static_cast<float>(sdyx[ic]);
          (*grads)[1] = dg;
        }
        if (nbeta) {
          Tensor db = Tensor::Empty(gv.shape(), gv.dtype(), gv.device());
          for (int64_t ic = 0; ic < c; ++ic) db.data<float>()[ic] = static_cast<float>(sdy[ic]);
          (*grads)[2] = db;
        }
        if (!nx) return;
        // Global sums of the loss-weighted dy and dy * xhat (see the header:
        // member r's dy is 1/w_r times the global loss's).
        const double w = group->loss_weight(member);
        std::vector<double> contrib(2 * c);
        for (int64_t ic = 0; ic < c; ++ic) {
          contrib[ic] = w * sdy[ic];
          contrib[c + ic] = w * sdyx[ic];
        }
        absl::StatusOr<std::vector<double>> gathered = group->Gather(member, contrib);
        std::vector<double> s1(c, 0.0), s2(c, 0.0);
        double total = count;
        if (gathered.ok()) {
          for (size_t off = 0; off < gathered->size(); off += 2 * c) {
            for (int64_t ic = 0; ic < c; ++ic) {
              s1[ic] += (*gathered)[off + ic];
              s2[ic] += (*gathered)[off + c + ic];
            }
          }
        } else {  // the step fails (status()); finish with local sums
          s1.assign(contrib.begin(), contrib.begin() + c);
          s2.assign(contrib.begin() + c, contrib.end());
          total = static_cast<double>(local_count);
        }
        Tensor dx = Tensor::Empty(saved_x.shape(), saved_x.dtype(), saved_x.device());
        float* pdx = dx.data<float>();
        const float* g = gv.data<float>();
        for (int64_t ic = 0; ic < c; ++ic) {
          const float k1 = static_cast<float>(s1[ic] / (total * w));
          const float k2 = static_cast<float>(s2[ic] / (total * w));
          const float scale = g[ic] * inv_std[ic];
          const float m = mean_f[ic], s = inv_std[ic];
          for (int64_t in = 0; in < n; ++in) {
            const int64_t base = (in * c + ic) * hw;
            for (int64_t j = 0; j < hw; ++j) {
              const float xhat = (sx[base + j] - m) * s;
              pdx[base + j] = scale * (pdy[base + j] - k1 - xhat * k2);
            }
          }
        }
        (*grads)[0] = dx;
      });
}

}  // namespace nn
}  // namespace dtrain
