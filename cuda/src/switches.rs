//! The device's measuring switches, read from the environment when a [`crate::CudaDevice`] opens:
//! `TARFA_CUDA_TILE` (the tiled products' ring) and `TARFA_CUDA_PDL` (programmatic dependent
//! launch). Each changes geometry or scheduling, never an operation or its order, so never a bit.
//! Pure functions of the values, so that they are tested without a GPU.

use std::ffi::OsStr;

use crate::tile::TileGeometry;
use crate::CudaError;

/// The ring the tiled kernels are compiled for: `TARFA_CUDA_TILE` (`env`, `STAGES,STAGE_BYTES`)
/// if set and not blank, else [`TileGeometry::DEFAULT`]; within the device's `opt_in_max` bytes
/// of shared memory a block. A value the kernels or the device cannot take is
/// [`CudaError::BadTileGeometry`].
pub fn tile_wanted(env: Option<&OsStr>, opt_in_max: u32) -> Result<TileGeometry, CudaError> {
    let tile = match env.map(|v| v.to_str().ok_or(v)) {
        None => TileGeometry::DEFAULT,
        Some(Ok(v)) if v.trim().is_empty() => TileGeometry::DEFAULT,
        Some(Ok(v)) => TileGeometry::parse(v)?,
        Some(Err(v)) => {
            return Err(CudaError::BadTileGeometry {
                value: v.to_string_lossy().into_owned(),
                why: "it is not UTF-8".into(),
            })
        }
    };
    tile.within(opt_in_max)
}

/// Whether launches ask for programmatic dependent launch: the device has it (compute capability
/// 9.0 or later) and `TARFA_CUDA_PDL` (`env`) is not `0`.
pub fn pdl_wanted(cc_major: i32, env: Option<&str>) -> bool {
    cc_major >= 9 && env.map(str::trim) != Some("0")
}

#[cfg(test)]
mod tests {
    use super::{pdl_wanted, tile_wanted, CudaError, OsStr, TileGeometry};

    /// Programmatic dependent launch is asked for on sm_90 and later only, and `TARFA_CUDA_PDL=0`
    /// turns it off (any other value, or none, leaves it on).
    #[test]
    fn programmatic_launch_needs_hopper_and_yields_to_the_switch() {
        assert!(pdl_wanted(9, None));
        assert!(pdl_wanted(10, Some("1")));
        assert!(!pdl_wanted(9, Some("0")));
        assert!(!pdl_wanted(9, Some(" 0\n")));
        assert!(!pdl_wanted(8, None));
        assert!(!pdl_wanted(7, Some("1")));
    }

    /// `TARFA_CUDA_TILE` unset or blank is the default ring; set, it is parsed and checked against
    /// the kernels' rules and the device's opt-in shared memory, a refusal being
    /// `BadTileGeometry` (never a panic, never a silent default).
    #[test]
    fn the_ring_is_the_default_unless_tarfa_cuda_tile_names_one_the_device_takes() {
        let h200 = 232_448;
        let want = |v: Option<&str>, max| tile_wanted(v.map(OsStr::new), max);
        assert_eq!(want(None, h200).ok(), Some(TileGeometry::DEFAULT));
        assert_eq!(want(Some(" "), h200).ok(), Some(TileGeometry::DEFAULT));
        assert_eq!(want(Some("4,8192"), h200).ok(), Some(TileGeometry::DEFAULT));
        let g = want(Some("6,16384"), h200).expect("6,16384 on an H200");
        assert_eq!(
            (g.stages(), g.stage_bytes(), g.shared()),
            (6, 16384, 101_632)
        );
        for (v, max) in [
            ("6,16384", 48 * 1024),
            ("16,65536", h200),
            ("4,8191", h200),
            ("x", h200),
        ] {
            assert!(
                matches!(want(Some(v), max), Err(CudaError::BadTileGeometry { .. })),
                "{v} within {max}"
            );
        }
        #[cfg(unix)]
        {
            use std::os::unix::ffi::OsStrExt;
            let e = tile_wanted(Some(OsStr::from_bytes(b"6,\xff")), h200);
            assert!(matches!(e, Err(CudaError::BadTileGeometry { .. })), "{e:?}");
        }
    }
}
