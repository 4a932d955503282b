//! ferry-core's build script. It names the compiler for `ferry_build_info`
//! (`FERRY_RUSTC_VERSION`), and it keeps the `protoc-bin-vendored` build-dependency part of
//! the build: cargo then fetches the vendored protoc before etcd-client's build script runs,
//! and `scripts/protoc` (the `PROTOC` of `.cargo/config.toml`) executes it. A fresh machine
//! needs no protoc.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=RUSTC");
    // Referenced so the dependency is not unused; the path itself is not needed here.
    let _ = protoc_bin_vendored::protoc_bin_path;
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = std::process::Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|v| v.split_whitespace().nth(1).map(str::to_string))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=FERRY_RUSTC_VERSION={version}");
}
