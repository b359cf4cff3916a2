//! The kernels compiled at run time by NVRTC and loaded on a device.
//!
//! Why NVRTC and not PTX built with nvcc: the build machine and CI have no CUDA toolkit, and
//! NVRTC compiles the very source this crate embeds ([`crate::KERNELS_CU`], `kernels/` flattened
//! by the build script) with the options written here (`--fmad=false`: no multiply-add
//! contraction; every fused multiply-add in the source is an explicit `__fmaf_rn`), so what runs
//! is what is reviewed. The driver JIT-compiles the PTX for the device at load.

#![allow(unsafe_code)]

use std::sync::Arc;

use cudarc::nvrtc::CompileOptions;

use crate::error::drv;
use crate::tile::TileGeometry;
use crate::{CudaError, Gpu, KERNELS_CU};

/// The virtual architecture to compile for on a device of compute capability `major.minor`:
/// compute_90 from Hopper on, compute_80 from Ampere (both have the asynchronous copies the
/// tiled kernels use; PTX runs on later devices too), else NVRTC's default, where the kernels
/// copy synchronously instead. The arithmetic, hence every bit, is the same for each.
pub fn arch_for(major: i32, minor: i32) -> Option<&'static str> {
    match major * 10 + minor {
        90.. => Some("compute_90"),
        80.. => Some("compute_80"),
        _ => None,
    }
}

/// Compile [`KERNELS_CU`] with NVRTC (`--fmad=false`, no flush-to-zero, correctly rounded
/// division and square root) for `arch` (see [`arch_for`]; `None`: NVRTC's default), its tiled
/// products' ring `tile` (`-DTARFA_TILE_STAGES=…` and `-DTARFA_TILE_STAGE_BYTES=…`; the
/// default's PTX is the source's own). Needs only the NVRTC library, no GPU.
pub fn compile_kernels(
    arch: Option<&'static str>,
    tile: TileGeometry,
) -> Result<cudarc::nvrtc::Ptx, CudaError> {
    compile_with(arch, tile.defines().to_vec())
}

/// [`compile_kernels`], its ring given as NVRTC's `-D` options (none: the source's defaults).
fn compile_with(
    arch: Option<&'static str>,
    defines: Vec<String>,
) -> Result<cudarc::nvrtc::Ptx, CudaError> {
    // SAFETY: only tries to dlopen libnvrtc under its usual names.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(CudaError::Absent(
            "the NVRTC library (libnvrtc.so, part of the CUDA toolkit) was not found; add its directory to LD_LIBRARY_PATH".into(),
        ));
    }
    cudarc::nvrtc::compile_ptx_with_opts(
        KERNELS_CU,
        CompileOptions {
            fmad: Some(false),
            ftz: Some(false),
            prec_div: Some(true),
            prec_sqrt: Some(true),
            use_fast_math: Some(false),
            name: Some("tarfa_kernels.cu".into()),
            arch,
            options: defines,
            ..CompileOptions::default()
        },
    )
    .map_err(|e| CudaError::Usage(format!("NVRTC could not compile tarfa's kernels: {e}")))
}

