//! ferry-core's build script does no work of its own. It exists so that the
//! `protoc-bin-vendored` build-dependency is part of the build: cargo then fetches the
//! vendored protoc before etcd-client's build script runs, and `scripts/protoc` (the
//! `PROTOC` of `.cargo/config.toml`) executes it. A fresh machine needs no protoc.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // Referenced so the dependency is not unused; the path itself is not needed here.
    let _ = protoc_bin_vendored::protoc_bin_path;
}
