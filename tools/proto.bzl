"""cc_grpc_library: a .proto compiled by Debian's protoc and grpc_cpp_plugin.

Bazel's native cc_proto_library wants protobuf's sources as a repository; this
macro runs the system protoc in a genrule instead and wraps the generated code
in a cc_library. Generated headers are included as "protos/foo.pb.h".

    cc_grpc_library(
        name = "job_cc",
        srcs = ["job.proto"],
        deps = [":common_cc"],   # other cc_grpc_library targets it imports
    )
"""

def cc_grpc_library(name, srcs, deps = [], grpc = True, visibility = None):
    pkg = native.package_name()
    outs = []
    for src in srcs:
        if not src.endswith(".proto"):
            fail("cc_grpc_library srcs must be .proto files, got " + src)
        base = src[:-len(".proto")]
        outs += [base + ".pb.h", base + ".pb.cc"]
        if grpc:
            outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]

    # Imports of other protos need their files in the sandbox.
    dep_protos = [d + "_proto_files" for d in deps]
    cmd = "/usr/bin/protoc -I. --cpp_out=$(GENDIR)"
    if grpc:
        cmd += " --grpc_out=$(GENDIR) --plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin"
    cmd += " " + " ".join(["%s/%s" % (pkg, s) for s in srcs])

    native.filegroup(
        name = name + "_proto_files",
        srcs = srcs + dep_protos,
        visibility = visibility,
    )
    native.genrule(
        name = name + "_codegen",
        srcs = srcs + dep_protos,
        outs = outs,
        cmd = cmd,
        message = "protoc " + " ".join(srcs),
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        copts = ["-Wno-unused-parameter"],
        deps = deps + ["@system//:protobuf"] + (["@system//:grpc"] if grpc else []),
        visibility = visibility,
    )
