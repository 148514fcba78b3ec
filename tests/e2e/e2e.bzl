"""The end-to-end tests' rule: a cc_test next to a local cluster's binaries."""

# What `trainctl cluster up` starts (from the test's runfiles).
CLUSTER_BINARIES = [
    "//services/kvstore:kvstore_server",
    "//services/scheduler:scheduler_server",
    "//services/trainctl",
    "//services/trainer",
]

def e2e_test(name, deps = [], data = [], size = "large", gtest_main = True, **kwargs):
    """cc_test of <name>.cc with the cluster's binaries, test_cluster, Abseil and GoogleTest.

    Args:
      name: the test; its source is <name>.cc.
      deps: what it needs besides :test_cluster (and :e2e_util), Abseil and GoogleTest.
      data: what it runs besides CLUSTER_BINARIES.
      size: Bazel's test size.
      gtest_main: False for a test with its own main().
      **kwargs: other cc_test attributes (tags, timeout, ...).
    """
    # Options structs (ClusterOptions, MidEpoch) are filled with designated
    # initializers that name only what differs from the defaults.
    copts = ["-Wno-missing-field-initializers"] + kwargs.pop("copts", [])
    native.cc_test(
        name = name,
        copts = copts,
        size = size,
        srcs = [name + ".cc"],
        data = CLUSTER_BINARIES + data,
        deps = [
            ":e2e_util",
            ":test_cluster",
            "@system//:absl",
            "@system//:gtest_main" if gtest_main else "@system//:gtest",
        ] + deps,
        **kwargs
    )
