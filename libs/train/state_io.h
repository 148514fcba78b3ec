// Model and optimizer state <-> checkpoint files (libs/checkpoint).
//
// Parameters and buffers are stored under their module names ("0.weight",
// "1.running_mean"), optimizer state under "<param>.momentum_buffer", and
// metadata carries the model name and training position. Loading checks that
// every tensor the model needs is present with the right shape and dtype and
// that the model name matches, so a checkpoint of another model or a corrupt
// file is a clear error and the model is left unchanged.
#ifndef DTRAIN_LIBS_TRAIN_STATE_IO_H_
#define DTRAIN_LIBS_TRAIN_STATE_IO_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "libs/nn/module.h"
#include "libs/nn/optim.h"

namespace dtrain {
namespace train {

absl::Status SaveTrainingState(const std::string& path, const std::string& model_name,
                               nn::Module* model, nn::Sgd* optimizer,
                               const std::map<std::string, std::string>& metadata);

// Restores into `model` (and `optimizer` when non-null). Returns the stored
// metadata.
absl::StatusOr<std::map<std::string, std::string>> LoadTrainingState(const std::string& path,
                                                                     const std::string& model_name,
                                                                     nn::Module* model,
                                                                     nn::Sgd* optimizer);

// Where a job that keeps every epoch's checkpoint (JobSpec
// keep_epoch_checkpoints) keeps epoch `epoch`'s, next to the newest one at
// `checkpoint_path`.
std::string EpochCheckpointPath(const std::string& checkpoint_path, int epoch);

}  // namespace train
}  // namespace dtrain

#endif  // DTRAIN_LIBS_TRAIN_STATE_IO_H_
