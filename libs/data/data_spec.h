// JobSpec.data (protos/scheduler.proto DataSpec) to a DataConfig (config.h),
// for the scheduler's checks at submit and the trainers' plans.
//
//   DT_ASSIGN_OR_RETURN(data::DataConfig c, data::DataConfigFromSpec(spec.data()));
//
// Errors are InvalidArgument naming the field ("data.transforms.mean: ...");
// ValidateDataConfig's checks are included.
//
// Thread-safe: no shared state.
#ifndef DTRAIN_LIBS_DATA_DATA_SPEC_H_
#define DTRAIN_LIBS_DATA_DATA_SPEC_H_

#include "absl/status/statusor.h"
#include "libs/data/config.h"
#include "protos/scheduler.pb.h"

namespace dtrain::data {

absl::StatusOr<DataConfig> DataConfigFromSpec(const scheduler::v1::DataSpec& spec);

}  // namespace dtrain::data

#endif  // DTRAIN_LIBS_DATA_DATA_SPEC_H_