/// [`compile_kernels`], loaded on `gpu`.
pub(crate) fn load_kernels(
    gpu: &Gpu,
    tile: TileGeometry,
) -> Result<Arc<cudarc::driver::CudaModule>, CudaError> {
    let cc = |a| gpu.context().attribute(a).map_err(drv("device attribute"));
    let major =
        cc(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor =
        cc(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let ptx = compile_kernels(arch_for(major, minor), tile)?;
    gpu.context().load_module(ptx).map_err(drv("module load"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Kernel;

    /// The PTX, or `None` (the test then passes, saying SKIPPED) where NVRTC is absent, unless
    /// `TARFA_REQUIRE_NVRTC` is set (CI), when that fails.
    fn compiled_or_skipped(r: Result<cudarc::nvrtc::Ptx, CudaError>) -> Option<cudarc::nvrtc::Ptx> {
        match r {
            Ok(p) => Some(p),
            Err(CudaError::Absent(why)) => {
                assert!(
                    std::env::var_os("TARFA_REQUIRE_NVRTC").is_none(),
                    "TARFA_REQUIRE_NVRTC is set but {why}"
                );
                eprintln!("SKIPPED: {why}");
                None
            }
            Err(e) => panic!("{e}"),
        }
    }

    /// The kernels compile under the options the decoder uses (no GPU needed, only NVRTC: CI
    /// installs PyPI's `nvidia-cuda-nvrtc` and sets `TARFA_REQUIRE_NVRTC=1`), and the PTX has
    /// every kernel the host code looks up, with no contracted multiply-add the source did not
    /// write (every `fma.rn` comes from an explicit `__fmaf_rn`).
    /// For a Hopper device the tiled kernels copy with cp.async; for NVRTC's default
    /// architecture (older devices) the same source copies synchronously and still compiles.
    #[test]
    fn hopper_gets_asynchronous_copies_and_older_devices_plain_ones() {
        assert_eq!(arch_for(9, 0), Some("compute_90"));
        assert_eq!(arch_for(10, 0), Some("compute_90"));
        assert_eq!(arch_for(8, 6), Some("compute_80"));
        assert_eq!(arch_for(7, 5), None);
        let (Some(hopper), Some(old)) = (
            compiled_or_skipped(compile_kernels(Some("compute_90"), TileGeometry::DEFAULT)),
            compiled_or_skipped(compile_kernels(None, TileGeometry::DEFAULT)),
        ) else {
            return;
        };
        let (hopper, old) = (hopper.to_src(), old.to_src());
        assert!(hopper.contains("cp.async.cg.shared.global"));
        assert!(hopper.contains(".target sm_90"));
        assert!(!old.contains("cp.async"));
        // Programmatic dependent launch: every engine kernel (`tarfa_e_*`) waits for the launch
        // before it and then releases the next one, on Hopper; older devices have neither.
        for k in crate::Kernel::ALL {
            let name = k.name();
            let at = hopper
                .find(&format!(".entry {name}("))
                .unwrap_or_else(|| panic!("{name}"));
            let body = hopper[at + 7..].split(".entry ").next().unwrap_or_default();
            assert!(body.contains("griddepcontrol.wait"), "{name} never waits");
            assert!(
                body.contains("griddepcontrol.launch_dependents"),
                "{name} never releases the next launch"
            );
        }
        assert!(!old.contains("griddepcontrol"));
    }

    /// The ring is chosen at run time (`TARFA_CUDA_TILE`) by `-D` options: at the default ring the
    /// tiled kernels' PTX is the source's own to the byte (compiled with no `-D`), other rings
    /// compile (among them the deepest and widest an H200 takes), and at every ring the tiled
    /// kernels use no static shared memory — all of theirs is the dynamic ring the host sizes —
    /// while the module's static shared memory (other kernels') stays the same. (Only the tiled
    /// kernels are compared: NVRTC 13.5 gives `tarfa_e_matvec` slightly different PTX from one
    /// compilation of the same source to the next, so the whole module's bytes vary.)
    #[test]
    fn a_ring_chosen_at_run_time_compiles_and_the_default_is_the_sources_own() {
        let arch = Some("compute_90");
        let Some(plain) = compiled_or_skipped(compile_with(arch, Vec::new())) else {
            return;
        };
        let plain = plain.to_src();
        let ptx = |stages, bytes| {
            let tile = TileGeometry::new(stages, bytes).expect("a ring the kernels take");
            compile_kernels(arch, tile)
                .unwrap_or_else(|e| panic!("{stages},{bytes}: {e}"))
                .to_src()
        };
        let tiled = [Kernel::TiledMatvec, Kernel::TiledGateUp, Kernel::TiledDown];
        let entry = |text: &str, k: Kernel| -> String {
            let at = text
                .find(&format!(".entry {}(", k.name()))
                .unwrap_or_else(|| panic!("no {}", k.name()));
            let body = text[at..].split(".visible .entry ").next();
            body.unwrap_or_default().to_string()
        };
        let default = ptx(4, 8192);
        for k in tiled {
            assert!(
                entry(&default, k) == entry(&plain, k),
                "{}: the default ring's PTX is not the source's own",
                k.name()
            );
        }
        // Module-scope `.shared` declarations that are not the dynamic (`.extern`) arrays.
        let statics = |text: &str| -> Vec<String> {
            let decl = text
                .lines()
                .map(str::trim)
                .filter(|l| l.starts_with(".shared "));
            decl.filter_map(|l| l.split_whitespace().last())
                .map(|n| n.split(['[', ';']).next().unwrap_or(n).to_string())
                .collect()
        };
        let base = statics(&plain);
        assert!(
            !base.is_empty(),
            "no static shared memory found: the scan is broken"
        );
        for (stages, bytes) in [(4, 8192), (2, 6144), (6, 16384), (8, 16384), (8, 26624)] {
            let text = ptx(stages, bytes);
            assert_eq!(statics(&text), base, "{stages},{bytes}");
            for k in tiled {
                let body = entry(&text, k);
                assert!(body.contains("cp.async.cg.shared.global"));
                for s in &base {
                    assert!(
                        !body.contains(s.as_str()),
                        "{stages},{bytes}: {} uses static shared {s}",
                        k.name()
                    );
                }
            }
        }
    }

    #[test]
    fn the_kernels_compile_with_nvrtc_and_every_looked_up_kernel_is_there() {
        let Some(ptx) =
            compiled_or_skipped(compile_kernels(Some("compute_90"), TileGeometry::DEFAULT))
        else {
            return;
        };
        let text = ptx.to_src();
        let hosts = [
            include_str!("offload.rs"),
            include_str!("device.rs"),
            include_str!("hal.rs"),
            include_str!("engine.rs"),
        ]
        .concat();
        let mut looked_up = 0;
        let names = hosts.split('"').filter(|w| {
            w.len() > 6
                && w.starts_with("tarfa_")
                && w.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        });
        for name in names {
            looked_up += 1;
            assert!(
                text.contains(&format!(".entry {name}(")),
                "the PTX lacks kernel {name}"
            );
        }
        assert!(
            looked_up >= 13,
            "{looked_up} kernel names found in the host code"
        );
        // --fmad=false: a mul followed by an add stays two instructions; the fused ones are
        // exactly the source's __fmaf_rn calls (fma.rn.f32), never mad/fma from contraction.
        assert!(
            !text.contains("mad.f32") && !text.contains("mad.rn.f32"),
            "contracted mad in PTX"
        );
    }
}
