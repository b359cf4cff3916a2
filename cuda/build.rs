//! Flattens the kernels (`kernels/tarfa.cu`, the one translation unit, and the files it
//! `#include`s) into one source for NVRTC, which is given no headers: `$OUT_DIR/tarfa_kernels.cu`,
//! each file's text in include order after a `#line 1 "kernels/NAME"`, so that NVRTC's messages
//! name the file and line. The CPU emulation (cuda-emu) includes `kernels/tarfa.cu` itself.

use std::path::{Path, PathBuf};

fn flatten(dir: &Path, name: &str, out: &mut String, depth: usize) {
    assert!(depth < 8, "kernels/{name}: includes nested too deep");
    let path = dir.join(name);
    println!("cargo:rerun-if-changed={}", path.display());
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    out.push_str(&format!("#line 1 \"kernels/{name}\"\n"));
    for (i, line) in text.lines().enumerate() {
        let inc = line
            .strip_prefix("#include \"")
            .and_then(|rest| rest.strip_suffix('"'));
        match inc {
            Some(file) => {
                flatten(dir, file, out, depth + 1);
                out.push_str(&format!("#line {} \"kernels/{name}\"\n", i + 2));
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
}

fn main() {
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"))
        .join("kernels");
    let mut src = String::new();
    flatten(&dir, "tarfa.cu", &mut src, 0);
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(out.join("tarfa_kernels.cu"), src).expect("write tarfa_kernels.cu");
}
