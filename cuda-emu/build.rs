//! Compiles tarfa's CUDA kernels as C++ for the CPU emulation (emu/emu.h): no multiply-add
//! contraction (-ffp-contract=off), so each operation rounds as the kernels say.
fn main() {
    println!("cargo:rerun-if-changed=emu/emu.h");
    println!("cargo:rerun-if-changed=emu/launch.cc");
    println!("cargo:rerun-if-changed=../runtime/src/cuda_kernels.cu");
    cc::Build::new()
        .cpp(true)
        .file("emu/launch.cc")
        .flag("-std=c++20")
        .flag("-ffp-contract=off")
        .flag("-fno-fast-math")
        .flag("-pthread")
        .warnings(false)
        .opt_level(1)
        .compile("tarfa_cuda_emu");
    println!("cargo:rustc-link-lib=stdc++");
}
