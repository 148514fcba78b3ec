/* A plain C program that uses a saved model through libdtrain_c.so (c_api.h)
 * and checks what it gets. c_api_test (C++) prepares the files and runs it:
 *
 *   c_api_check MODEL INPUT SHAPE EXPECTED CORRUPT TRUNCATED
 *
 * MODEL      a saved model
 * INPUT      the input, little-endian float32
 * SHAPE      the input shape, comma separated ("2,1,28,28")
 * EXPECTED   the outputs computed in C++, little-endian float32
 * CORRUPT    the model with a flipped byte; TRUNCATED, cut short
 *
 * Prints one line per check and "c_api_check: ok" at the end; exits 1 at
 * the first failed check.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "libs/graph/c_api.h"

static int failures = 0;

static void check(int ok, const char* what) {
  printf("%s: %s\n", ok ? "pass" : "FAIL", what);
  if (!ok) failures++;
}

/* Reads a whole file; *n gets the number of floats. NULL on failure. */
static float* read_floats(const char* path, int64_t* n) {
  FILE* f = fopen(path, "rb");
  if (f == NULL) return NULL;
  fseek(f, 0, SEEK_END);
  long bytes = ftell(f);
  fseek(f, 0, SEEK_SET);
  float* data = (float*)malloc(bytes > 0 ? (size_t)bytes : 1);
  if (data == NULL || fread(data, 1, (size_t)bytes, f) != (size_t)bytes) {
    fclose(f);
    free(data);
    return NULL;
  }
  fclose(f);
  *n = bytes / (long)sizeof(float);
  return data;
}

int main(int argc, char** argv) {
  if (argc != 7) {
    fprintf(stderr, "usage: c_api_check MODEL INPUT SHAPE EXPECTED CORRUPT TRUNCATED\n");
    return 2;
  }
  int64_t shape[8];
  int ndim = 0;
  for (char* tok = strtok(argv[3], ","); tok != NULL && ndim < 8; tok = strtok(NULL, ",")) {
    shape[ndim++] = atoll(tok);
  }
  int64_t n_in = 0, n_want = 0;
  float* input = read_floats(argv[2], &n_in);
  float* want = read_floats(argv[4], &n_want);
  if (input == NULL || want == NULL) {
    fprintf(stderr, "c_api_check: cannot read the input or expected files\n");
    return 2;
  }

  dt_model* m = dt_model_load(argv[1]);
  check(m != NULL, "dt_model_load of the saved model");
  if (m == NULL) {
    fprintf(stderr, "error: %s\n", dt_last_error());
    return 1;
  }
  check(strcmp(dt_last_error(), "") == 0, "no error after a successful load");

  float* out = (float*)malloc((size_t)n_want * sizeof(float));
  int64_t len = -1;
  int rc = dt_model_run(m, input, shape, ndim, out, n_want, &len);
  if (rc != 0) fprintf(stderr, "error: %s\n", dt_last_error());
  check(rc == 0 && len == n_want, "dt_model_run returns the expected number of outputs");
  double worst = 0;
  for (int64_t i = 0; rc == 0 && i < n_want; ++i) {
    double err = fabs((double)out[i] - (double)want[i]) / (1e-6 + fabs((double)want[i]));
    if (err > worst) worst = err;
  }
  printf("max relative difference %g\n", worst);
  check(rc == 0 && worst <= 1e-5, "outputs equal the values computed in C++");

  /* A second run reuses the model. */
  memset(out, 0, (size_t)n_want * sizeof(float));
  rc = dt_model_run(m, input, shape, ndim, out, n_want, &len);
  int same = rc == 0;
  for (int64_t i = 0; same && i < n_want; ++i) {
    same = fabs((double)out[i] - (double)want[i]) <= 1e-5 * (1e-6 + fabs((double)want[i]));
  }
  check(same, "a second run gives the same outputs");

  /* Too small an output buffer: an error, and the needed length. */
  len = -1;
  rc = dt_model_run(m, input, shape, ndim, out, n_want - 1, &len);
  check(rc != 0 && len == n_want && strstr(dt_last_error(), "buffer") != NULL,
        "a small output buffer is an error that reports the length");

  /* A shape the model does not accept. */
  /* (fewer elements than the input holds: [batch, 1]) */
  int64_t bad_shape[2] = {shape[0], 1};
  rc = dt_model_run(m, input, bad_shape, 2, out, n_want, &len);
  check(rc != 0 && strlen(dt_last_error()) > 0, "a wrong input shape is an error");
  printf("  (%s)\n", dt_last_error());
  rc = dt_model_run(m, NULL, shape, ndim, out, n_want, &len);
  check(rc != 0 && strstr(dt_last_error(), "NULL") != NULL, "NULL input is an error");
  rc = dt_model_run(m, input, shape, 0, out, n_want, &len);
  check(rc != 0, "ndim 0 is an error");
  dt_model_free(m);
  dt_model_free(NULL);

  /* Bad files. */
  dt_model* c = dt_model_load(argv[5]);
  check(c == NULL && strstr(dt_last_error(), "checksum") != NULL,
        "a corrupt file fails to load with a checksum error");
  printf("  (%s)\n", dt_last_error());
  dt_model* t = dt_model_load(argv[6]);
  check(t == NULL && strstr(dt_last_error(), "truncated") != NULL,
        "a truncated file fails to load and says so");
  printf("  (%s)\n", dt_last_error());
  dt_model* missing = dt_model_load("/nonexistent/model.dtmodel");
  check(missing == NULL && strlen(dt_last_error()) > 0, "a missing file fails to load");
  check(dt_model_load(NULL) == NULL, "a NULL path fails to load");

  free(out);
  free(input);
  free(want);
  if (failures > 0) {
    printf("c_api_check: %d failed\n", failures);
    return 1;
  }
  printf("c_api_check: ok\n");
  return 0;
}
