/* C ABI for saved models (libs/graph/serialize.h): load a model file written
 * by dtrain, run inference, free it. For programs in C and for other
 * languages' foreign-function interfaces (Python ctypes, Go cgo, Rust ...).
 *
 *   dt_model* m = dt_model_load("/models/lenet.dtmodel");
 *   if (m == NULL) { fprintf(stderr, "%s\n", dt_last_error()); return 1; }
 *   int64_t shape[4] = {1, 1, 28, 28};
 *   float out[10];
 *   int64_t n = 0;
 *   if (dt_model_run(m, image, shape, 4, out, 10, &n) != 0) {
 *     fprintf(stderr, "%s\n", dt_last_error());
 *   }
 *   dt_model_free(m);
 *
 * Link with libdtrain_c.so (//libs/graph:libdtrain_c.so), which exports only
 * these functions.
 *
 * Errors: functions that can fail return NULL or a nonzero status, and
 * dt_last_error() then describes the failure (a corrupt or truncated file,
 * a wrong input shape, a too small output buffer ...). No function aborts
 * the process on bad input, and no C++ exception crosses this interface.
 *
 * Thread-safety: different models may be used from different threads at the
 * same time; one model must be used by one thread at a time. The last error
 * is per thread. Kernels use the calling thread's CPU thread count: the
 * machine's cores, or DTRAIN_CPU_THREADS when set.
 */
#ifndef DTRAIN_LIBS_GRAPH_C_API_H_
#define DTRAIN_LIBS_GRAPH_C_API_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A loaded model (opaque). */
typedef struct dt_model dt_model;

/* Loads the saved model at `path`. Returns NULL on failure (see
 * dt_last_error). The caller owns the model: free it with dt_model_free. */
dt_model* dt_model_load(const char* path);

/* Runs the model on `input`, a dense row-major float32 array of the shape
 * `shape[0..ndim)` (the batch first; any batch the model's ops accept), and
 * writes the model's first output, row-major, to `output`, which has room
 * for `output_capacity` floats. Sets *output_len (if not NULL) to the
 * output's element count, also when the buffer is too small.
 * Returns 0 on success, -1 on failure (see dt_last_error): a NULL argument,
 * ndim outside 1..8, a shape the model does not accept, or
 * output_capacity < *output_len (nothing is written then). */
int dt_model_run(dt_model* model, const float* input, const int64_t* shape, int ndim, float* output,
                 int64_t output_capacity, int64_t* output_len);

/* Frees a model from dt_model_load. NULL is ignored. */
void dt_model_free(dt_model* model);

/* The message of the last failed call on this thread, or "" when the last
 * call succeeded. Valid until the next call on this thread. */
const char* dt_last_error(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DTRAIN_LIBS_GRAPH_C_API_H_ */
