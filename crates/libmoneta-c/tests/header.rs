//! `include/moneta.h` is generated from `src/` (`lib.rs` and the modules it names, but the
//! shim); this test regenerates it and fails if the committed header differs, so the two cannot
//! drift. `MONETA_BLESS=1` rewrites the header.

use std::path::Path;

#[test]
fn header_matches_the_code() {
    let krate = Path::new(env!("CARGO_MANIFEST_DIR"));
    let header = krate.join("../../include/moneta.h");
    let config = cbindgen::Config::from_file(krate.join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(krate.join("src/lib.rs"))
        .generate()
        .expect("generate the header");
    let mut fresh = Vec::new();
    bindings.write(&mut fresh);
    let fresh = String::from_utf8(fresh).unwrap();
    if std::env::var("MONETA_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&header, &fresh).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&header).unwrap_or_default();
    assert!(
        committed == fresh,
        "include/moneta.h is out of date with src/; regenerate it with \
         MONETA_BLESS=1 cargo test -p libmoneta-c --test header"
    );
}

/// The header compiles on its own as strict C and as C++.
#[test]
fn header_compiles_as_c_and_cpp() {
    let krate = Path::new(env!("CARGO_MANIFEST_DIR"));
    let include = krate.join("../../include");
    let dir = std::env::temp_dir().join(format!("moneta-header-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("use.c");
    std::fs::write(
        &src,
        "#include \"moneta.h\"\n\
         int main(void) { struct moneta_stat st; struct moneta_conn *(*f)(const char *) = moneta_connect; st.size = f != 0; return (int)st.size; }\n",
    )
    .unwrap();
    for (cc, std, lang) in [("cc", "-std=c11", "c"), ("c++", "-std=c++11", "c++")] {
        let out = std::process::Command::new(cc)
            .args([
                std,
                "-x",
                lang,
                "-Wall",
                "-Wextra",
                "-pedantic",
                "-Werror",
                "-c",
                "-I",
            ])
            .arg(&include)
            .arg(&src)
            .arg("-o")
            .arg(dir.join(format!("use-{lang}.o")))
            .output()
            .unwrap_or_else(|e| panic!("run {cc}: {e}"));
        assert!(
            out.status.success(),
            "{cc} {std} rejects moneta.h:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `libmoneta.so` exports exactly the functions the header declares and the shim's hooks:
/// rustc links a `cdylib` with a version script that exports only `#[no_mangle]` items (the
/// shim's C part adds its entry points with `csrc/exports.map`), and this checks both lists
/// against the sources.
#[test]
fn exports_match_the_header_and_the_shim() {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let so = dir.join("libmoneta.so");
    {
        // `cargo test` leaves the library as the last `cargo build` made it: bring it up to date.
        let mut c = std::process::Command::new(env!("CARGO"));
        c.args(["build", "--quiet", "-p", "libmoneta-c"]);
        if dir.ends_with("release") {
            c.arg("--release");
        }
        assert!(c.status().unwrap().success(), "cargo build -p libmoneta-c");
    }
    let out = std::process::Command::new("nm")
        .args(["-D", "--defined-only", "--format=posix"])
        .arg(&so)
        .output()
        .expect("run nm");
    assert!(out.status.success());
    let mut exported: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let name = w.next()?;
            (w.next()? == "T").then(|| name.split('@').next().unwrap().to_string())
        })
        .collect();
    exported.sort();
    let krate = Path::new(env!("CARGO_MANIFEST_DIR"));
    let header = std::fs::read_to_string(krate.join("../../include/moneta.h")).unwrap();
    let mut expected: Vec<String> = header
        .lines()
        .filter(|l| !l.starts_with("//") && !l.starts_with('#') && l.contains('('))
        .filter_map(|l| {
            let name = l.split('(').next()?.rsplit([' ', '*']).next()?;
            name.starts_with("moneta_").then(|| name.to_string())
        })
        .collect();
    // The shim's Rust hooks: every `#[no_mangle]` function under src/shim, in its
    // subdirectories too.
    let mut sources = Vec::new();
    let mut dirs = vec![krate.join("src/shim")];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                sources.push(path);
            }
        }
    }
    for path in sources {
        let text = std::fs::read_to_string(path).unwrap();
        let mut lines = text.lines().peekable();
        while let Some(l) = lines.next() {
            if l.trim() == "#[no_mangle]" {
                let sig = lines.next().unwrap_or_default();
                if let Some(rest) = sig.split("fn ").nth(1) {
                    expected.push(rest.split('(').next().unwrap().trim().to_string());
                }
            }
        }
        // Functions made by macros: `name(args) follow/answer ...;` lines in the macro calls.
        for l in text.lines() {
            let t = l.trim();
            if (t.contains(") follow ") || t.contains(") answer ")) && !t.starts_with("//") {
                expected.push(t.split('(').next().unwrap().to_string());
            }
        }
    }
    // The shim's C entry points.
    let map = std::fs::read_to_string(krate.join("csrc/exports.map")).unwrap();
    let body = map
        .split("global:")
        .nth(1)
        .unwrap()
        .split('}')
        .next()
        .unwrap();
    expected.extend(
        body.split(';')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty()),
    );
    expected.retain(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
    expected.sort();
    expected.dedup();
    assert_eq!(
        exported, expected,
        "exports of libmoneta.so differ from the sources"
    );
}
