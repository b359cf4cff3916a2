//! Compiles tarfa's CUDA kernels as C++ for the CPU emulation (emu/emu.h): no multiply-add
//! contraction (-ffp-contract=off), so each operation rounds as the kernels say. The tiled
//! kernels are compiled at the default ring (emu/launch.cc) and again at each ring of [`RINGS`]
//! (emu/tile.cc, once per ring), so that the tests hold every ring to the same bits.

use std::path::PathBuf;

/// Rings of the tiled kernels (stages, weight bytes a stage) compiled besides the default
/// (4, 8192): the shallowest and narrowest the host takes, an odd one whose stages are not a
/// power of two of columns wide, and one above the 48 KiB a block takes without opting in.
const RINGS: [(u32, u32); 3] = [(2, 6144), (3, 10240), (6, 16384)];

fn emu() -> cc::Build {
    let mut b = cc::Build::new();
    b.cpp(true)
        .flag("-std=c++20")
        .flag("-ffp-contract=off")
        .flag("-fno-fast-math")
        .flag("-pthread")
        .warnings(false)
        .opt_level(1);
    b
}

fn main() {
    println!("cargo:rerun-if-changed=emu/emu.h");
    println!("cargo:rerun-if-changed=emu/launch.cc");
    println!("cargo:rerun-if-changed=emu/tile.cc");
    println!("cargo:rerun-if-changed=emu/tiled.h");
    // Every kernel file (emu/launch.cc and emu/tile.cc include ../cuda/kernels/tarfa.cu).
    let mut cu = String::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir("../cuda/kernels")
        .expect("list the kernels")
        .map(|e| e.expect("a kernel file").path())
        .collect();
    files.sort();
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
        cu.push_str(&std::fs::read_to_string(f).expect("read a kernel file"));
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let rings: Vec<(u32, u32)> = [(4, 8192)].into_iter().chain(RINGS).collect();
    // Every ring compiled in, for launch.cc's dispatch (tiles.h) and the crate (TARFA_EMU_TILES).
    let x: Vec<String> = rings.iter().map(|(s, b)| format!("X({s}, {b})")).collect();
    let tiles = format!(
        "// Written by build.rs: every ring the tiled kernels are compiled for.\n\
         #define TARFA_EMU_TILES(X) {}\n",
        x.join(" ")
    );
    std::fs::write(out.join("tiles.h"), tiles).expect("write tiles.h");
    let list: Vec<String> = rings.iter().map(|(s, b)| format!("{s},{b}")).collect();
    println!("cargo:rustc-env=TARFA_EMU_TILES={}", list.join(";"));

    emu()
        .include(&out)
        .file("emu/launch.cc")
        .compile("tarfa_cuda_emu");
    // Each further copy of the kernels gets its own names (its entry points' are tiled.h's).
    let kernels: Vec<&str> = cu
        .split("extern \"C\" __global__ void ")
        .skip(1)
        // A launch bound (`__launch_bounds__(N) name(`) stands before the name.
        .map(|rest| match rest.strip_prefix("__launch_bounds__(") {
            Some(r) => r.split_once(')').map_or(r, |(_, name)| name).trim_start(),
            None => rest,
        })
        .filter_map(|rest| rest.split('(').next())
        .collect();
    for (stages, bytes) in RINGS {
        let mut b = emu();
        b.file("emu/tile.cc")
            .out_dir(out.join(format!("tile_{stages}_{bytes}")))
            .define("TARFA_TILE_STAGES", stages.to_string().as_str())
            .define("TARFA_TILE_STAGE_BYTES", bytes.to_string().as_str());
        for k in &kernels {
            b.define(k, format!("{k}_{stages}_{bytes}").as_str());
        }
        b.compile(&format!("tarfa_cuda_emu_tile_{stages}_{bytes}"));
    }
    println!("cargo:rustc-link-lib=stdc++");
}
