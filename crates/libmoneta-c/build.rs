//! Compiles the shim's C part (`csrc/shim.c`: the variadic entry points and stdio glue) into
//! the library, and exports its entry points.

fn main() {
    println!("cargo:rerun-if-changed=csrc/shim.c");
    cc::Build::new()
        .file("csrc/shim.c")
        .flag_if_supported("-fvisibility=default")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .compile("moneta_shim");
    // Export the C entry points too (see the map's comment).
    let map = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("csrc/exports.map");
    println!("cargo:rerun-if-changed={}", map.display());
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map.display()
    );
}
